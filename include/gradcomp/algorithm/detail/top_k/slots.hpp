// What top_k's two one-pass-and-a-bit host selections (two_pass_select.hpp,
// sampled_select.hpp) share: a slot of scratch per range of keys (its
// histograms and its words), the OpenMP team's places, and the choice of
// the threshold among the copied candidates.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution/tuning.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The two-pass host selection: its histograms (of the top 11 bits, in
/// four interleaved copies so that equal neighbours do not wait on one
/// counter) and the room for its lists, in entries.
inline constexpr int pass_select_shift = tuning::top_k_policy::pass_shift,
                     pass_select_copies = tuning::top_k_policy::pass_copies;
inline constexpr std::size_t pass_select_bins = std::size_t{1} << (32 - pass_select_shift);
inline std::size_t pass_select_room(std::size_t n) { return n / 16 + 1024; }

/// The words after each slot's histograms: in the two-pass selection, its
/// keys above the bin, in the bin, chosen from the bin, ties taken; in the
/// sampled one, its copies, whether they overflowed its share, chosen, ties
/// taken. Slot s of `slots` holds keys [n s / slots, n (s + 1) / slots).
inline constexpr std::size_t pass_select_words = 4,
                             pass_select_stride = pass_select_bins * pass_select_copies + pass_select_words;

/// Slot s's words (see pass_select_words).
inline std::uint32_t* slot_words(std::uint32_t* scratch, std::size_t s) {
  return scratch + pass_select_stride * s + pass_select_bins * pass_select_copies;
}

/// This thread's place in its OpenMP team: its number, and the team's size.
inline std::pair<std::size_t, std::size_t> team_place() {
#if GRADCOMP_HAS_OPENMP
  return {static_cast<std::size_t>(omp_get_thread_num()), static_cast<std::size_t>(omp_get_num_threads())};
#else
  return {0, 1};
#endif
}

/// The need-th largest of the candidate keys copied into `sorted` (m of
/// them, reordered here), and each slot's share of the chosen in its words
/// 2 and 3: its candidates above that key, and the ties it takes (ties go to
/// the lowest indices, so to the earliest slots). Slot u's candidates are
/// keys[first(u)], ... in index order, `size_word` of its words counting them.
template <class First>
std::uint32_t choose_among(std::uint32_t* sorted, std::size_t m, std::size_t need, std::uint32_t const* keys,
                           std::uint32_t* scratch, std::size_t slots, int size_word, First const& first) {
  std::nth_element(sorted, sorted + (need - 1), sorted + m, [](std::uint32_t a, std::uint32_t b) { return a > b; });
  std::uint32_t const least = sorted[need - 1];
  std::size_t ties = need;  // keys above `least` first
  for (std::size_t k = 0; k < m; ++k) ties -= sorted[k] > least;
  for (std::size_t u = 0; u < slots; ++u) {
    std::uint32_t* const w = slot_words(scratch, u);
    std::size_t chosen = 0, taken = 0;
    for (std::size_t c = first(u), end = c + w[size_word]; c < end; ++c) {
      bool const tie = keys[c] == least && taken < ties;
      taken += tie;
      chosen += keys[c] > least || tie;
    }
    ties -= taken;
    w[2] = static_cast<std::uint32_t>(chosen);
    w[3] = static_cast<std::uint32_t>(taken);
  }
  return least;
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
