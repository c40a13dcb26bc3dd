// top_k's host selection of last resort: an MSD radix select over all the
// keys, which always applies (see algorithm/top_k.hpp).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution/tuning.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Host histogram bins of one radix round for n keys.
inline std::size_t host_select_bins(std::size_t n) {
  return n >= tuning::top_k_policy::radix_wide_from ? 1u << 16 : 1u << 8;
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

/// The MSD radix selection: finds the count-th largest key digit by digit
/// (16-bit digits for large n, 8-bit ones for small n, where zeroing and
/// scanning 2^16 bins would cost more than the extra rounds), then one pass
/// counts and one emits, over `threads` threads with histograms of
/// host_select_bins(n) bins each. Always applies.
template <class Key, class Emit>
void radix_select(int threads, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                  std::uint32_t* histograms) {
  std::size_t const bins = host_select_bins(n);
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
    std::size_t const mine = 2 * static_cast<std::size_t>(t);
    counts[mine] = above;
    counts[mine + 1] = equal;
    GRADCOMP_OMP(barrier)
    // Where this thread's selections start, and how many ties it may take
    // (ties go to the lowest indices, i.e. the earliest threads).
    std::size_t rank = 0, ties_before = 0;
    for (std::size_t u = 0; u < static_cast<std::size_t>(t); ++u) {
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

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
