// The CUDA side of select.hpp: keys become (key << 32 | ~index) so that one
// descending radix sort (CUB, stable) orders them by key and, among equal
// keys, by lower index; the first `count` indices are then sorted back into
// index order so emit sees them exactly as the host reports them.
#pragma once

#include <gradcomp/compressors/topk/select.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

#include <cub/device/device_radix_sort.cuh>

namespace gradcomp::detail {

template <class Key>
struct make_pair_keys {
  Key key;
  std::uint64_t* keys;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    keys[i] = (static_cast<std::uint64_t>(key(i)) << 32) | (0xffffffffu - static_cast<std::uint32_t>(i));
  }
};

struct index_of_key {
  std::uint64_t const* sorted;
  std::uint32_t* indices;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t r) const {
    indices[r] = 0xffffffffu - static_cast<std::uint32_t>(sorted[r]);
  }
};

template <class Emit>
struct emit_sorted {
  std::uint32_t const* indices;
  Emit emit;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t r) const { emit(indices[r], r); }
};

template <class Dependent>
struct device_select<device_select_tag, Dependent> {
  static std::size_t temp_bytes(std::size_t n, std::size_t count) {
    std::size_t by_key = 0, by_index = 0;
    GRADCOMP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(nullptr, by_key, static_cast<std::uint64_t*>(nullptr),
                                                               static_cast<std::uint64_t*>(nullptr), n));
    GRADCOMP_CUDA_TRY(cub::DeviceRadixSort::SortKeys(nullptr, by_index, static_cast<std::uint32_t*>(nullptr),
                                                     static_cast<std::uint32_t*>(nullptr), count));
    return std::max(by_key, by_index);
  }

  template <class Key, class Emit>
  static void run(cuda_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                  select_workspace<device_memory> const& ws) {
    if (count == 0) return;
    count = std::min(count, n);
    std::size_t temp = ws.temp.size();
    parallel_for(space, n, make_pair_keys<Key>{key, ws.keys.data()});
    GRADCOMP_CUDA_TRY(cub::DeviceRadixSort::SortKeysDescending(ws.temp.data(), temp, ws.keys.data(), ws.sorted.data(),
                                                               n, 0, 64, space.stream));
    parallel_for(space, count, index_of_key{ws.sorted.data(), ws.indices.data()});
    temp = ws.temp.size();
    GRADCOMP_CUDA_TRY(cub::DeviceRadixSort::SortKeys(ws.temp.data(), temp, ws.indices.data(), ws.sorted_indices.data(),
                                                     count, 0, 32, space.stream));
    parallel_for(space, count, emit_sorted<Emit>{ws.sorted_indices.data(), emit});
  }
};

}  // namespace gradcomp::detail
