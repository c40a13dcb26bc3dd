// top_k's two-pass host selection: per-slot histograms of the top 11 bits
// name the bin of the count-th largest key; the keys above it and the bin's
// own are copied out in index order and the threshold is found among those
// (see algorithm/top_k.hpp).
#pragma once

#include <gradcomp/algorithm/detail/top_k/radix_select.hpp>
#include <gradcomp/algorithm/detail/top_k/slots.hpp>
#include <gradcomp/execution.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

// Counts keys [lo, hi) into a slot's four histogram copies.
template <class Key>
void count_keys(Key const& key, std::uint32_t* h, std::size_t lo, std::size_t hi) {
  constexpr std::size_t bins = pass_select_bins;
  constexpr int shift = pass_select_shift;
  std::size_t i = lo;
  for (; i + 4 <= hi; i += 4) {
    ++h[key(i) >> shift];
    ++h[bins + (key(i + 1) >> shift)];
    ++h[2 * bins + (key(i + 2) >> shift)];
    ++h[3 * bins + (key(i + 3) >> shift)];
  }
  for (; i < hi; ++i) ++h[key(i) >> shift];
}

/// The two-pass host selection (see the top of this header) over `slots`
/// ranges of keys (a thread's share each), with scratch of
/// top_k_scratch_bytes; false, having emitted nothing, where its lists would
/// not fit.
template <class Key, class Emit>
bool two_pass_select(int slots, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                     std::uint32_t* scratch) {
  constexpr std::size_t bins = pass_select_bins, stride = pass_select_stride;
  constexpr int shift = pass_select_shift;
  std::size_t const slot_count = static_cast<std::size_t>(slots);
  std::size_t const room = pass_select_room(n), list = room + slot_count;  // (a slot of slack per slot)
  std::uint32_t* const above = scratch + stride * slot_count;              // indices above the bin
  std::uint32_t* const cand_index = above + list;                          // the bin's keys: where, and what
  std::uint32_t* const cand_key = cand_index + list;
  auto const words = [scratch](std::size_t s) { return slot_words(scratch, s); };
  bool fits = true;
  std::uint32_t bin = 0;    // the bin holding the count-th largest key
  std::uint32_t least = 0;  // the count-th largest key
  GRADCOMP_OMP(parallel num_threads(slots)) {
    auto const [t, team] = team_place();
    for (std::size_t s = t; s < slot_count; s += team) {  // the first pass, then each slot's copies summed
      std::uint32_t* const h = scratch + stride * s;
      std::fill(h, h + bins * pass_select_copies, 0u);
      count_keys(key, h, n * s / slot_count, n * (s + 1) / slot_count);
      for (std::size_t b = 0; b < bins; ++b) h[b] += h[bins + b] + h[2 * bins + b] + h[3 * bins + b];
    }
    GRADCOMP_OMP(barrier)
    GRADCOMP_OMP(single) {  // the bin, and whether the lists fit
      std::size_t covered = 0, in_bin = 0;
      for (std::size_t b = bins; b-- > 0;) {
        in_bin = 0;
        for (std::size_t u = 0; u < slot_count; ++u) in_bin += scratch[stride * u + b];
        if (covered + in_bin >= count) {
          bin = static_cast<std::uint32_t>(b);
          break;
        }
        covered += in_bin;
      }
      fits = covered <= room && in_bin <= room;
    }
    if (fits) {
      for (std::size_t s = t; s < slot_count; s += team) {
        std::uint32_t const* const h = scratch + stride * s;
        std::size_t mine = 0;
        for (std::size_t b = bin + 1; b < bins; ++b) mine += h[b];
        words(s)[0] = static_cast<std::uint32_t>(mine);
        words(s)[1] = h[bin];
      }
      GRADCOMP_OMP(barrier)
      // Each slot's lists start after the earlier slots' (and a slot of
      // slack each), so both lists are in index order.
      auto const first = [&](std::size_t s, int which) {
        std::size_t at = s;
        for (std::size_t u = 0; u < s; ++u) at += words(u)[which];
        return at;
      };
      for (std::size_t s = t; s < slot_count; s += team) {
        std::size_t next_above = first(s, 0), next_cand = first(s, 1);
        // Branch-free: every key is written to both lists, and a list's end
        // moves past it only where it belongs (a key's bin is data, which a
        // branch would mispredict); the last write lands in the slack slot.
        auto const copy_out = [&](std::size_t from, std::size_t to) {
          for (std::size_t j = from; j < to; ++j) {
            std::uint32_t const k = key(j), b = k >> shift;
            above[next_above] = static_cast<std::uint32_t>(j);
            next_above += b > bin;
            cand_index[next_cand] = static_cast<std::uint32_t>(j);
            cand_key[next_cand] = k;
            next_cand += b == bin;
          }
        };
        // Most runs of keys hold none at or above the bin: a test that
        // vectorizes passes over them, and only the others go key by key.
        constexpr std::size_t run = tuning::top_k_policy::skip_run;
        std::uint32_t const lowest = bin << shift;
        std::size_t const lo = n * s / slot_count, hi = n * (s + 1) / slot_count;
        std::size_t i = lo;
        for (; i + run <= hi; i += run) {
          bool any = false;
          for (std::size_t j = 0; j < run; ++j) any |= key(i + j) >= lowest;
          if (any) copy_out(i, i + run);
        }
        copy_out(i, hi);
      }
      GRADCOMP_OMP(barrier)
      GRADCOMP_OMP(single) {  // the threshold among the candidates, and each slot's share of them
        std::size_t above_all = 0, cands = 0;
        std::uint32_t* const sorted = cand_key + list;
        for (std::size_t u = 0; u < slot_count; ++u) {  // every slot's candidates, without the slack
          std::copy(cand_key + cands + u, cand_key + cands + u + words(u)[1], sorted + cands);
          above_all += words(u)[0];
          cands += words(u)[1];
        }
        least = choose_among(sorted, cands, count - above_all, cand_key, scratch, slot_count, 1,
                             [&](std::size_t u) { return first(u, 1); });
      }
      for (std::size_t s = t; s < slot_count; s += team) {
        std::size_t rank = 0;
        for (std::size_t u = 0; u < s; ++u) rank += words(u)[0] + words(u)[2];
        std::size_t a = first(s, 0), c = first(s, 1), ties_left = words(s)[3];
        std::size_t const a_end = a + words(s)[0], c_end = c + words(s)[1];
        while (a < a_end || c < c_end) {  // the two runs, merged in index order
          if (c < c_end && (a == a_end || cand_index[c] < above[a])) {
            std::uint32_t const k = cand_key[c];
            if (k > least || (k == least && ties_left > 0)) {
              ties_left -= k == least;
              emit(cand_index[c], rank++);
            }
            ++c;
          } else {
            emit(above[a++], rank++);
          }
        }
      }
    }
  }
  return fits;
}

/// The slots of the two-pass selection for n keys on `space` with `scratch`.
inline int pass_select_slots(host_space const& space, std::size_t n, span<std::byte, host_memory> scratch) {
  int const capacity = static_cast<int>(scratch.size() / (host_select_bins(n) * sizeof(std::uint32_t)));
  return std::max(1, std::min({space.threads_for(n), capacity, host_thread_capacity()}));
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
