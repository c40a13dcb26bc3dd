// GlobalRandK-MaxNorm (Vineeth S, arXiv 2109.12497): K coordinates drawn by
// a random permutation from a stream every rank shares (the same coordinates
// on every rank, new every step), QSGD-MaxNorm on them, zeros elsewhere;
// error feedback, where asked for, keeps what was not sent (off by default:
// at the default k and bits the QSGD stage is no contraction, error_bound).
//
// Per step: check pass [reads g, e]; gather the K coordinates' acc; their
// norm and its all-reduce(max); encode [K codes, K residuals]; all-reduce(sum)
// of the codes; output pass [reads g, e; writes g = 0, e = acc]; decode the K
// coordinates [writes g, e at them].
// Wire: K x sizeof(Lane) + 8. Carries a step whose drawn coordinates' norm
// (the largest over ranks) is up to 1.7e38, as QSGD-MaxNorm does.
#pragma once

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/quantize.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/random.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

template <class EF, class G>
struct randk_gather {                        // coordinate j of the step and its acc
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  random_permutation pick;
  G const* gradient;
  EF ef;
  struct bound {
    random_permutation pick;
    G const* gradient;
    typename EF::bound ef;
    GRADCOMP_HOST_DEVICE void operator()(std::size_t j, std::uint64_t& index, float& value) const {
      std::uint64_t const i = pick(j);
      index = i;
      value = ef.accumulate(i, load_gradient(gradient, i));
    }
  };
  GRADCOMP_HOST_DEVICE bound bind() const { return {pick, gradient, ef.bind()}; }
};

struct gathered_value {  // (a bad one was counted by the check pass; the norm leaves it out)
  GRADCOMP_HOST_DEVICE float operator()(std::size_t, float v) const { return v; }
};

template <class Lane>
struct randk_encode {  // value: acc in, acc - own decode out
  double const* squared_norm;
  double levels;
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE randk_encode bind() const {
    return {squared_norm, levels, qsgd_scale::of(*squared_norm, levels, 1)};
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float acc, float u, Lane& code, float& residual) const {
    std::int32_t const c = k.code(acc, u, static_cast<float>(levels));
    code = static_cast<Lane>(c);
    residual = k.residual(acc, c);
  }
};

struct randk_unsent {  // every coordinate: output 0, residual acc (the drawn ones are overwritten next)
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float g, float e, float& out, float& e_next) const {
    e_next = g + e;
    out = 0.0f;
  }
};

template <class Lane, class EF, class G>
struct randk_decode {                        // the drawn coordinates: their mean, their residual
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  G* gradient;
  EF ef;
  double const* squared_norm;
  double levels, ranks;
  struct bound {
    G* gradient;
    typename EF::bound ef;
    qsgd_scale k;
    GRADCOMP_HOST_DEVICE void operator()(std::size_t, std::uint64_t i, Lane sum, float residual) const {
      store_gradient(gradient, i, k.mean(static_cast<double>(sum)));
      ef.update(i, residual);
    }
  };
  GRADCOMP_HOST_DEVICE bound bind() const {
    return {gradient, ef.bind(), qsgd_scale::of(*squared_norm, levels, ranks)};
  }
};

}  // namespace detail

/// GlobalRandK-MaxNorm: QSGD-MaxNorm on K coordinates that every rank draws
/// alike (see the top of this header).
template <class Lane = std::int8_t>
struct global_randk {
  static_assert(detail::is_signed_code_lane<Lane>, "global_randk sums its codes in std::int8_t or std::int32_t lanes");

  /// Name for messages and reports.
  static constexpr std::string_view name = "global_randk";
  /// The same coordinates on every rank: codes add element by element.
  static constexpr bool summable_payload = true;
  /// Shards anywhere.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// Any element may start a shard.
  std::size_t shard_alignment() const { return 1; }

  /// Spec: k, bits, lane. Automatic lane: int8 while bits <= 7 and
  /// n x (2^bits - 1) fits in 127, else int32.
  static constexpr bool integer_lane = true;
  /// Its QSGD stage is no contraction at the default k and bits (see
  /// error_bound), so no error feedback unless asked for.
  static constexpr bool error_feedback_by_default = false;
  /// make(the compressor the spec sets, in its lane for `ranks` ranks).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int ranks, Make&& make) {
    auto const narrow = with_parameters<global_randk<std::int8_t>>(s);
    if (detail::narrow_lane(s.lane, detail::code_bits_fit<std::int8_t>(ranks, narrow.bits))) return make(narrow);
    return make(with_parameters<global_randk<std::int32_t>>(s));
  }

  std::size_t k = 10000;                ///< Coordinates sent per step (an empty bucket sends none).
  int bits = 4;                         ///< s = 2^bits - 1 levels per sign.
  std::optional<std::uint64_t> seed{};  ///< Seeds the coordinates and the noise; unset: the bucket's own.

  /// What a spec sets (pipeline/registration.hpp).
  static constexpr auto parameters = std::tuple{
      parameter{"bits", &global_randk::bits, "s = 2^bits - 1 levels per sign", "1 to 7 (int8), 1 to 24 (int32)"},
      parameter{"k", &global_randk::k, "coordinates every rank sends per step", "1 to the bucket's size"}};

  /// s.
  std::int64_t levels() const { return (std::int64_t{1} << bits) - 1; }
  /// Coordinates sent from a bucket of d (none from an empty one).
  std::size_t sent(std::size_t d) const { return d == 0 ? 0 : k; }

  /// E||Q(x) - x||^2 / ||x||^2 at most for the K quantized coordinates:
  /// min(K / s^2, sqrt(K) / s) (6.7 at the default k = 10000, 4 bits; the
  /// coordinates not sent are kept whole). The allreducer refuses error
  /// feedback where it reaches 1: with feedback, choose k < s^2 (225 at 4
  /// bits) or more bits.
  double error_bound(bucket_layout const& layout) const {
    return detail::qsgd_error_bound(sent(layout.size()), static_cast<double>(levels()));
  }

  /// Throws invalid_argument for k outside 1..d (any k is fine for an empty
  /// bucket), bits outside the lane, or n ranks whose summed codes could
  /// overflow the lane.
  void validate(bucket_layout const& layout, int ranks) const {
    GRADCOMP_EXPECTS(k >= 1, "global_randk: k=0 is outside 1..the bucket's size");
    GRADCOMP_EXPECTS(layout.size() == 0 || k <= layout.size(), "global_randk: k=" + std::to_string(k) +
                                                                   " is outside 1..the bucket's size, " +
                                                                   std::to_string(layout.size()) + " elements");
    detail::expect_code_bits<Lane>("global_randk", ranks, bits);
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), k);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(bits));
    h = detail::hash_optional(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<double, Memory> squared_norm;
    span<std::byte, Memory> reduce;
    span<std::uint64_t, Memory> indices;  ///< The step's coordinates.
    span<float, Memory> values;           ///< Their acc, then their residual.
    span<Lane, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    std::size_t const count = sent(layout.size());
    workspace<Memory> ws;
    ws.squared_norm = w.template take<double>(1);
    ws.reduce = w.template take<std::byte>(segmented_reduce_scratch_bytes(count, count));
    ws.indices = w.template take<std::uint64_t>(count);
    ws.values = w.template take<float>(count);
    ws.codes = w.template take<Lane>(count);
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The norm and K codes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return layout.size() == 0 ? 0 : sizeof(double) + detail::aggregated_wire_bytes<Aggregator>(k * sizeof(Lane), ranks);
  }

  /// One step: the drawn coordinates <- their rank-mean decoded codes, the
  /// rest <- 0.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    double const s = static_cast<double>(levels());
    random_permutation const pick =
        random_permutation::make(d, ctx.random(seed, random_purpose::coordinates, random_stream::shared));

    transform(space, d, inputs(detail::gradient_stream(gradient), ef.previous()), outputs(), detail::count_nonfinite{},
              {.count = ctx.bad_count()});
    transform(space, k, inputs(), outputs(ws.indices, ws.values),
              detail::randk_gather<EF, G>{pick, gradient.data(), ef});
    segmented_reduce<reduction::sum_of_squares>(space, k, k, inputs(ws.values), detail::gathered_value{},
                                                detail::store_total_at{ws.squared_norm.data()}, {.scratch = ws.reduce});
    detail::count_norms_beyond(ctx, span<double const, typename Context::memory>(ws.squared_norm),
                               detail::qsgd_carried_norm);
    ctx.agree_all_finite(
        "NaN or infinite, or made the drawn coordinates' norm exceed the 1.7e38 GlobalRandK carries (counted once)");
    ctx.all_reduce(ws.squared_norm, reduce_op::max);
    transform(space, k, inputs(ws.values, rounding_noise{ctx.random(seed, random_purpose::rounding, ctx.own_lane())}),
              outputs(ws.codes, ws.values), detail::randk_encode<Lane>{ws.squared_norm.data(), s});
    ctx.aggregate(ws.codes, ws.scratch);
    gate const when = ctx.output_gate();
    transform(space, d, inputs(detail::gradient_stream(gradient), ef.previous()),
              outputs(detail::gradient_stream(gradient), ef.next()), detail::randk_unsent{}, {.when = when});
    transform(space, k, inputs(ws.indices, ws.codes, ws.values), outputs(),
              detail::randk_decode<Lane, EF, G>{gradient.data(), ef, ws.squared_norm.data(), s,
                                                static_cast<double>(ctx.ranks())},
              {.when = when});
  }
};

static_assert(compressor<global_randk<>>);

}  // namespace gradcomp
