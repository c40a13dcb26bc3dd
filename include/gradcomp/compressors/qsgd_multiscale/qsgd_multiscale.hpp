// Two-scale (multi-scale) QSGD-MaxNorm (Vineeth S, arXiv 2109.12497): QSGD
// with several resolutions s_j (default 6 and 10 bits) and int8 codes. Each
// rank proposes, per coordinate, the finest scale whose code cannot exceed
// its share of the int8 lane (floor(127 / n)); one all-reduce(min) of the
// scale indices (uint8) makes the choice common (a coarser scale only
// shrinks a code, so every rank's code still fits); codes are encoded and
// decoded at the agreed scale. A coordinate too large even for the coarsest
// scale saturates at the lane share; error feedback carries the clipped part.
//
// Per step: norm pass [reads g, e] and its all-reduce(max); propose pass
// [reads g, e; writes index]; all-reduce(min) of the indices; encode pass
// [reads g, e, index; writes codes, e]; all-reduce(sum) of the codes; decode
// pass [reads codes, index; writes g].
// Wire: d x (1 + 1) + 8 bytes, a 16-bit baseline's, which is what it must be
// measured against.
//
// The units that turn codes back into values are doubles (qsgd_scale's). On
// the host, a step whose units are all floats (the bucket's norm is not near
// float's smallest values) applies them in float, the residual with a fused
// multiply-add where the target has one: the same bits without converting
// every element to double and back (multiscale_encode).
#pragma once

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/quantize.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

/// The multi-scale codec's scales, finest last.
inline constexpr int max_scales = 4;
struct multiscale_scales {
  int count;
  double levels[max_scales];  // s_j = 2^bits_j - 1, ascending
  float share;                // the largest |code| of one rank: floor(127 / n)
  double ranks;
};

/// Four values, one per scale, as separate members and picked by selects: an
/// array indexed at run time would be a memory load (nvcc turns even a
/// select chain over an array back into one), which keeps element loops from
/// vectorizing and puts a GPU thread's copy in local memory.
template <class T>
struct per_scale {
  T v0, v1, v2, v3;
  GRADCOMP_HOST_DEVICE T operator[](unsigned j) const {
    T x = v0;
    x = j == 1 ? v1 : x;
    x = j == 2 ? v2 : x;
    return j == 3 ? v3 : x;
  }
  template <class U>  // (a double unit to float: exact where the step takes that path)
  GRADCOMP_HOST_DEVICE static per_scale of(U const (&a)[max_scales]) {
    return {static_cast<T>(a[0]), static_cast<T>(a[1]), static_cast<T>(a[2]), static_cast<T>(a[3])};
  }
};

/// The step's per-scale factors, from the agreed squared norm (qsgd_scale's).
struct multiscale_factors {
  float scale[max_scales];
  double unit[max_scales], mean_unit[max_scales];
  bool float_units;  ///< Every unit and mean unit in use is a float.
  GRADCOMP_HOST_DEVICE static multiscale_factors of(multiscale_scales const& m, double squared_norm) {
    multiscale_factors f{};
    f.float_units = true;
    for (int j = 0; j < max_scales; ++j) {
      qsgd_scale const k = qsgd_scale::of(squared_norm, j < m.count ? m.levels[j] : 1.0, m.ranks);
      f.scale[j] = k.scale;
      f.unit[j] = k.unit;
      f.mean_unit[j] = k.mean_unit;
      if (j < m.count) f.float_units = f.float_units && is_float(k.unit) && is_float(k.mean_unit);
    }
    return f;
  }
  GRADCOMP_HOST_DEVICE static bool is_float(double x) { return static_cast<double>(static_cast<float>(x)) == x; }
};

/// Whether the host's float residual (a fused multiply-add) is an
/// instruction here, not a library call.
#if defined(__FMA__)
inline constexpr bool host_fused_multiply_add = true;
#else
inline constexpr bool host_fused_multiply_add = false;
#endif

/// A step's units in double, or in float where multiscale_factors::
/// float_units holds.
template <bool FloatUnits>
using multiscale_unit = std::conditional_t<FloatUnits, float, double>;

/// Computes the step's factors once, from the agreed norm (one thread).
struct multiscale_bind {
  double const* squared_norm;
  multiscale_scales m;
  multiscale_factors* factors;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const { *factors = multiscale_factors::of(m, *squared_norm); }
};

struct multiscale_propose {  // the finest scale whose code fits this rank's share
  multiscale_factors const* factors;
  multiscale_scales m;
  per_scale<float> scale{};
  GRADCOMP_HOST_DEVICE multiscale_propose bind() const {
    multiscale_propose b = *this;
    b.scale = per_scale<float>::of(factors->scale);
    return b;
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float g, float e, std::uint8_t& index) const {
    float const acc = finite_or_zero(g + e);
    float const magnitude = acc < 0.0f ? -acc : acc;
    // Scales ascend, so the finest that fits is the count of finer ones that
    // fit (unused scales never fit).
    std::int32_t const finest = static_cast<std::int32_t>((1 < m.count) & (magnitude * scale.v1 <= m.share)) +
                                static_cast<std::int32_t>((2 < m.count) & (magnitude * scale.v2 <= m.share)) +
                                static_cast<std::int32_t>((3 < m.count) & (magnitude * scale.v3 <= m.share));
    index = static_cast<std::uint8_t>(finest);
  }
};

/// The residual acc - code x unit is exact in double (a code has at most 8
/// bits, a unit 24) and then rounded to float. In float, with units that
/// are floats, a fused multiply-add rounds the exact value once and gives
/// the same bits: where double's difference is not exact, one operand is
/// too small to move float's rounding (a code comes from acc, so a large
/// code times a unit is near acc, and a code of 1 times a unit is a float).
template <bool FloatUnits>
struct multiscale_encode {
  multiscale_factors const* factors;
  float share;
  per_scale<float> scale{};
  per_scale<multiscale_unit<FloatUnits>> unit{};
  GRADCOMP_HOST_DEVICE multiscale_encode bind() const {
    multiscale_encode b = *this;
    b.scale = per_scale<float>::of(factors->scale);
    b.unit = per_scale<multiscale_unit<FloatUnits>>::of(factors->unit);
    return b;
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float g, float e, std::uint8_t index, float u, std::int8_t& code,
                                       float& e_next) const {
    float const acc = g + e;
    qsgd_scale const k{scale[index], unit[index], 0.0};
    std::int32_t const c = k.code(acc, u, share);
    code = static_cast<std::int8_t>(c);
    if constexpr (FloatUnits)
      e_next = fmaf(-static_cast<float>(c), unit[index], acc);
    else
      e_next = k.residual(acc, c);
  }
};

/// sum x mean_unit, exact in double and then rounded; in float, with a
/// float mean unit, rounded once from the same exact product.
template <bool FloatUnits>
struct multiscale_decode {
  multiscale_factors const* factors;
  per_scale<multiscale_unit<FloatUnits>> mean_unit{};
  GRADCOMP_HOST_DEVICE multiscale_decode bind() const {
    multiscale_decode b = *this;
    b.mean_unit = per_scale<multiscale_unit<FloatUnits>>::of(factors->mean_unit);
    return b;
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, std::int8_t sum, std::uint8_t index, float& g) const {
    g = static_cast<float>(static_cast<multiscale_unit<FloatUnits>>(sum) * mean_unit[index]);
  }
};

}  // namespace detail

/// QSGD-MaxNorm with several resolutions and a per-coordinate scale agreed
/// by all ranks (see the top of this header). Codes sum in int8 lanes.
struct qsgd_multiscale {
  /// Name for messages and reports.
  static constexpr std::string_view name = "qsgd_multiscale";
  /// Integer codes at agreed scales add element by element.
  static constexpr bool summable_payload = true;
  /// Shards anywhere.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// Any element may start a shard.
  std::size_t shard_alignment() const { return 1; }

  /// Spec: no keys.
  static constexpr std::tuple<> parameters{};  // (its scales are set in code)
  static constexpr bool integer_lane = false;
  static constexpr bool error_feedback_by_default = true;
  /// make(the compressor).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const&, int, Make&& make) {
    return make(qsgd_multiscale{});
  }

  /// Bits of each scale, ascending (coarsest first); 0 ends the list.
  std::array<int, detail::max_scales> bits{6, 10, 0, 0};
  std::optional<std::uint64_t> seed{};  ///< Seeds the rounding noise; unset: the bucket's own.

  /// Scales in use.
  int scales() const {
    int count = 0;
    while (count < detail::max_scales && bits[count] != 0) ++count;
    return count;
  }

  /// The largest bucket norm a step carries on n ranks: a saturated code of
  /// the lane share at the coarsest scale decodes to share / s_0 x the norm,
  /// so 1.7e38 x min(1, s_0 / share) (1.7e38 with the default scales on two
  /// or more ranks). Every rank refuses a step beyond it.
  double carried_norm(int ranks) const {
    int const share_levels = 127 / ranks;  // each rank's whole share of an int8 lane
    double const coarsest = static_cast<double>((std::int64_t{1} << bits[0]) - 1), share = share_levels;
    return detail::qsgd_carried_norm * (coarsest < share ? coarsest / share : 1.0);
  }

  /// Throws invalid_argument for scales that are not ascending in 1..24, or
  /// more than 127 ranks (no int8 room for a single level per rank).
  void validate(bucket_layout const&, int ranks) const {
    int const count = scales();
    GRADCOMP_EXPECTS(count >= 1, "qsgd_multiscale: no scales given");
    for (int j = 0; j < count; ++j)
      GRADCOMP_EXPECTS(bits[j] >= 1 && bits[j] <= 24 && (j == 0 || bits[j] > bits[j - 1]),
                       "qsgd_multiscale: scale bits must ascend within 1..24 (scale " + std::to_string(j) + " has " +
                           std::to_string(bits[j]) + ")");
    detail::expect_lane_headroom<std::int8_t>("qsgd_multiscale", ranks, 1, bits[0]);
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash(name);
    for (int b : bits) h = detail::hash_combine(h, static_cast<std::uint64_t>(b));
    return detail::hash_optional(h, seed);
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<double, Memory> squared_norm;
    span<detail::multiscale_factors, Memory> factors;  ///< The step's, from the agreed norm.
    span<std::byte, Memory> reduce;
    span<std::uint8_t, Memory> index;  ///< Proposed, then agreed, scale per coordinate.
    span<std::int8_t, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.squared_norm = w.template take<double>(1);
    ws.factors = w.template take<detail::multiscale_factors>(1);
    ws.reduce = w.template take<std::byte>(segmented_reduce_scratch_bytes(layout.size(), layout.size()));
    ws.index = w.template take<std::uint8_t>(layout.size());
    ws.codes = w.template take<std::int8_t>(layout.size());
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The norm, the scale indices (all-reduce min) and the codes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return sizeof(double) + layout.size() + detail::aggregated_wire_bytes<Aggregator>(layout.size(), ranks);
  }

  /// The scales of a step on n ranks.
  detail::multiscale_scales scales_for(int ranks) const {
    detail::multiscale_scales m{};
    m.count = scales();
    for (int j = 0; j < m.count; ++j) m.levels[j] = static_cast<double>((std::int64_t{1} << bits[j]) - 1);
    m.share = static_cast<float>(detail::per_rank_headroom<std::int8_t>(ranks));
    m.ranks = static_cast<double>(ranks);
    return m;
  }

  /// One step: gradient <- the mean over ranks of their decoded codes.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    detail::multiscale_scales const m = scales_for(ctx.ranks());
    detail::multiscale_factors const* factors = ws.factors.data();

    detail::agree_largest_squared_norm(ctx, d, inputs(detail::gradient_stream(gradient), ef.previous()),
                                       ws.squared_norm, ws.reduce, carried_norm(ctx.ranks()),
                                       "NaN or infinite, or made the bucket's norm exceed what two-scale QSGD "
                                       "carries (counted once; see carried_norm)");
    parallel_for(space, 1, detail::multiscale_bind{ws.squared_norm.data(), m, ws.factors.data()});
    transform(space, d, inputs(detail::gradient_stream(gradient), ef.previous()), outputs(ws.index),
              detail::multiscale_propose{factors, m});
    ctx.all_reduce(ws.index, reduce_op::min);
    // pass(std::true_type) on the host where `allowed` and the step's units
    // are floats (its factors are in host memory, computed by now), else
    // pass(std::false_type): a CUDA step keeps its units in double rather
    // than wait for the factors.
    auto const in_float_where = [&](auto allowed, auto const& pass) {
      if constexpr (decltype(allowed)::value && std::is_same_v<typename Context::memory, host_memory>)
        if (factors->float_units) return pass(std::true_type{});
      pass(std::false_type{});
    };
    in_float_where(std::bool_constant<detail::host_fused_multiply_add>{}, [&](auto float_path) {
      transform(space, d,
                inputs(detail::gradient_stream(gradient), ef.previous(), ws.index,
                       rounding_noise{ctx.random(seed, random_purpose::rounding, ctx.own_lane())}),
                outputs(ws.codes, ef.next()), detail::multiscale_encode<decltype(float_path)::value>{factors, m.share});
    });
    ctx.aggregate_elementwise(ws.codes, ws.scratch);
    auto const [first, count] = ctx.output_range();
    in_float_where(std::true_type{}, [&, first = first, count = count](auto float_path) {
      transform(space, count, inputs(ws.codes.subspan(first, count), ws.index.subspan(first, count)),
                outputs(detail::gradient_stream(gradient.subspan(first, count))),
                detail::multiscale_decode<decltype(float_path)::value>{factors}, {.when = ctx.output_gate()});
    });
  }
};

static_assert(compressor<qsgd_multiscale>);

}  // namespace gradcomp
