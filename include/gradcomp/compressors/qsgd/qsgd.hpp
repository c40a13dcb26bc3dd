// QSGD-MaxNorm (Vineeth S, "Quantization for Distributed Optimization",
// arXiv 2109.12497): an all-reduce compatible stochastic quantizer whose
// integer codes every rank sums in a small signed lane.
//
// Per step, with acc = g + e and s = 2^bits - 1:
//   1. norm pass [reads g, e]: ||acc||^2 (double); one all-reduce(max) of the
//      scalar gives every rank the same norm (the largest).
//   2. encode pass [reads g, e; writes codes, e]: code = sign(acc) x
//      (floor(|acc| s / norm) + Bernoulli(fraction)) (unbiased, per-rank
//      noise); e = acc - code x norm / s (the rank's own decode).
//   3. all-reduce(sum) of the codes in the Lane type.
//   4. decode pass [reads codes; writes g]: g = sum x norm / (s n).
// Wire: d x sizeof(Lane) + 8. n x s must fit the Lane (checked). Carries a
// bucket whose norm (the largest over ranks) is up to 1.7e38, half of
// float's largest value: every rank refuses a step beyond it.
// Unbiased, but its variance is about sqrt(d) / s ||acc||^2: at few bits on
// a large bucket it exceeds the signal, and error feedback (which needs an
// error smaller than the signal) then diverges. Use it without error
// feedback, or with more bits (or the multi-scale variant).
#pragma once

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/quantize.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

template <class Lane>
struct qsgd_encode {
  double const* squared_norm;  // agreed
  double levels;               // s
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE qsgd_encode bind() const {
    return {squared_norm, levels, qsgd_scale::of(*squared_norm, levels, 1)};
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float g, float e, float u, Lane& code, float& e_next) const {
    float const acc = g + e;
    std::int32_t const c =
        k.code(acc, u, static_cast<float>(levels));  // |acc| <= norm, but a rounded norm can fall a hair short
    code = static_cast<Lane>(c);
    e_next = k.residual(acc, c);
  }
};

template <class Lane>
struct qsgd_decode {
  double const* squared_norm;
  double levels, ranks;
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE qsgd_decode bind() const {
    return {squared_norm, levels, ranks, qsgd_scale::of(*squared_norm, levels, ranks)};
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, Lane sum, float& g) const { g = k.mean(static_cast<double>(sum)); }
};

}  // namespace detail

/// QSGD-MaxNorm (see the top of this header).
///
/// \tparam Lane the summation lane: std::int8_t (bits <= 7) or std::int32_t.
template <class Lane = std::int8_t>
struct qsgd {
  static_assert(detail::is_signed_code_lane<Lane>, "qsgd sums its codes in std::int8_t or std::int32_t lanes");

  /// Name for messages and reports.
  static constexpr std::string_view name = "qsgd";
  /// Integer codes of every rank add element by element.
  static constexpr bool summable_payload = true;
  /// Shards anywhere.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// Any element may start a shard.
  std::size_t shard_alignment() const { return 1; }

  /// Spec: bits, lane. Automatic lane: int8 while bits <= 7 and
  /// n x (2^bits - 1) fits in 127, else int32. Unbiased, so no error
  /// feedback unless asked for.
  static constexpr bool integer_lane = true;
  static constexpr bool error_feedback_by_default = false;
  /// make(the compressor the spec sets, in its lane for `ranks` ranks).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int ranks, Make&& make) {
    auto const narrow = with_parameters<qsgd<std::int8_t>>(s);
    if (detail::narrow_lane(s.lane, detail::code_bits_fit<std::int8_t>(ranks, narrow.bits))) return make(narrow);
    return make(with_parameters<qsgd<std::int32_t>>(s));
  }

  int bits = 4;                         ///< s = 2^bits - 1 levels per sign.
  std::optional<std::uint64_t> seed{};  ///< Seeds the rounding noise; unset: the bucket's own.

  /// What a spec sets (pipeline/registration.hpp).
  static constexpr auto parameters =
      std::tuple{parameter{"bits", &qsgd::bits, "s = 2^bits - 1 levels per sign", "1 to 7 (int8), 1 to 24 (int32)"}};

  /// s.
  std::int64_t levels() const { return (std::int64_t{1} << bits) - 1; }

  /// E||Q(x) - x||^2 / ||x||^2 at most, on this bucket: min(d / s^2,
  /// sqrt(d) / s). The allreducer refuses error feedback where it reaches 1
  /// (4 bits: buckets of 225 elements or more).
  double error_bound(bucket_layout const& layout) const {
    return detail::qsgd_error_bound(layout.size(), static_cast<double>(levels()));
  }

  /// Throws invalid_argument for bits outside 1..(7 for int8, 24 for int32)
  /// or n ranks whose summed codes could overflow the lane.
  void validate(bucket_layout const&, int ranks) const { detail::expect_code_bits<Lane>("qsgd", ranks, bits); }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), static_cast<std::uint64_t>(bits));
    h = detail::hash_optional(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<double, Memory> squared_norm;  ///< ||acc||^2; then the max over ranks.
    span<std::byte, Memory> reduce;     ///< The norm's scratch.
    span<Lane, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.squared_norm = w.template take<double>(1);
    ws.reduce = w.template take<std::byte>(segmented_reduce_scratch_bytes(layout.size(), layout.size()));
    ws.codes = w.template take<Lane>(layout.size());
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The norm and the codes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return sizeof(double) + detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(Lane), ranks);
  }

  /// One step: gradient <- the mean over ranks of their decoded codes.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    auto const ws = ctx.carve(*this);
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    double const s = static_cast<double>(levels());

    detail::agree_largest_squared_norm(ctx, d, inputs(detail::gradient_stream(gradient), ef.previous()),
                                       ws.squared_norm, ws.reduce, detail::qsgd_carried_norm,
                                       "NaN or infinite, or made the bucket's norm exceed the 1.7e38 QSGD carries "
                                       "(counted once)");
    transform(ctx.space(), d,
              inputs(detail::gradient_stream(gradient), ef.previous(),
                     rounding_noise{ctx.random(seed, random_purpose::rounding, ctx.own_lane())}),
              outputs(ws.codes, ef.next()), detail::qsgd_encode<Lane>{ws.squared_norm.data(), s});
    ctx.aggregate_elementwise(ws.codes, ws.scratch);
    auto const [first, count] = ctx.output_range();
    transform(ctx.space(), count, inputs(ws.codes.subspan(first, count)),
              outputs(detail::gradient_stream(gradient.subspan(first, count))),
              detail::qsgd_decode<Lane>{ws.squared_norm.data(), s, static_cast<double>(ctx.ranks())},
              {.when = ctx.output_gate()});
  }
};

static_assert(compressor<qsgd<>>);

}  // namespace gradcomp
