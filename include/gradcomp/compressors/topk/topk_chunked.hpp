// TopK-Chunked (TopKC): all-reduce compatible sparsification.
//
// Every rank scores the same chunks, the ranks sum the scores, and every rank
// then picks the same K chunks from the summed scores, so the values of the
// chosen chunks line up across ranks and can be summed by all-reduce: the
// traffic per rank does not grow with the number of ranks.
//
// Per step, with acc = g + e (e the error-feedback residual):
//   1. score pass: s_j = ||acc over chunk j||^2 for chunks of C elements (the
//      last may be shorter) [reads g, e: 8 B/element];
//   2. all-reduce(sum) of the m = ceil(d / C) scores, in the Score type;
//   3. every rank selects the K chunks of largest summed score, ties to the
//      lower chunk index: a pure function of scores that are bitwise equal on
//      every rank (host and device sum each chunk in one canonical order);
//   4. pack the K chosen chunks (K * C values, the tail chunk zero-padded) as
//      Value, pre-scaled by 1/n for 16-bit values, and all-reduce(sum) them;
//   5. output pass: the mean in the chosen chunks, zero elsewhere; residual
//      e = acc - sent in the chosen chunks (the 16-bit rounding, or zero),
//      e = acc elsewhere [reads g, e; writes g, e: 16 B/element].
// About 24 bytes of memory traffic per element, three gradient-sized passes'
// worth. Wire bytes per step: m * sizeof(Score) + K * C * sizeof(Value).
//
// Defaults: C = 256 and bf16 scores, so the score vector costs 1/128 of the
// bf16 baseline's bytes (with C = 64 and fp32 scores it would be 1/32 of
// them, more than the values at 1% of chunks); bf16 values, as the baseline.
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/compressors/topk/select.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/mean_codec.hpp>
#include <gradcomp/detail/squared_norms.hpp>
#include <gradcomp/types.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp {
namespace detail {

inline constexpr std::uint32_t not_selected = 0xffffffffu;

// Score pass: chunk j's summed square (of detail::accumulated) into the scores.
template <class Score>
struct topkc_store_score {
  Score* scores;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t j, float sum) const {
    scores[j] = static_cast<Score>(sum);
    return !(sum <= 3.40282347e38f);  // NaN or infinite: a bad value, or a square past float's range
  }
};

// The selection's key of chunk j: its summed score's bits (scores are >= 0,
// so unsigned order is numeric order; NaN ranks above everything).
template <class Score>
struct topkc_key {
  Score const* scores;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t j) const {
    return float_bits(static_cast<float>(scores[j]));
  }
};

struct topkc_record {
  std::uint32_t* selected;  // rank r -> chunk
  std::uint32_t* position;  // chunk -> rank, or not_selected
  GRADCOMP_HOST_DEVICE void operator()(std::size_t chunk, std::size_t r) const {
    selected[r] = static_cast<std::uint32_t>(chunk);
    position[chunk] = static_cast<std::uint32_t>(r);
  }
};

struct fill_u32 {
  std::uint32_t* data;
  std::uint32_t value;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { data[i] = value; }
};

template <class Value, class EF>
struct topkc_pack {
  float const* gradient;
  EF ef;
  std::uint32_t const* selected;
  Value* packed;
  std::size_t n;
  int shift;  // log2(C)
  float ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t p) const {
    std::size_t const i =
        (static_cast<std::size_t>(selected[p >> shift]) << shift) | (p & ((std::size_t{1} << shift) - 1));
    packed[p] = i < n ? mean_codec<Value>::encode(ef.accumulate(i, gradient[i]), ranks) : Value(0.0f);
  }
};

// Output pass. Per element on the device (operator()); per chunk on the
// host (chunk()), where the choice is then loop-invariant and both loops
// vectorize. The same two element formulas serve both.
template <class Value, class EF>
struct topkc_unpack {
  float* gradient;
  EF ef;
  std::uint32_t const* position;
  Value const* summed;
  int shift;
  float ranks;

  // A chosen element: the mean arrives; the residual keeps the rounding.
  GRADCOMP_HOST_DEVICE void chosen(std::size_t i, std::size_t p) const {
    float const acc = ef.accumulate(i, gradient[i]);
    float const sent = mean_codec<Value>::sent(mean_codec<Value>::encode(acc, ranks), ranks);
    gradient[i] = mean_codec<Value>::mean(summed[p], ranks);
    ef.update(i, acc - sent, mean_codec<float>::fits(acc));
  }
  // An element of a chunk nobody sent: zero out, everything stays behind.
  GRADCOMP_HOST_DEVICE void dropped(std::size_t i) const {
    float const acc = ef.accumulate(i, gradient[i]);
    gradient[i] = 0.0f;
    ef.update(i, acc, mean_codec<float>::fits(acc));
  }

  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    std::uint32_t const k = position[i >> shift];
    if (k == not_selected)
      dropped(i);
    else
      chosen(i, (static_cast<std::size_t>(k) << shift) | (i & ((std::size_t{1} << shift) - 1)));
  }

  void chunk(std::size_t j, std::size_t begin, std::size_t end) const {
    std::uint32_t const k = position[j];
    if (k == not_selected) {
      for (std::size_t i = begin; i < end; ++i) dropped(i);
    } else {
      std::size_t const base = (static_cast<std::size_t>(k) << shift) - begin;
      for (std::size_t i = begin; i < end; ++i) chosen(i, base + i);
    }
  }
};

}  // namespace detail

/// TopK-Chunked sparsification (see the top of this header).
///
/// \tparam Value wire type of the chosen chunks' values: float, bfloat16 or half.
/// \tparam Score wire type of the chunk scores: float or bfloat16.
template <class Value = bfloat16, class Score = bfloat16>
struct topk_chunked {
  static_assert(std::is_same_v<Score, float> || std::is_same_v<Score, bfloat16>,
                "topk_chunked scores travel as float or bfloat16 (half would underflow squared gradients)");

  /// Name for messages and reports.
  static constexpr std::string_view name = "topkc";
  /// Every rank sends the same chunks: the values add element by element.
  static constexpr bool summable_payload = true;

  /// `chunks` value meaning "K = ceil(fraction * m)".
  static constexpr std::size_t from_fraction = static_cast<std::size_t>(-1);

  std::size_t chunk_size = 256;        ///< C, a power of two.
  double fraction = 0.01;              ///< Share of chunks kept, in (0, 1], when `chunks` is from_fraction.
  std::size_t chunks = from_fraction;  ///< K, the number of chunks kept (0 sends no values).
  bool verify_selection =
      false;  ///< Debug: ranks compare a hash of their selections every step (waits for the device).

  /// m = ceil(d / C), the number of chunks of a bucket of d elements.
  std::size_t chunk_count(std::size_t d) const { return (d + chunk_size - 1) / chunk_size; }

  /// K for a bucket of d elements.
  std::size_t kept_chunks(std::size_t d) const {
    std::size_t const m = chunk_count(d);
    if (chunks != from_fraction) return chunks;
    return std::min(m, static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(m))));
  }

  /// Throws invalid_argument for a chunk size that is not a power of two, a
  /// fraction outside (0, 1], or more chunks than the bucket has.
  void validate(bucket_layout const& layout, int /*ranks*/) const {
    GRADCOMP_EXPECTS(chunk_size != 0 && std::has_single_bit(chunk_size),
                     "topk_chunked: chunk size " + std::to_string(chunk_size) + " is not a power of two");
    GRADCOMP_EXPECTS(chunks != from_fraction || (fraction > 0.0 && fraction <= 1.0),
                     "topk_chunked: the fraction of chunks kept must be in (0, 1], got " + std::to_string(fraction));
    std::size_t const m = chunk_count(layout.size());
    GRADCOMP_EXPECTS(chunks == from_fraction || chunks <= m,
                     "topk_chunked: " + std::to_string(chunks) + " chunks kept, but a bucket of " +
                         std::to_string(layout.size()) + " elements has only " + std::to_string(m) + " chunks of " +
                         std::to_string(chunk_size));
    GRADCOMP_EXPECTS(m < detail::not_selected, "topk_chunked: too many chunks for 32-bit chunk indices");
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash(name);
    h = detail::hash_combine(h, chunk_size);
    h = detail::hash_combine(h, chunks);
    h = detail::hash_combine(h, std::bit_cast<std::uint64_t>(fraction));
    h = detail::hash_combine(
        h, static_cast<std::uint64_t>(dtype_of_v<Value>) * 256 + static_cast<std::uint64_t>(dtype_of_v<Score>));
    return detail::hash_combine(h, verify_selection);
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;  ///< Bad-value counts (this rank, all ranks).
    span<Score, Memory> scores;            ///< m chunk scores.
    span<std::uint32_t, Memory> position;  ///< chunk -> rank in the payload, or not_selected.
    span<std::uint32_t, Memory> selected;  ///< rank -> chunk, ascending.
    span<Value, Memory> packed;            ///< K * C values.
    span<std::byte, Memory> scratch;       ///< The aggregator's.
    span<std::uint64_t, Memory> hashes;    ///< verify_selection: 1 + ranks.
    detail::select_workspace<Memory> select;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    std::size_t const m = chunk_count(layout.size()), k = kept_chunks(layout.size());
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.scores = w.template take<Score>(m);
    ws.position = w.template take<std::uint32_t>(m);
    ws.selected = w.template take<std::uint32_t>(k);
    ws.packed = w.template take<Value>(k * chunk_size);
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.packed.size_bytes(), ranks));
    ws.hashes = w.template take<std::uint64_t>(verify_selection ? 1 + static_cast<std::size_t>(ranks) : 0);
    ws.select = detail::carve_select(w, m, k);
    return ws;
  }

  /// Scores (all-reduce) + values (by the aggregator) + selection hashes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    std::size_t const values = kept_chunks(layout.size()) * chunk_size * sizeof(Value);
    return chunk_count(layout.size()) * sizeof(Score) + detail::aggregated_wire_bytes<Aggregator>(values, ranks) +
           (verify_selection ? sizeof(std::uint64_t) * ranks : 0);
  }

  /// One step: gradient <- the rank-mean of the chosen chunks, zero elsewhere.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    std::size_t const d = gradient.size(), m = ws.scores.size(), k = ws.selected.size();
    int const shift = std::countr_zero(chunk_size);
    float const ranks = static_cast<float>(ctx.ranks());

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    segment_sum_of_squares(space, d, chunk_size, detail::accumulated<EF>{gradient.data(), ctx.error_feedback()},
                           detail::topkc_store_score<Score>{ws.scores.data()}, ws.counters.data());
    ctx.agree_all_finite(ws.counters.data(), "NaN, infinite, or so large that a chunk's squared norm overflows");
    ctx.all_reduce(ws.scores, reduce_op::sum);

    parallel_for(space, m, detail::fill_u32{ws.position.data(), detail::not_selected});
    detail::select_largest(space, m, k, detail::topkc_key<Score>{ws.scores.data()},
                           detail::topkc_record{ws.selected.data(), ws.position.data()}, ws.select);
    if (verify_selection) verify(ctx, ws);

    parallel_for(space, ws.packed.size(),
                 detail::topkc_pack<Value, EF>{gradient.data(), ctx.error_feedback(), ws.selected.data(),
                                               ws.packed.data(), d, shift, ranks});
    ctx.aggregate(ws.packed, ws.scratch);
    parallel_for_chunks(space, d, chunk_size,
                        detail::topkc_unpack<Value, EF>{gradient.data(), ctx.error_feedback(), ws.position.data(),
                                                        ws.packed.data(), shift, ranks});
  }

 private:
  // Ranks all-gather a hash of their selections and compare: every rank
  // reaches the same verdict, so they all throw together or none does.
  template <class Context, class Memory>
  void verify(Context& ctx, workspace<Memory> const& ws) const {
    auto const& space = ctx.space();
    std::vector<std::uint32_t> selected(ws.selected.size());
    space.to_host(selected.data(), ws.selected.data(), selected.size() * sizeof(std::uint32_t));
    std::uint64_t hash = detail::hash_seed;
    for (std::uint32_t chunk : selected) hash = detail::hash_combine(hash, chunk);
    space.from_host(ws.hashes.data(), &hash, sizeof hash);
    ctx.all_gather(span<std::uint64_t const, Memory>(ws.hashes.subspan(0, 1)), ws.hashes.subspan(1, ctx.ranks()));
    std::vector<std::uint64_t> all(ctx.ranks());
    space.to_host(all.data(), ws.hashes.data() + 1, all.size() * sizeof(std::uint64_t));
    for (int r = 1; r < ctx.ranks(); ++r)
      if (all[r] != all[0])
        throw collective_error("topk_chunked: rank " + std::to_string(r) +
                               " selected different chunks from rank 0; the summed scores differ between ranks "
                               "(a collective that does not return identical sums?)");
  }
};

static_assert(compressor<topk_chunked<>>);

}  // namespace gradcomp
