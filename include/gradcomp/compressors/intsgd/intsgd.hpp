// IntSGD (Mishchenko et al., "IntSGD: Adaptive Floatless Compression of
// Stochastic Gradients", ICLR 2022): integers summed by all-reduce, scaled by
// an alpha that every rank computes alike from values all ranks already
// share, so the scale costs no communication.
//
// Per step, with acc = g + e and r the running mean of ||output||^2:
//   alpha = alpha0 sqrt(d) / (sqrt(2n) sqrt(r))
// (The paper adds 1e-16 to r against a zero r; that makes the scale depend
// on the gradients' magnitude: below ||g||^2 = 1e-16 nothing would be sent.
// gradcomp guards r = 0 alone, where every code is zero anyway.)
//   1. encode pass [reads g, e; writes q, e]: q = round(alpha acc) (stochastic
//      and unbiased, or to nearest), clamped to [-M/n, (M-1)/n] so the n-rank
//      sum fits the lane (M = 128 for int8); e = acc - q / alpha; it counts
//      bad values too (the first step: a norm pass counts, then it encodes);
//   2. all-reduce(sum) of q in the Lane type.
//   3. decode pass [reads sums; writes g]: g = sum / (n alpha).
//   4. r <- beta r + (1 - beta) ||g||^2, from the summed integers in
//      segmented_reduce's canonical order (identical on every rank, so alpha
//      stays identical: checked bit for bit).
// The first step has no r yet: it takes the largest ||acc||^2 over the ranks
// (one 8-byte all-reduce(max), on that step only). r and alpha are doubles
// (a squared norm of large gradients is out of float's range). Wire:
// d x sizeof(Lane). Carries steps whose r keeps M / (n alpha), the largest
// value an output or a residual's unit can take, within 1.7e38 (half of
// float's largest value): every rank refuses a step beyond it.
#pragma once

#include <gradcomp/algorithm/segmented_reduce.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/quantize.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

/// The kept state: [0] r, [1] the first step's agreed ||acc||^2, [2] this
/// step's sum of squared integer sums.
enum intsgd_word : std::size_t { intsgd_r = 0, intsgd_first = 1, intsgd_sums = 2, intsgd_words = 3 };

/// alpha from r, and the clamp of one rank's integers.
struct intsgd_scale {
  double alpha0, dimension, ranks;
  double low, high;  // -floor(M / n), floor((M - 1) / n)
  GRADCOMP_HOST_DEVICE double alpha(double r) const {
    return alpha0 * sqrt(dimension) / (sqrt(2.0 * ranks) * sqrt(r > 0.0 ? r : 4.9406564584124654e-324));
  }
};

/// Whether r makes alpha too small to decode finitely: one rank's largest
/// integer (and n ranks' largest mean) over alpha, M / (n alpha), must stay
/// within half of float's largest value (room for rounding), or the output
/// and the residual could be infinite.
struct intsgd_scale_beyond {
  static constexpr bool vectorizes = false;  // (one element, and it calls sqrt)
  intsgd_scale p;
  double lane_span;  // M
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, double r) const {
    return !(lane_span / (p.ranks * p.alpha(r)) <= carried_magnitude);
  }
};

template <class Lane>
struct intsgd_encode {
  double const* r;  // the state word alpha derives from this step
  intsgd_scale p;
  float alpha = 0;  // (saturated at float's largest: a bucket so small only sends zeros)
  double inverse = 0;
  GRADCOMP_HOST_DEVICE intsgd_encode bind() const {
    intsgd_encode b = *this;
    double const alpha = p.alpha(*r);
    b.alpha = saturated(alpha);
    b.inverse = float_precision(1.0 / alpha);  // (the residual's product is then exact)
    return b;
  }
  // True for a bad acc (NaN or infinite): the pass that encodes also counts.
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, float g, float e, float u, Lane& code, float& e_next) const {
    float const acc = g + e;
    float const x = clamp_symmetric(finite_or_zero(acc) * alpha, static_cast<float>(p.high));
    std::int32_t const q = signed_stochastic_round(x < static_cast<float>(p.low) ? static_cast<float>(p.low) : x, u);
    code = static_cast<Lane>(q);
    e_next = static_cast<float>(static_cast<double>(acc) - static_cast<double>(q) * inverse);
    return !is_finite(acc);
  }
  // Deterministic rounding: to nearest (u = 1/2: up when the fraction exceeds it).
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i, float g, float e, Lane& code, float& e_next) const {
    return (*this)(i, g, e, 0.5f, code, e_next);
  }
};

template <class Lane>
struct intsgd_decode {
  double const* r;
  intsgd_scale p;
  double mean = 0;  // 1 / (n alpha)
  GRADCOMP_HOST_DEVICE intsgd_decode bind() const {
    intsgd_decode b = *this;
    b.mean = 1.0 / (p.ranks * p.alpha(*r));
    return b;
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, Lane sum, float& g) const {
    g = static_cast<float>(static_cast<double>(sum) * mean);
  }
};

template <class Lane>
struct lane_value {
  GRADCOMP_HOST_DEVICE float operator()(std::size_t, Lane v) const { return static_cast<float>(v); }
};

struct intsgd_update {                       // r <- beta r + (1 - beta) ||g||^2, kept only if finite
  static constexpr bool vectorizes = false;  // (one element, and it calls sqrt)
  double* state;
  bool first;
  intsgd_scale p;
  double beta;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    double const r = state[first ? intsgd_first : intsgd_r];
    double const mean = 1.0 / (p.ranks * p.alpha(r));
    double const next = fused(beta, r, (1.0 - beta) * (state[intsgd_sums] * mean * mean));  // the same bits everywhere
    state[intsgd_r] = next <= 1.79769313486231570e308 ? next : r;
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
  /// Shards anywhere.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// Any element may start a shard.
  std::size_t shard_alignment() const { return 1; }

  /// Spec: lane. Automatic lane: int8 while each of n ranks keeps at least
  /// the integers -7..7 (n <= 18), else int32.
  static constexpr std::tuple<> parameters{};  // (its lane only)
  static constexpr bool integer_lane = true;
  static constexpr bool error_feedback_by_default = true;
  /// make(the compressor in its lane for `ranks` ranks).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int ranks, Make&& make) {
    if (detail::narrow_lane(s.lane, ranks <= 18)) return make(intsgd<std::int8_t>{});
    return make(intsgd<std::int32_t>{});
  }

  float alpha0 = 1.0f;                  ///< Scale of alpha.
  float beta = 0.9f;                    ///< Decay of the running mean r of ||g||^2.
  bool stochastic = true;               ///< Unbiased random rounding; false: to nearest.
  std::optional<std::uint64_t> seed{};  ///< Seeds the rounding noise; unset: the bucket's own.

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
    h = detail::hash_optional(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// The workspace's first bytes, kept across steps: `state`.
  std::size_t state_bytes(bucket_layout const&, int) const { return detail::intsgd_words * sizeof(double); }
  /// Why checkpointed state cannot be IntSGD's (null where it can): its
  /// norms are finite and not negative.
  char const* state_problem(span<std::byte const> state) const {
    for (std::size_t w = 0; w < detail::intsgd_words && (w + 1) * sizeof(double) <= state.size(); ++w) {
      double v;
      std::memcpy(&v, state.data() + w * sizeof(double), sizeof v);
      if (!(v >= 0.0 && v <= std::numeric_limits<double>::max()))
        return "IntSGD's running norm is negative, NaN or infinite";
    }
    return nullptr;
  }

  /// Workspace pieces. `state` persists from step to step.
  template <class Memory>
  struct workspace {
    span<double, Memory> state;  ///< See detail::intsgd_word.
    span<std::byte, Memory> reduce;
    span<Lane, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.state = w.template take<double>(detail::intsgd_words);
    ws.reduce = w.template take<std::byte>(segmented_reduce_scratch_bytes(layout.size(), layout.size()));
    ws.codes = w.template take<Lane>(layout.size());
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The integers (the first step adds 8 bytes).
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(Lane), ranks);
  }

  /// The scale parameters on n ranks for a bucket of d.
  detail::intsgd_scale scale_for(std::size_t d, int ranks) const {
    auto const low = -(lane_span() / ranks), high = (lane_span() - 1) / ranks;  // integer bounds: rounded to zero
    return {alpha0, static_cast<double>(d), static_cast<double>(ranks), static_cast<double>(low),
            static_cast<double>(high)};
  }

  /// One step: gradient <- the mean over ranks of their integers / alpha.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    detail::intsgd_scale const p = scale_for(d, ctx.ranks());
    bool const first = ctx.step() == 0;
    double* const state = ws.state.data();
    std::size_t const r_word = first ? detail::intsgd_first : detail::intsgd_r;
    double const* const r = state + r_word;

    // The encode pass: from the committed r, so it counts this rank's bad
    // values on the way (its codes and residual side are the step's own until
    // the commit); the first step's waits for r_0, the agreed norm.
    auto encode = [&](transform_options const& options) {
      if (stochastic)
        transform(space, d,
                  inputs(detail::gradient_stream(gradient), ef.previous(),
                         rounding_noise{ctx.random(seed, random_purpose::rounding, ctx.own_lane())}),
                  outputs(ws.codes, ef.next()), detail::intsgd_encode<Lane>{r, p}, options);
      else
        transform(space, d, inputs(detail::gradient_stream(gradient), ef.previous()), outputs(ws.codes, ef.next()),
                  detail::intsgd_encode<Lane>{r, p}, options);
    };
    if (first)  // r_0 = ||acc||^2, the largest over the ranks; also counts bad values
      segmented_reduce<reduction::sum_of_squares>(
          space, d, d, inputs(detail::gradient_stream(gradient), ef.previous()), detail::accumulated{},
          detail::store_total_at{state + detail::intsgd_first}, {.scratch = ws.reduce, .count = ctx.bad_count()});
    else
      encode({.count = ctx.bad_count()});
    // r beyond the carried range: counted on every rank (the first step's
    // local norm is beyond it exactly when the agreed largest one is).
    transform(space, 1, inputs(span<double const, typename Context::memory>(ws.state.subspan(r_word, 1))), outputs(),
              detail::intsgd_scale_beyond{p, static_cast<double>(lane_span())}, {.count = ctx.bad_count()});
    ctx.agree_all_finite(
        "NaN or infinite, or left IntSGD's running norm beyond the carried range (M / (n alpha) above 1.7e38; "
        "counted once per rank)");
    if (first) {
      ctx.all_reduce(ws.state.subspan(detail::intsgd_first, 1), reduce_op::max);
      encode({});
    }
    ctx.aggregate(ws.codes, ws.scratch);
    transform(space, d, inputs(ws.codes), outputs(detail::gradient_stream(gradient)), detail::intsgd_decode<Lane>{r, p},
              {.when = ctx.output_gate()});
    segmented_reduce<reduction::sum_of_squares>(space, d, d, inputs(ws.codes), detail::lane_value<Lane>{},
                                                detail::store_total_at{state + detail::intsgd_sums},
                                                {.scratch = ws.reduce});
    transform(space, 1, inputs(), outputs(), detail::intsgd_update{state, first, p, beta}, {.when = ctx.state_gate()});
  }
};

static_assert(compressor<intsgd<>>);

}  // namespace gradcomp
