// Classic TopK sparsification: the all-gather case the evaluation argues
// against, kept honest and fast so the comparison is fair.
//
// Per step, with acc = g + e:
//   1. acc pass [reads g, e; writes acc: 12 B/element];
//   2. select the k entries of largest |acc|, ties to the lower index
//      (top_k, no sort: on the host one read of acc copies out the keys
//      above a threshold guessed from a sample);
//   3. all-gather every rank's k (index, value) pairs: n * k * (4 + value
//      size) bytes arrive at every rank, growing with n;
//   4. output pass: zero the gradient, e = acc [reads acc; writes g, e:
//      12 B/element; on the host with error feedback acc was written as e
//      in pass 1, so this pass writes g alone]; then, rank by rank (so every
//      rank adds in the same order), add value / n at each gathered index
//      (on the host with error feedback, in the same pass, a run of g at a
//      time: the indices are in order); e = acc - sent at this rank's own
//      indices.
// Values travel as acc / n (the sum is local, in float). k > d is an error;
// k = 0 sends nothing and keeps everything in the residual.
#pragma once

#include <gradcomp/algorithm/top_k.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/mean_codec.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/types.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

struct topk_accumulate {
  float limit;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, float g, float e, float& acc) const {
    acc = g + e;
    return !((acc <= limit) & (acc >= -limit));
  }
};

struct magnitude_key {
  float const* acc;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t i) const { return float_bits(acc[i]) & 0x7fffffffu; }
};

template <class W>
struct topk_emit {
  float const* acc;
  std::uint32_t* indices;
  W* values;
  float inverse;  // 1/n
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i, std::size_t r) const {
    indices[r] = static_cast<std::uint32_t>(i);
    values[r] = mean_codec<W>::encode(acc[i], inverse);
  }
};

struct topk_reset {  // nothing sent here: output 0, everything stays behind
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float acc, float& g, float& e_next) const {
    g = 0.0f;
    e_next = acc;
  }
};

struct topk_zero {  // the same, with e = acc already in place
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float& g) const { g = 0.0f; }
};

template <class W, class EF>
struct topk_keep_unsent {                    // this rank's own indices: e = acc - sent
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  float const* acc;
  EF ef;
  float ranks;
  struct bound {
    float const* acc;
    typename EF::bound ef;
    float ranks;
    GRADCOMP_HOST_DEVICE void operator()(std::size_t, std::uint32_t i, W value) const {
      ef.update(i, mean_codec<W>::residual(acc[i], value, ranks));
    }
  };
  GRADCOMP_HOST_DEVICE bound bind() const { return {acc, ef.bind(), ranks}; }
};

template <class W, class G>
struct topk_scatter_mean {                   // one rank's pairs, added in rank order
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  G* gradient;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, std::uint32_t i, W value) const {
    store_gradient(gradient, i, load_gradient(gradient, i) + mean_codec<W>::mean(value));
  }
};

// Host, an open gate, e = acc already in place: the gradient zeroed a run at
// a time, and each run's gathered values added in rank order while it is in
// cache (the same sums as the scatters, which alone missed the cache at
// nearly every index). Only indices within the bucket are written.
template <class W, class G>
void topk_zero_and_add(host_space const& space, G* gradient, std::size_t d, std::uint32_t const* indices,
                       W const* values, std::size_t ranks, std::size_t sent) {
  constexpr std::size_t run = std::size_t{1} << 16;
  std::size_t const runs = (d + run - 1) / run;
  [[maybe_unused]] int const threads = space.threads_for(d);
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads))
  for (std::size_t c = 0; c < runs; ++c) {
    std::size_t const lo = c * run, hi = lo + run < d ? lo + run : d;
    std::memset(static_cast<void*>(gradient + lo), 0, (hi - lo) * sizeof(G));  // zero bits are 0.0 in every G
    for (std::size_t r = 0; r < ranks; ++r) {
      std::uint32_t const* const first = indices + r * sent;
      std::uint32_t const* const last = first + sent;
      for (auto const* at = std::lower_bound(first, last, static_cast<std::uint32_t>(lo)); at != last && *at < hi; ++at)
        store_gradient(gradient, *at, load_gradient(gradient, *at) + mean_codec<W>::mean(values[at - indices]));
    }
  }
}

}  // namespace detail

/// Classic TopK (see the top of this header).
///
/// \tparam Value wire type of the values: float, bfloat16 or half.
template <class Value = float>
struct topk {
  /// Name for messages and reports.
  static constexpr std::string_view name = "topk";
  /// Each rank picks its own indices: payloads cannot be added element-wise.
  static constexpr bool summable_payload = false;
  /// Does not shard: its pairs do not sum.
  static constexpr shard_kind sharding = shard_kind::none;

  /// Spec: fraction (of elements).
  static constexpr bool integer_lane = false;
  static constexpr bool error_feedback_by_default = true;
  /// make(the compressor the spec sets).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int, Make&& make) {
    return make(with_parameters<topk>(s));
  }

  /// `k` value meaning "k = ceil(fraction * d)".
  static constexpr std::size_t from_fraction = static_cast<std::size_t>(-1);

  double fraction = 0.01;         ///< Share of elements sent, in (0, 1], when `k` is from_fraction.
  std::size_t k = from_fraction;  ///< Elements sent per rank (0 sends nothing).

  /// What a spec sets (pipeline/registration.hpp).
  static constexpr auto parameters =
      std::tuple{parameter{"fraction", &topk::fraction, "share of the elements each rank sends", "(0, 1]"}};

  /// k for a bucket of d elements.
  std::size_t kept(std::size_t d) const {
    if (k != from_fraction) return k;
    return std::min(d, static_cast<std::size_t>(std::ceil(fraction * static_cast<double>(d))));
  }

  /// Throws invalid_argument for k larger than the bucket or a fraction
  /// outside (0, 1].
  void validate(bucket_layout const& layout, int /*ranks*/) const {
    GRADCOMP_EXPECTS(k != from_fraction || (fraction > 0.0 && fraction <= 1.0),
                     "topk: fraction=" + detail::write_value(fraction) +
                         " is outside (0, 1] (the share of the elements each rank sends)");
    GRADCOMP_EXPECTS(k == from_fraction || k <= layout.size(), "topk: k = " + std::to_string(k) +
                                                                   " is larger than the bucket (" +
                                                                   std::to_string(layout.size()) + " elements)");
    GRADCOMP_EXPECTS(layout.size() < 0xffffffffull, "topk: buckets over 2^32 elements need 64-bit indices");
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), k);
    h = detail::hash_combine(h, std::bit_cast<std::uint64_t>(fraction));
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Value>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<float, Memory> acc;                       ///< g + e.
    span<std::uint32_t, Memory> indices;           ///< This rank's k indices...
    span<Value, Memory> values;                    ///< ...and values.
    span<std::uint32_t, Memory> gathered_indices;  ///< Every rank's, rank by rank.
    span<Value, Memory> gathered_values;
    span<std::byte, Memory> select;  ///< top_k's scratch.
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    std::size_t const d = layout.size(), sent = kept(d);
    std::size_t const gathered = detail::checked_mul(sent, static_cast<std::size_t>(ranks), "topk");
    workspace<Memory> ws;
    ws.acc = w.template take<float>(d);
    ws.indices = w.template take<std::uint32_t>(sent);
    ws.values = w.template take<Value>(sent);
    ws.gathered_indices = w.template take<std::uint32_t>(gathered);
    ws.gathered_values = w.template take<Value>(gathered);
    ws.select = w.template take<std::byte>(top_k_scratch_bytes<Memory>(d));
    return ws;
  }

  /// n * k * (4 + value size): the all-gather of every rank's pairs.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return kept(layout.size()) * (sizeof(std::uint32_t) + sizeof(Value)) * static_cast<std::size_t>(ranks);
  }

  /// One step: gradient <- the mean over ranks of their sparse top-k vectors.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    using memory = typename Context::memory;
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size(), sent = ws.indices.size();
    float const ranks = static_cast<float>(ctx.ranks());

    // On the host with error feedback, acc goes straight into this step's
    // residual (e = acc everywhere but the own indices, and a vetoed step does
    // not commit it), so the output pass only zeroes the gradient.
    constexpr bool acc_in_residual = std::is_same_v<memory, host_memory> && EF::bound::keeps_residual;
    float* acc = ws.acc.data();
    if constexpr (acc_in_residual) acc = ef.next().resolve();
    transform(space, d, inputs(detail::gradient_stream(gradient), ef.previous()), outputs(acc),
              detail::topk_accumulate{detail::mean_codec<Value>::limit(ctx.ranks())}, {.count = ctx.bad_count()});
    ctx.agree_all_finite(detail::mean_codec<Value>::out_of_range);

    top_k(space, d, sent, detail::magnitude_key{acc},
          detail::topk_emit<Value>{acc, ws.indices.data(), ws.values.data(), 1.0f / ranks}, ws.select);
    ctx.all_gather(span<std::uint32_t const, memory>(ws.indices), ws.gathered_indices);
    ctx.all_gather(span<Value const, memory>(ws.values), ws.gathered_values);

    gate const when = ctx.output_gate();  // (a vetoed step skips the scatters too: the reset wrote or skipped all)
    bool added = false;                   // the gathered values already in the gradient
    if constexpr (acc_in_residual) {
      if (detail::read_gate(when) == detail::gate_state::open) {
        detail::topk_zero_and_add(space, gradient.data(), d, ws.gathered_indices.data(), ws.gathered_values.data(),
                                  static_cast<std::size_t>(ctx.ranks()), sent);
        added = true;
      } else  // (the vetoed step's own gate: nothing, or NaN everywhere)
        transform(space, d, inputs(), outputs(detail::gradient_stream(gradient)), detail::topk_zero{}, {.when = when});
    } else
      transform(space, d, inputs(acc), outputs(detail::gradient_stream(gradient), ef.next()), detail::topk_reset{},
                {.when = when});
    transform(space, sent, inputs(ws.indices, ws.values), outputs(),
              detail::topk_keep_unsent<Value, EF>{acc, ef, ranks}, {.when = when});
    for (int r = 0; r < ctx.ranks() && !added; ++r)  // rank order: the same sums on every rank
      transform(space, sent,
                inputs(ws.gathered_indices.subspan(r * sent, sent), ws.gathered_values.subspan(r * sent, sent)),
                outputs(), detail::topk_scatter_mean<Value, G>{gradient.data()}, {.when = when});
  }
};

static_assert(compressor<topk<>>);

}  // namespace gradcomp
