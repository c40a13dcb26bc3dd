// TopK-Chunked (TopKC): all-reduce compatible sparsification.
//
// Every rank scores the same chunks, the ranks sum the scores, and every rank
// then picks the same K chunks from the summed scores, so the values of the
// chosen chunks line up across ranks and can be summed by all-reduce: the
// traffic per rank does not grow with the number of ranks.
//
// Per step, with acc = g + e (e the error-feedback residual):
//   1. score pass: s_j = ||acc over chunk j||^2 for chunks of C elements (the
//      last may be shorter), in double, in segmented_reduce's canonical order
//      (bitwise the same on host and device) [reads g, e: 8 B/element];
//   2. all-reduce(sum) of the m = ceil(d / C) scores, in the Score type;
//   3. every rank selects the K chunks of largest summed score, ties to the
//      lower chunk index (top_k): a pure function of the summed scores, which
//      the all-reduce made bitwise equal on every rank;
//   4. pack the K chosen chunks (K * C values, the tail chunk zero-padded) as
//      Value, pre-scaled by 1/n, and all-reduce(sum) them;
//   5. output pass: the mean in the chosen chunks, zero elsewhere; residual
//      e = acc - sent in the chosen chunks (the rounding), e = acc elsewhere
//      [reads g, e; writes g, e: 16 B/element].
// About 24 bytes of memory traffic per element, three gradient-sized passes'
// worth. Wire bytes per step: m * sizeof(Score) + K * C * sizeof(Value).
//
// Defaults: C = 256 and bf16 scores, so the score vector costs 1/128 of the
// bf16 baseline's bytes (with C = 64 and fp32 scores it would be 1/32 of
// them, more than the values at 1% of chunks); bf16 values, as the baseline.
#pragma once

#include <gradcomp/algorithm/segmented_reduce.hpp>
#include <gradcomp/algorithm/top_k.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/mean_codec.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/streaming_store.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/types.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

inline constexpr std::uint32_t not_selected = 0xffffffffu;

// Score pass: acc of element i (a value the Value lane cannot carry is left
// out and counted: the reduction's limit).
struct topkc_acc {
  GRADCOMP_HOST_DEVICE float operator()(std::size_t, float g, float e) const { return g + e; }
};

template <class Score>
struct topkc_store_score {
  Score* scores;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j, double total) const {
    scores[j] = static_cast<Score>(static_cast<float>(total));  // past float's range: infinity, still the largest
  }
};

// The selection's key of chunk j: its summed score's bits (scores are >= 0,
// so unsigned order is numeric order).
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

struct fill_unselected {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, std::uint32_t& position) const { position = not_selected; }
};

// Pack: value p of the payload is element `selected[p / C] * C + p % C`.
template <class Value, class EF, class G>
struct topkc_pack {
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  G const* gradient;
  EF ef;
  std::uint32_t const* selected;
  std::size_t n;
  int shift;      // log2(C)
  float inverse;  // 1/n
  struct bound {
    G const* gradient;
    typename EF::bound ef;
    std::uint32_t const* selected;
    std::size_t n;
    int shift;
    float inverse;
    GRADCOMP_HOST_DEVICE void operator()(std::size_t p, Value& packed) const {
      std::size_t const i =
          (static_cast<std::size_t>(selected[p >> shift]) << shift) | (p & ((std::size_t{1} << shift) - 1));
      packed = i < n ? mean_codec<Value>::encode(ef.accumulate(i, load_gradient(gradient, i)), inverse) : Value(0.0f);
    }
  };
  GRADCOMP_HOST_DEVICE bound bind() const { return {gradient, ef.bind(), selected, n, shift, inverse}; }
};

// Output pass: the mean in chosen chunks (the residual keeps the rounding),
// zero elsewhere (the residual keeps everything).
template <class Value>
struct topkc_unpack {
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  std::uint32_t const* position;
  Value const* summed;
  int shift;
  float inverse, ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i, float g, float e, float& out, float& e_next) const {
    float const acc = g + e;
    std::uint32_t const k = position[i >> shift];
    bool const chosen = k != not_selected;
    std::size_t const p = chosen ? (static_cast<std::size_t>(k) << shift) | (i & ((std::size_t{1} << shift) - 1)) : 0;
    Value const sum = chosen ? summed[p] : Value(0.0f);
    out = chosen ? mean_codec<Value>::mean(sum) : 0.0f;
    e_next = chosen ? mean_codec<Value>::residual(acc, mean_codec<Value>::encode(acc, inverse), ranks) : acc;
  }
};

/// The output pass on the host, chunk by chunk: the choice (chosen or
/// dropped) holds for a whole inner loop, and both loops vectorize. The same
/// formulas as topkc_unpack, element for element. A next residual larger
/// than host_space::streamed_bytes goes out with streaming stores, a chunk
/// at a time (chunks of up to host_chunk elements; the gradient is
/// overwritten in place, so it is cached already).
template <class Value, class EF, class G>
void topkc_output(host_space const& space, std::size_t d, std::size_t chunk, G* gradient, EF const& ef,
                  topkc_unpack<Value> const& f, gate when) {
  gate_state const state = read_gate(when);
  if (state == gate_state::closed) return;
  std::size_t const chunks = (d + chunk - 1) / chunk;
  [[maybe_unused]] int const threads = space.threads_for(d);
  GRADCOMP_OMP(parallel num_threads(threads)) {
    auto const e = ef.bind();  // a local copy: its pointers stay in registers
    constexpr bool keeps = decltype(e)::keeps_residual;
    [[maybe_unused]] alignas(64) float staged[keeps ? host_chunk : 1];
    bool streamed = false;
    if constexpr (keeps)
      streamed = chunk <= host_chunk && chunk * sizeof(float) % 16 == 0 &&
                 streams_output(space.streamed_bytes, e.next, 0, d, e.previous);
    GRADCOMP_OMP(for schedule(static) nowait)
    for (std::size_t j = 0; j < chunks; ++j) {
      std::size_t const begin = j * chunk, end = begin + chunk < d ? begin + chunk : d;
      if (state == gate_state::poisoned) {
        for (std::size_t i = begin; i < end; ++i) store_gradient(gradient, i, poison_value<float>());
        continue;
      }
      // Element i's next residual goes to next[i - begin].
      [[maybe_unused]] float* __restrict next = nullptr;
      if constexpr (keeps) next = streamed ? staged : e.next + begin;
      std::uint32_t const k = f.position[j];
      if (k == not_selected) {
        GRADCOMP_OMP(simd)
        for (std::size_t i = begin; i < end; ++i) {
          float const acc = e.accumulate(i, load_gradient(gradient, i));
          if constexpr (keeps) next[i - begin] = acc;
          store_gradient(gradient, i, 0.0f);
        }
      } else {
        Value const* summed = f.summed + (static_cast<std::size_t>(k) << f.shift) - begin;
        GRADCOMP_OMP(simd)
        for (std::size_t i = begin; i < end; ++i) {
          float const acc = e.accumulate(i, load_gradient(gradient, i));
          if constexpr (keeps)
            next[i - begin] = mean_codec<Value>::residual(acc, mean_codec<Value>::encode(acc, f.inverse), f.ranks);
          store_gradient(gradient, i, mean_codec<Value>::mean(summed[i]));
        }
      }
      if constexpr (keeps)
        if (streamed) stream_copy(e.next + begin, staged, (end - begin) * sizeof(float));
    }
    stream_fence();  // before the region's barrier: the next pass may read on other threads
  }
}

#if GRADCOMP_HAS_CUDA
/// The output pass on CUDA: one transform (a warp shares a chunk's choice).
template <class Value, class EF, class G>
void topkc_output(cuda_space const& space, std::size_t d, std::size_t, G* gradient, EF const& ef,
                  topkc_unpack<Value> const& f, gate when) {
  transform(space, d, inputs(gradient_stream(gradient), ef.previous()), outputs(gradient_stream(gradient), ef.next()),
            f, {.when = when});
}
#endif

// verify_selection: a hash of the chosen chunks, and the ranks' comparison.
struct hash_selection {
  std::uint32_t const* selected;
  std::size_t k;
  std::uint64_t* hash;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    std::uint64_t h = hash_seed;
    for (std::size_t r = 0; r < k; ++r) h = hash_combine(h, selected[r]);
    *hash = h;
  }
};
struct compare_selections {
  std::uint64_t const* hashes;  // one per rank
  int ranks;
  std::uint64_t* veto;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    for (int r = 1; r < ranks; ++r)
      if (hashes[r] != hashes[0]) *veto |= fault_bit;
  }
};

}  // namespace detail

/// TopK-Chunked sparsification (see the top of this header).
///
/// \tparam Value wire type of the chosen chunks' values: float, bfloat16 or half.
/// \tparam Score wire type of the chunk scores: float or bfloat16.
template <class Value = bfloat16, class Score = bfloat16>
struct topkc {
  static_assert(std::is_same_v<Score, float> || std::is_same_v<Score, bfloat16>,
                "topkc scores travel as float or bfloat16 (half would underflow squared gradients)");

  /// Name for messages and reports.
  static constexpr std::string_view name = "topkc";
  /// Every rank sends the same chunks: the values add element by element.
  static constexpr bool summable_payload = true;
  /// Shards on whole chunks.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// A shard starts on a chunk.
  std::size_t shard_alignment() const { return chunk_size; }

  /// Spec: fraction (of chunks), chunk_size.
  static constexpr bool integer_lane = false;
  static constexpr bool error_feedback_by_default = true;
  /// make(the compressor the spec sets).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int, Make&& make) {
    return make(with_parameters<topkc>(s));
  }

  /// `chunks` value meaning "K = ceil(fraction * m)".
  static constexpr std::size_t from_fraction = static_cast<std::size_t>(-1);
  /// The largest chunk size: chunk offsets and payload sizes stay far from overflow.
  static constexpr std::size_t max_chunk_size = std::size_t{1} << 30;

  std::size_t chunk_size = 256;  ///< C, a power of two up to 2^30.
  /// Share of chunks kept, in (0, 1], when `chunks` is from_fraction. The
  /// default, 5%, is where the example task trains as bf16 does with SGD at
  /// momentum 0.9 and lr 0.05 (test accuracy 0.84-0.85 at step 400 over three
  /// seeds, 4 ranks, chunks of 256); at 2-3% it still trains (0.82-0.84), at
  /// 1% it diverges to chance: very sparse updates want a lower learning
  /// rate or warm-up.
  double fraction = 0.05;
  std::size_t chunks = from_fraction;  ///< K, the number of chunks kept (0 sends no values).
  /// Debug: ranks compare a hash of their selections every step (one more
  /// all-gather of 8 bytes per rank); ranks that differ all get
  /// collective_error (on the CUDA space at the next call).
  bool verify_selection = false;

  /// What a spec sets (pipeline/registration.hpp).
  static constexpr auto parameters =
      std::tuple{parameter{"fraction", &topkc::fraction, "share of the chunks kept", "(0, 1]"},
                 parameter{"chunk_size", &topkc::chunk_size, "C, values per chunk", "a power of two up to 2^30"}};

  /// m = ceil(d / C), the number of chunks of a bucket of d elements.
  std::size_t chunk_count(std::size_t d) const { return d / chunk_size + (d % chunk_size != 0); }

  /// K for a bucket of d elements.
  std::size_t kept_chunks(std::size_t d) const {
    std::size_t const m = chunk_count(d);
    if (chunks != from_fraction) return chunks;
    return std::min(m, static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(m))));
  }

  /// Throws invalid_argument for a chunk size that is not a power of two in
  /// [1, 2^30], a fraction outside (0, 1], or more chunks than the bucket has.
  void validate(bucket_layout const& layout, int /*ranks*/) const {
    GRADCOMP_EXPECTS(chunk_size != 0 && std::has_single_bit(chunk_size) && chunk_size <= max_chunk_size,
                     "topkc: chunk_size=" + std::to_string(chunk_size) + " is not a power of two in [1, 2^30]");
    GRADCOMP_EXPECTS(
        chunks != from_fraction || (fraction > 0.0 && fraction <= 1.0),
        "topkc: fraction=" + detail::write_value(fraction) + " is outside (0, 1] (the share of the chunks kept)");
    std::size_t const m = chunk_count(layout.size());
    GRADCOMP_EXPECTS(chunks == from_fraction || chunks <= m,
                     "topkc: " + std::to_string(chunks) + " chunks kept, but a bucket of " +
                         std::to_string(layout.size()) + " elements has only " + std::to_string(m) + " chunks of " +
                         std::to_string(chunk_size));
    GRADCOMP_EXPECTS(m < detail::not_selected, "topkc: too many chunks for 32-bit chunk indices");
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
    span<Score, Memory> scores;            ///< m chunk scores.
    span<std::uint32_t, Memory> position;  ///< chunk -> rank in the payload, or not_selected.
    span<std::uint32_t, Memory> selected;  ///< rank -> chunk, ascending.
    span<Value, Memory> packed;            ///< K * C values.
    span<std::byte, Memory> scratch;       ///< The aggregator's.
    span<std::uint64_t, Memory> hashes;    ///< verify_selection: 1 + ranks.
    span<std::byte, Memory> select;        ///< top_k's scratch.
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    std::size_t const m = chunk_count(layout.size()), k = kept_chunks(layout.size());
    workspace<Memory> ws;
    ws.scores = w.template take<Score>(m);
    ws.position = w.template take<std::uint32_t>(m);
    ws.selected = w.template take<std::uint32_t>(k);
    ws.packed = w.template take<Value>(detail::checked_mul(k, chunk_size, "topkc: the payload"));
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.packed.size_bytes(), ranks));
    ws.hashes = w.template take<std::uint64_t>(verify_selection ? 1 + static_cast<std::size_t>(ranks) : 0);
    ws.select = w.template take<std::byte>(top_k_scratch_bytes<Memory>(m));
    return ws;
  }

  /// Scores (all-reduce) + values (by the aggregator) + selection hashes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    std::size_t const values = kept_chunks(layout.size()) * chunk_size * sizeof(Value);
    return chunk_count(layout.size()) * sizeof(Score) + detail::aggregated_wire_bytes<Aggregator>(values, ranks) +
           (verify_selection ? sizeof(std::uint64_t) * static_cast<std::size_t>(ranks) : 0);
  }

  /// One step: gradient <- the rank-mean of the chosen chunks, zero elsewhere.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    using memory = typename Context::memory;
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size(), m = ws.scores.size(), k = ws.selected.size();
    int const shift = std::countr_zero(chunk_size);
    float const ranks = static_cast<float>(ctx.ranks());

    segmented_reduce<reduction::sum_of_squares>(
        space, d, chunk_size, inputs(detail::gradient_stream(gradient), ef.previous()), detail::topkc_acc{},
        detail::topkc_store_score<Score>{ws.scores.data()},
        {.count = ctx.bad_count(), .limit = detail::mean_codec<Value>::limit(ctx.ranks())});
    ctx.agree_all_finite(detail::mean_codec<Value>::out_of_range);
    ctx.all_reduce(ws.scores, reduce_op::sum);

    transform(space, m, inputs(), outputs(ws.position), detail::fill_unselected{});
    top_k(space, m, k, detail::topkc_key<Score>{ws.scores.data()},
          detail::topkc_record{ws.selected.data(), ws.position.data()}, ws.select);
    if (verify_selection) {
      parallel_for(space, 1, detail::hash_selection{ws.selected.data(), k, ws.hashes.data()});
      ctx.all_gather(span<std::uint64_t const, memory>(ws.hashes.subspan(0, 1)), ws.hashes.subspan(1, ctx.ranks()));
      parallel_for(space, 1, detail::compare_selections{ws.hashes.data() + 1, ctx.ranks(), ctx.veto_word()});
      ctx.fault_checked(
          "topkc: the ranks selected different chunks; the summed scores differ between ranks "
          "(a collective that does not return identical sums?)");
    }

    transform(space, ws.packed.size(), inputs(), outputs(ws.packed),
              detail::topkc_pack<Value, EF, G>{gradient.data(), ef, ws.selected.data(), d, shift, 1.0f / ranks});
    ctx.aggregate(ws.packed, ws.scratch);
    detail::topkc_output(space, d, chunk_size, gradient.data(), ef,
                         detail::topkc_unpack<Value>{ws.position.data(), ws.packed.data(), shift, 1.0f / ranks, ranks},
                         ctx.output_gate());
  }
};

static_assert(compressor<topkc<>>);

}  // namespace gradcomp
