// IntSGD (Mishchenko et al., "IntSGD: Adaptive Floatless Compression of
// Stochastic Gradients", ICLR 2022): integers summed by all-reduce, scaled by
// an alpha that every rank computes alike from values all ranks already
// share, so the scale costs no communication.
//
// Per step, with acc = g + e and r the running mean of ||output||^2:
//   alpha = alpha0 sqrt(d) / (sqrt(2n) sqrt(r + 1e-16))
//   1. encode pass [reads g, e; writes q, e]: q = round(alpha acc) (stochastic
//      and unbiased, or to nearest), clamped to [-M/n, (M-1)/n] so the n-rank
//      sum fits the lane (M = 128 for int8); e = acc - q / alpha.
//   2. all-reduce(sum) of q in the Lane type.
//   3. decode pass [reads sums; writes g]: g = sum / (n alpha).
//   4. r <- beta r + (1 - beta) ||g||^2, from the summed integers (identical
//      on every rank, so alpha stays identical: checked bit for bit).
// The first step has no r yet: it takes the largest ||acc||^2 over the ranks
// (one scalar all-reduce(max), on that step only). Wire: d x sizeof(Lane).
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/compressors/quantize/common.hpp>
#include <gradcomp/compressors/quantize/qsgd.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/lane_sum.hpp>
#include <gradcomp/detail/mean_codec.hpp>

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradcomp {
namespace detail {

/// alpha from r, and the clamp of one rank's integers.
struct intsgd_scale {
  float alpha0, dimension, ranks;
  float low, high;  // -floor(M / n), floor((M - 1) / n)
  GRADCOMP_HOST_DEVICE float alpha(float r) const {
    return alpha0 * sqrtf(dimension) / (sqrtf(2.0f * ranks) * sqrtf(r + 1e-16f));
  }
};

template <class Lane, class EF>
struct intsgd_encode {
  float const* gradient;
  EF ef;
  Lane* codes;
  float const* state;  // [0] = r
  intsgd_scale p;
  float alpha = 0, inverse = 0;
  GRADCOMP_HOST_DEVICE intsgd_encode bind() const {
    intsgd_encode b = *this;
    b.alpha = p.alpha(state[0]);
    b.inverse = 1.0f / b.alpha;
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i, float u) const {
    float const acc = ef.accumulate(i, gradient[i]);
    float x = acc * alpha;
    x = x < p.low ? p.low : x;
    x = x > p.high ? p.high : x;
    std::int32_t const q = signed_stochastic_round(x, u);
    ef.update(i, minus_product(acc, q, inverse), mean_codec<float>::fits(acc));
    codes[i] = static_cast<Lane>(q);
  }
  // Deterministic rounding: to nearest (u = 1/2: up when the fraction exceeds it).
  GRADCOMP_HOST_DEVICE void element(std::size_t i) const { element(i, 0.5f); }
};

template <class Lane>
struct intsgd_decode {
  Lane const* summed;
  float* gradient;
  float const* state;
  intsgd_scale p;
  float mean = 0;  // 1 / (n alpha)
  GRADCOMP_HOST_DEVICE intsgd_decode bind() const {
    intsgd_decode b = *this;
    b.mean = 1.0f / (p.ranks * p.alpha(state[0]));
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i) const { gradient[i] = static_cast<float>(summed[i]) * mean; }
};

template <class Lane>
struct lane_value {
  Lane const* values;
  GRADCOMP_HOST_DEVICE float operator()(std::size_t i) const { return static_cast<float>(values[i]); }
};

struct intsgd_update {  // r <- beta r + (1 - beta) ||g||^2, kept only if finite
  float* state;         // [0] = r, [1] = Σ sum^2 of this step
  intsgd_scale p;
  float beta;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    float const mean = 1.0f / (p.ranks * p.alpha(state[0]));
    float const next = fused(beta, state[0], (1.0f - beta) * (state[1] * mean * mean));
    state[0] = next <= 3.40282347e38f ? next : state[0];
  }
};

}  // namespace detail

/// IntSGD (see the top of this header).
///
/// \tparam Lane the summation lane: std::int8_t or std::int32_t.
template <class Lane = std::int8_t>
struct intsgd {
  static_assert(detail::is_signed_code_lane<Lane>, "intsgd sums its integers in std::int8_t or std::int32_t lanes");

  /// Name for messages and reports.
  static constexpr std::string_view name = "intsgd";
  /// Integers of every rank add element by element.
  static constexpr bool summable_payload = true;

  float alpha0 = 1.0f;     ///< Scale of alpha.
  float beta = 0.9f;       ///< Decay of the running mean r of ||g||^2.
  bool stochastic = true;  ///< Unbiased random rounding; false: to nearest.
  std::uint64_t seed = 0;  ///< Per-rank rounding noise derives from it.

  /// M: one past the largest lane value (int32 lanes: capped at 2^24, where
  /// floats still hold every integer).
  static constexpr std::int64_t lane_span() { return std::is_same_v<Lane, std::int8_t> ? 128 : std::int64_t{1} << 24; }

  /// Throws invalid_argument for alpha0 <= 0, beta outside [0, 1), or n ranks
  /// that leave no integer room per rank in the lane.
  void validate(bucket_layout const&, int ranks) const {
    GRADCOMP_EXPECTS(alpha0 > 0.0f, "intsgd: alpha0 must be positive");
    GRADCOMP_EXPECTS(beta >= 0.0f && beta < 1.0f, "intsgd: beta must be in [0, 1)");
    std::int64_t const high = (lane_span() - 1) / ranks;
    GRADCOMP_EXPECTS(high >= 1, "intsgd: " + std::to_string(ranks) + " ranks leave no room in the " +
                                    std::string(name_of(dtype_of_v<Lane>)) + " lane (" +
                                    std::to_string(8 * sizeof(Lane)) + " bits): each rank's integers must stay in [" +
                                    std::to_string(-(lane_span() / ranks)) + ", " + std::to_string(high) +
                                    "] for the sum to fit; use a wider lane");
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), std::bit_cast<std::uint32_t>(alpha0));
    h = detail::hash_combine(h, std::bit_cast<std::uint32_t>(beta));
    h = detail::hash_combine(h, stochastic);
    h = detail::hash_combine(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces. `state` persists from step to step.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;
    span<float, Memory> state;  ///< [0] = r (kept), [1] = this step's Σ sum^2.
    span<float, Memory> tiles;
    span<Lane, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.state = w.template take<float>(2);
    ws.tiles = w.template take<float>(detail::norm_tiles(layout.size()));
    ws.codes = w.template take<Lane>(layout.size());
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The integers (the first step adds one float).
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(Lane), ranks);
  }

  /// The scale parameters on n ranks for a bucket of d.
  detail::intsgd_scale scale_for(std::size_t d, int ranks) const {
    return {alpha0, static_cast<float>(d), static_cast<float>(ranks), static_cast<float>(-(lane_span() / ranks)),
            static_cast<float>((lane_span() - 1) / ranks)};
  }

  /// One step: gradient <- the mean over ranks of their integers / alpha.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    detail::intsgd_scale const p = scale_for(d, ctx.ranks());
    bool const first = ctx.step() == 0;

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    if (first)  // r_0 = ||acc||^2 (then the largest over the ranks); also counts bad values
      detail::bucket_sum_of_squares(space, d, detail::accumulated<EF>{gradient.data(), ef}, ws.tiles.data(),
                                    ws.state.data(), ws.counters.data());
    else
      parallel_count(space, d, detail::acc_not_finite<EF>{gradient.data(), ef}, ws.counters.data());
    ctx.agree_all_finite(ws.counters.data(), "NaN or infinite");
    if (first) ctx.all_reduce(ws.state.subspan(0, 1), reduce_op::max);

    detail::intsgd_encode<Lane, EF> const encode{gradient.data(), ef, ws.codes.data(), ws.state.data(), p};
    if (stochastic)
      detail::for_each_with_noise(
          space, d, random_stream(seed, static_cast<std::uint32_t>(ctx.step()), static_cast<std::uint32_t>(ctx.rank())),
          encode);
    else
      detail::for_each_bound(space, d, encode);
    ctx.aggregate(ws.codes, ws.scratch);
    detail::for_each_bound(space, d, detail::intsgd_decode<Lane>{ws.codes.data(), gradient.data(), ws.state.data(), p});
    detail::bucket_sum_of_squares(space, d, detail::lane_value<Lane>{ws.codes.data()}, ws.tiles.data(),
                                  ws.state.data() + 1, ws.counters.data());
    parallel_for(space, 1, detail::intsgd_update{ws.state.data(), p, beta});
  }
};

static_assert(compressor<intsgd<>>);

}  // namespace gradcomp
