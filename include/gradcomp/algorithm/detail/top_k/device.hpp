// What the host side knows of top_k's device selection (top_k.cuh): its
// pieces of scratch, carved as the kernels use them, and the entry nvcc's
// translation units define.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/tuning.hpp>
#include <gradcomp/execution/workspace.hpp>

#include <cstddef>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The device selection's pieces of scratch.
template <class Memory>
struct device_select_scratch {
  span<std::uint32_t, Memory> histogram;     // 2048 bins
  span<std::uint64_t, Memory> state;         // threshold prefix, keys still needed
  span<std::uint64_t, Memory> tile_counts;   // per tile of 4096 keys: above << 32 | equal
  span<std::uint64_t, Memory> tile_offsets;  // their exclusive scan
};
inline constexpr std::size_t select_tile = tuning::top_k_policy::tile;

template <class Memory>
device_select_scratch<Memory> carve_device_select(workspace_carver<Memory>& w, std::size_t n) {
  std::size_t const tiles = (n + select_tile - 1) / select_tile;
  device_select_scratch<Memory> s;
  s.histogram = w.template take<std::uint32_t>(2048);
  s.state = w.template take<std::uint64_t>(2);
  s.tile_counts = w.template take<std::uint64_t>(tiles);
  s.tile_offsets = w.template take<std::uint64_t>(tiles);
  return s;
}

template <class Tag, class... T>
struct cuda_top_k {
  static_assert(always_false<Tag, T...>,
                "gradcomp's CUDA top_k is compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
