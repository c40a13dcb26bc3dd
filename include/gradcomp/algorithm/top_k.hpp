// top_k: the `count` largest of n 32-bit keys, ties to the lower index,
// reported in index order. The result is a pure function of the keys: the
// same on host and device, whatever the thread count, so ranks holding the
// same keys select the same elements.
//
//   top_k(space, n, count, key, emit, scratch)
//
// calls emit(i, r) for each selected i, r = 0, 1, ... in increasing i.
//
// Host: MSD radix select (rounds of 16-bit digits for large n, 8-bit for
// small) finds the threshold key; one pass counts per thread what is above
// and equal to it, one emits. CUDA (top_k.cuh): three histogram rounds
// (11, 11, 10 bits) find the threshold on the device, then an index-ordered
// compaction (per-tile counts, a scan, an emit pass); nothing is sorted and
// the host never looks at a count.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/workspace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

/// Host histogram bins of one radix round for n keys.
inline std::size_t host_select_bins(std::size_t n) { return n >= (std::size_t{1} << 20) ? 1u << 16 : 1u << 8; }

/// The device selection's pieces of scratch.
template <class Memory>
struct device_select_scratch {
  span<std::uint32_t, Memory> histogram;     // 2048 bins
  span<std::uint64_t, Memory> state;         // threshold prefix, keys still needed
  span<std::uint64_t, Memory> tile_counts;   // per tile of 4096 keys: above << 32 | equal
  span<std::uint64_t, Memory> tile_offsets;  // their exclusive scan
};
inline constexpr std::size_t select_tile = 4096;

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

// One histogram round over the keys whose bits above `shift + bits` equal
// `prefix`: finds the bin of the digit at `shift` that holds the need-th
// largest key, and leaves in `need` how many keys of that bin are needed.
template <class Key>
std::uint32_t radix_round(std::size_t n, Key const& key, std::uint32_t* histograms, int threads, int shift, int bits,
                          std::uint32_t prefix, std::size_t& need) {
  std::size_t const bins = std::size_t{1} << bits;
  std::fill(histograms, histograms + bins * threads, 0u);
  GRADCOMP_OMP(parallel num_threads(threads)) {
#if GRADCOMP_HAS_OPENMP
    std::uint32_t* mine = histograms + bins * static_cast<std::size_t>(omp_get_thread_num());
#else
    std::uint32_t* mine = histograms;
#endif
    GRADCOMP_OMP(for schedule(static))
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t const k = key(i);
      if ((k >> (shift + bits)) == prefix) ++mine[(k >> shift) & (bins - 1)];
    }
  }
  // Walk the bins from the top until `need` keys are covered.
  std::size_t above = 0;
  for (std::size_t bin = bins; bin-- > 0;) {
    std::size_t in_bin = 0;
    for (int t = 0; t < threads; ++t) in_bin += histograms[bins * t + bin];
    if (above + in_bin >= need) {
      need -= above;
      return static_cast<std::uint32_t>(bin);
    }
    above += in_bin;
  }
  return 0;  // unreachable: need <= n
}

template <class Tag, class... T>
struct cuda_top_k {
  static_assert(always_false<Tag, T...>,
                "gradcomp's CUDA top_k is compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};

}  // namespace detail

/// Bytes of scratch top_k needs for n keys in memory of kind Memory.
template <class Memory>
std::size_t top_k_scratch_bytes(std::size_t n) {
  workspace_carver<Memory> measure;
  if constexpr (std::is_same_v<Memory, host_memory>)
    measure.template take<std::uint32_t>(
        detail::checked_mul(detail::host_select_bins(n), static_cast<std::size_t>(host_thread_capacity()), "top_k"));
  else
    detail::carve_device_select(measure, n);
  return measure.bytes();
}

/// Calls emit(i, r) for the `count` largest keys key(i), i in [0, n), ties
/// to the lower index, r = 0, 1, ... in index order (see the top of this
/// header). Host version.
template <class Key, class Emit>
void top_k(host_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
           span<std::byte, host_memory> scratch) {
  if (count == 0 || n == 0) return;
  if (count >= n) {
    parallel_for(space, n, [&](std::size_t i) { emit(i, i); });
    return;
  }
  std::size_t const bins = detail::host_select_bins(n);
  auto* histograms = reinterpret_cast<std::uint32_t*>(scratch.data());
  int const capacity = static_cast<int>(scratch.size() / (bins * sizeof(std::uint32_t)));
  int const threads = std::max(1, std::min(space.threads_for(n), capacity));
  // Find the count-th largest key digit by digit: 16-bit digits for large n,
  // 8-bit ones for small n, where zeroing and scanning 2^16 bins would cost
  // more than the extra rounds.
  int const bits = bins == (1u << 16) ? 16 : 8;
  std::size_t need = count;
  std::uint32_t threshold = 0;
  for (int shift = 32 - bits; shift >= 0; shift -= bits)
    threshold = (threshold << bits) | detail::radix_round(n, key, histograms, threads, shift, bits, threshold, need);
  // threshold is now the count-th largest key; `need` keys equal to it are taken

  // Per thread: how many keys above the threshold, how many equal to it.
  std::uint32_t* counts = histograms;  // reused: 2 per thread
  GRADCOMP_OMP(parallel num_threads(threads)) {
#if GRADCOMP_HAS_OPENMP
    int const t = omp_get_thread_num(), team = omp_get_num_threads();
#else
    int const t = 0, team = 1;
#endif
    std::size_t const lo = n * t / team, hi = n * (t + 1) / team;
    std::uint32_t above = 0, equal = 0;
    for (std::size_t i = lo; i < hi; ++i) {
      std::uint32_t const k = key(i);
      above += k > threshold;
      equal += k == threshold;
    }
    counts[2 * t] = above;
    counts[2 * t + 1] = equal;
    GRADCOMP_OMP(barrier)
    // Where this thread's selections start, and how many ties it may take
    // (ties go to the lowest indices, i.e. the earliest threads).
    std::size_t rank = 0, ties_before = 0;
    for (int u = 0; u < t; ++u) {
      std::size_t const take = std::min<std::size_t>(counts[2 * u + 1], need - std::min(need, ties_before));
      rank += counts[2 * u] + take;
      ties_before += counts[2 * u + 1];
    }
    std::size_t ties_left = need - std::min(need, ties_before);
    for (std::size_t i = lo; i < hi; ++i) {
      std::uint32_t const k = key(i);
      if (k > threshold || (k == threshold && ties_left > 0)) {
        if (k == threshold) --ties_left;
        emit(i, rank++);
      }
    }
  }
}

#if GRADCOMP_HAS_CUDA
/// The same on the CUDA space, asynchronously on its stream (top_k.cuh;
/// scratch is device memory, key and emit run in kernels).
template <class Key, class Emit>
void top_k(cuda_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
           span<std::byte, device_memory> scratch) {
  detail::cuda_top_k<detail::cuda_kernels_tag, Key, Emit>::run(space, n, count, key, emit, scratch);
}
#endif

}  // namespace gradcomp
