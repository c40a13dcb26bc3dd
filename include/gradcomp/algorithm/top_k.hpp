// top_k: the `count` largest of n 32-bit keys, ties to the lower index,
// reported in index order. The result is a pure function of the keys: the
// same on host and device, whatever the thread count, so ranks holding the
// same keys select the same elements.
//
//   top_k(space, n, count, key, emit, scratch)
//
// calls emit(i, r) for each selected i, r = 0, 1, ... in increasing i.
//
// Host, for a million keys and more: one pass. A threshold is guessed from
// a sample (256 runs of 256 keys spread evenly over them), a few deviations
// below the count-th largest sampled key; the keys at or above it are copied
// out, each thread's in index order into its share of the scratch, and the
// count-th largest is found among those copies alone. Where the guess was
// too high (fewer than count copies) or a thread's share overflows, that
// work is dropped for two passes: the first counts, per thread, the keys of
// each value of their top 11 bits (histograms small enough for L1), which
// names the bin holding the count-th largest key; the second copies out the
// indices above that bin and the bin's keys (the candidates), both in index
// order at offsets the histograms give. The threshold is then found among
// the candidates alone, and the two lists merge into the emission. Where the
// lists would not fit the scratch (a bin of many equal keys, count a large
// part of n), an MSD radix select over all keys (16-bit digits for large n,
// 8-bit for small) finds the threshold, and one pass counts and one emits.
// The three give the same result; the first costs one read of the keys.
// CUDA (top_k.cuh): three histogram rounds
// (11, 11, 10 bits) find the threshold on the device, then an index-ordered
// compaction (per-tile counts, a scan, an emit pass); nothing is sorted and
// the host never looks at a count.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/workspace.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

/// Host histogram bins of one radix round for n keys.
inline std::size_t host_select_bins(std::size_t n) { return n >= (std::size_t{1} << 20) ? 1u << 16 : 1u << 8; }

/// The two-pass host selection: its histograms (of the top 11 bits, in
/// four interleaved copies so that equal neighbours do not wait on one
/// counter) and the room for its lists, in entries.
inline constexpr int pass_select_shift = 21, pass_select_copies = 4;
inline constexpr std::size_t pass_select_bins = std::size_t{1} << (32 - pass_select_shift);
inline std::size_t pass_select_room(std::size_t n) { return n / 16 + 1024; }

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

/// The words after each slot's histograms: in the two-pass selection, its
/// keys above the bin, in the bin, chosen from the bin, ties taken; in the
/// sampled one, its copies, whether they overflowed its share, chosen, ties
/// taken. Slot s of `slots` holds keys [n s / slots, n (s + 1) / slots).
inline constexpr std::size_t pass_select_words = 4,
                             pass_select_stride = pass_select_bins * pass_select_copies + pass_select_words;

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
        constexpr std::size_t run = 16;
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

/// The sampled selection's sample: runs of consecutive keys spread evenly
/// over all of them (a run is a few cache lines).
inline constexpr std::size_t sample_runs = 256, sample_run = 256, sample_keys = sample_runs * sample_run;

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
      constexpr std::size_t run = 16;  // (a test that vectorizes passes over runs with none)
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

/// The slots of the two-pass selection for n keys on `space` with `scratch`.
inline int pass_select_slots(host_space const& space, std::size_t n, span<std::byte, host_memory> scratch) {
  int const capacity = static_cast<int>(scratch.size() / (host_select_bins(n) * sizeof(std::uint32_t)));
  return std::max(1, std::min({space.threads_for(n), capacity, host_thread_capacity()}));
}

}  // namespace detail

/// Bytes of scratch top_k needs for n keys in memory of kind Memory.
template <class Memory>
std::size_t top_k_scratch_bytes(std::size_t n) {
  workspace_carver<Memory> measure;
  if constexpr (std::is_same_v<Memory, host_memory>) {
    std::size_t const threads = static_cast<std::size_t>(host_thread_capacity());
    std::size_t const radix = detail::checked_mul(detail::host_select_bins(n), threads, "top_k");
    std::size_t const passes = detail::checked_add(
        detail::checked_mul(detail::pass_select_stride, threads, "top_k"),
        detail::checked_add(detail::checked_mul(detail::pass_select_room(n), 4, "top_k"), 3 * threads, "top_k"),
        "top_k");
    measure.template take<std::uint32_t>(std::max(radix, passes));
  } else
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
  int const slots = detail::pass_select_slots(space, n, scratch);
  if (detail::sampled_select(slots, n, count, key, emit, histograms)) return;
  if (detail::two_pass_select(slots, n, count, key, emit, histograms)) return;
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
