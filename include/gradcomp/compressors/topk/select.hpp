// Deterministic top-k selection, the one primitive TopK and TopK-Chunked
// share: the `count` largest of n 32-bit keys, ties going to the lower index,
// reported in index order. The result is a pure function of the keys, the
// same on host and device, whatever the thread count.
//
// Host: MSD radix select (two histogram rounds of 16 bits find the threshold
// key; one pass counts per thread, one emits), OpenMP-parallel, O(n).
// CUDA (select.cuh): a stable radix sort of (key, index) pairs with CUB,
// then the selected indices sorted back into index order.
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::detail {

/// Histogram bins of one radix round.
inline constexpr std::size_t select_bins = 1u << 16;

/// Threads the host selection can use, fixed when its workspace is sized.
inline int select_threads() {
#if GRADCOMP_HAS_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/// The selection's scratch, carved from a compressor's workspace.
template <class Memory>
struct select_workspace {
  span<std::uint32_t, Memory> histograms;  // host: one histogram per thread
  span<std::uint64_t, Memory> keys;        // device: (key, index) pairs, then sorted
  span<std::uint64_t, Memory> sorted;
  span<std::uint32_t, Memory> indices;  // device: selected indices, then sorted
  span<std::uint32_t, Memory> sorted_indices;
  span<std::byte, Memory> temp;  // device: CUB's temporary storage
};

template <class Tag, class Dependent = void>
struct device_select {
  static_assert(always_false<Tag, Dependent>,
                "gradcomp's CUDA selection is compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};
struct device_select_tag;

/// Takes the selection's workspace for n keys and `count` selected.
template <class Memory>
select_workspace<Memory> carve_select(workspace_carver<Memory>& w, std::size_t n, std::size_t count) {
  if constexpr (std::is_same_v<Memory, host_memory>) {
    return {
        w.template take<std::uint32_t>(select_bins * static_cast<std::size_t>(select_threads())), {}, {}, {}, {}, {}};
  } else {
    select_workspace<Memory> s;
    s.keys = w.template take<std::uint64_t>(n);
    s.sorted = w.template take<std::uint64_t>(n);
    s.indices = w.template take<std::uint32_t>(count);
    s.sorted_indices = w.template take<std::uint32_t>(count);
    s.temp = w.template take<std::byte>(device_select<device_select_tag, Memory>::temp_bytes(n, count));
    return s;
  }
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

/// Calls emit(i, r) for the `count` largest keys key(i), i in [0, n), ties
/// to the lower index, r = 0, 1, ... in index order. Host version.
template <class Key, class Emit>
void select_largest(host_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                    select_workspace<host_memory> const& ws) {
  if (count == 0) return;
  if (count >= n) {
    parallel_for(space, n, [&](std::size_t i) { emit(i, i); });
    return;
  }
  int const threads =
      std::max(1, std::min<int>(space.threads_for(n), static_cast<int>(ws.histograms.size() / select_bins)));
  // Find the count-th largest key digit by digit: 16-bit digits for large n,
  // 8-bit ones for small n, where zeroing and scanning 2^16 bins would cost
  // more than the extra rounds.
  int const bits = n >= (std::size_t{1} << 20) ? 16 : 8;
  std::size_t need = count;
  std::uint32_t threshold = 0;
  for (int shift = 32 - bits; shift >= 0; shift -= bits)
    threshold = (threshold << bits) | radix_round(n, key, ws.histograms.data(), threads, shift, bits, threshold, need);
  // threshold is now the count-th largest key; `need` keys equal to it are taken

  // Per thread: how many keys above the threshold, how many equal to it.
  std::uint32_t* counts = ws.histograms.data();  // reused: 2 per thread
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
/// The same on the CUDA space (select.cuh).
template <class Key, class Emit>
void select_largest(cuda_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                    select_workspace<device_memory> const& ws) {
  device_select<device_select_tag, Key>::run(space, n, count, key, emit, ws);
}
#endif

}  // namespace gradcomp::detail
