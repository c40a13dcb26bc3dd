// top_k's sampled host selection, the one tried first: a threshold guessed
// from a sample, the keys at or above it copied out, the count-th largest
// found among those copies alone (see algorithm/top_k.hpp).
#pragma once

#include <gradcomp/algorithm/detail/top_k/slots.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The sampled selection's sample: runs of consecutive keys spread evenly
/// over all of them (a run is a few cache lines).
inline constexpr std::size_t sample_runs = tuning::top_k_policy::sample_runs,
                             sample_run = tuning::top_k_policy::sample_run, sample_keys = sample_runs * sample_run;

/// The sampled host selection (see the top of this header) over `slots`
/// ranges of keys, with scratch of top_k_scratch_bytes: false, having
/// emitted nothing, where it does not apply (n small, count a large part of
/// it) or the sample misled it (fewer than count keys at or above its
/// guess, or more than a slot's share of the room).
template <class Key, class Emit>
bool sampled_select(int slots, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                    std::uint32_t* scratch) {
  constexpr std::size_t stride = pass_select_stride, sampled = sample_keys;
  std::size_t const slot_count = static_cast<std::size_t>(slots);
  std::size_t const room = pass_select_room(n), list = room + slot_count, share = list / slot_count;
  if (n < 16 * sampled) return false;
  // The guess: the sampled key of rank c + 4 sqrt(c) + 8, c the count the
  // sample expects above the count-th largest key, so that the guess is
  // below that key unless the sample is four deviations off.
  double const expected = static_cast<double>(count) / static_cast<double>(n) * static_cast<double>(sampled);
  std::size_t const rank = static_cast<std::size_t>(expected + 4.0 * std::sqrt(expected) + 8.0);
  // (Where the keys copied out would come near the room, two passes.)
  if (static_cast<double>(rank) / static_cast<double>(sampled) * static_cast<double>(n) > static_cast<double>(room) / 2)
    return false;
  // Each slot's keys at or above the guess, in its share of the lists; then
  // the copies' keys sorted (first the sample).
  std::uint32_t* const cand_index = scratch + stride * slot_count;
  std::uint32_t* const cand_key = cand_index + list;
  std::uint32_t* const sorted = cand_key + list;
  auto const words = [scratch](std::size_t s) { return slot_words(scratch, s); };
  for (std::size_t r = 0; r < sample_runs; ++r) {
    std::size_t const start = (n - sample_run) * r / (sample_runs - 1);
    for (std::size_t j = 0; j < sample_run; ++j) sorted[r * sample_run + j] = key(start + j);
  }
  std::nth_element(sorted, sorted + (rank - 1), sorted + sampled,
                   [](std::uint32_t a, std::uint32_t b) { return a > b; });
  std::uint32_t const guess = sorted[rank - 1];
  if (guess == 0) return false;  // (every key would be copied out)
  bool found = true;
  std::uint32_t least = 0;  // the count-th largest key
  GRADCOMP_OMP(parallel num_threads(slots)) {
    auto const [t, team] = team_place();
    for (std::size_t s = t; s < slot_count; s += team) {
      std::size_t const lo = n * s / slot_count, hi = n * (s + 1) / slot_count, first = share * s;
      std::size_t next = first;
      bool overflow = false;
      // Branch-free: every key of a run is written, and the list's end moves
      // past it only where it is at or above the guess.
      auto const copy_out = [&](std::size_t from, std::size_t to) {
        if (next + (to - from) >= first + share) return overflow = true;
        for (std::size_t j = from; j < to; ++j) {
          std::uint32_t const k = key(j);
          cand_index[next] = static_cast<std::uint32_t>(j);
          cand_key[next] = k;
          next += k >= guess;
        }
        return false;
      };
      constexpr std::size_t run =
          tuning::top_k_policy::skip_run;  // (a test that vectorizes passes over runs with none)
      std::size_t i = lo;
      for (; i + run <= hi && !overflow; i += run) {
        bool any = false;
        for (std::size_t j = 0; j < run; ++j) any |= key(i + j) >= guess;
        if (any) copy_out(i, i + run);
      }
      if (!overflow) copy_out(i, hi);
      words(s)[0] = static_cast<std::uint32_t>(next - first);
      words(s)[1] = overflow;
    }
    GRADCOMP_OMP(barrier)
    GRADCOMP_OMP(single) {  // the count-th largest among the copies, and each slot's share of the chosen
      std::size_t copies = 0;
      for (std::size_t u = 0; u < slot_count; ++u) {
        found = found && words(u)[1] == 0;
        copies += words(u)[0];
      }
      found = found && copies >= count;
      if (found) {
        for (std::size_t u = 0, c = 0; u < slot_count; c += words(u++)[0])
          std::copy(cand_key + share * u, cand_key + share * u + words(u)[0], sorted + c);
        least = choose_among(sorted, copies, count, cand_key, scratch, slot_count, 0,
                             [share](std::size_t u) { return share * u; });
      }
    }
    if (found)
      for (std::size_t s = t; s < slot_count; s += team) {
        std::size_t rank_at = 0;
        for (std::size_t u = 0; u < s; ++u) rank_at += words(u)[2];
        std::size_t ties_left = words(s)[3];
        for (std::size_t c = share * s, end = c + words(s)[0]; c < end; ++c) {
          std::uint32_t const k = cand_key[c];
          if (k > least || (k == least && ties_left > 0)) {
            ties_left -= k == least;
            emit(cand_index[c], rank_at++);
          }
        }
      }
  }
  return found;
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
