// QSGD-MaxNorm and its variants (Vineeth S, "Quantization for Distributed
// Optimization", arXiv 2109.12497): all-reduce compatible stochastic
// quantizers whose integer codes every rank sums in a small signed lane.
//
// qsgd_maxnorm, per step, with acc = g + e and s = 2^bits - 1:
//   1. norm pass [reads g, e]: ||acc||^2; one all-reduce(max) of the scalar
//      gives every rank the same norm (the largest).
//   2. encode pass [reads g, e; writes codes, e]: code = sign(acc) x
//      (floor(|acc| s / norm) + Bernoulli(fraction)) (unbiased, per-rank
//      noise); e = acc - code x norm / s (the rank's own decode).
//   3. all-reduce(sum) of the codes in the Lane type.
//   4. decode pass [reads codes; writes g]: g = sum x norm / (s n).
//   Wire: d x sizeof(Lane) + 4. n x s must fit the Lane (checked).
//   Unbiased, but its variance is about sqrt(d) / s ||acc||^2: at few bits
//   on a large bucket it exceeds the signal, and error feedback (which needs
//   an error smaller than the signal) then diverges. Use it without error
//   feedback, or with more bits (or the multi-scale variant).
//
// qsgd_multiscale: the same with several resolutions s_j (default 6 and 10
// bits) and int8 codes. Each rank proposes, per coordinate, the finest scale
// whose code cannot exceed its share of the int8 lane (floor(127 / n)); one
// all-reduce(min) of the scale indices (uint8) makes the choice common (a
// coarser scale only shrinks a code, so every rank's code still fits); codes
// are encoded and decoded at the agreed scale. Wire: d x (1 + 1) + 4 bytes,
// a 16-bit baseline's, which is what it must be measured against. A
// coordinate too large even for the coarsest scale saturates at the lane
// share; error feedback carries the clipped part.
//
// global_randk: K coordinates drawn by a shared-seed random permutation (the
// same on every rank, new every step), QSGD-MaxNorm on them, zeros elsewhere;
// error feedback keeps what was not sent. Wire: K x sizeof(Lane) + 4.
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/compressors/quantize/common.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/lane_sum.hpp>
#include <gradcomp/detail/mean_codec.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace gradcomp {
namespace detail {

/// x clamped to [-limit, limit] (single-step selects).
GRADCOMP_HOST_DEVICE float clamp_symmetric(float x, float limit) {
  x = x < -limit ? -limit : x;
  return x > limit ? limit : x;
}

/// The scales of one step, from the agreed squared norm: x = acc x scale is
/// the code before rounding, code x unit this rank's own decode, and
/// sum x mean_unit the decoded mean of n ranks' codes.
struct qsgd_scale {
  float scale, unit, mean_unit;
  GRADCOMP_HOST_DEVICE static qsgd_scale of(float squared_norm, float levels, float ranks) {
    float const norm = sqrtf(squared_norm);
    return {norm > 0.0f ? levels / norm : 0.0f, norm / levels, norm / (levels * ranks)};
  }
  /// acc's code: acc x scale clamped to +-limit, rounded at random with u.
  GRADCOMP_HOST_DEVICE std::int32_t code(float acc, float u, float limit) const {
    return signed_stochastic_round(clamp_symmetric(acc * scale, limit), u);
  }
  /// What is left of acc once `code` is sent.
  GRADCOMP_HOST_DEVICE float residual(float acc, std::int32_t code) const { return minus_product(acc, code, unit); }
};

template <class Lane, class EF>
struct qsgd_encode {
  float const* gradient;
  EF ef;
  Lane* codes;
  float const* squared_norm;
  float levels;  // s
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE qsgd_encode bind() const {
    qsgd_encode b = *this;
    b.k = qsgd_scale::of(*squared_norm, levels, 1.0f);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i, float u) const {
    float const acc = ef.accumulate(i, gradient[i]);
    std::int32_t const code = k.code(acc, u, levels);  // |acc| <= norm, but a rounded norm can fall a hair short
    ef.update(i, k.residual(acc, code), mean_codec<float>::fits(acc));
    codes[i] = static_cast<Lane>(code);
  }
};

template <class Lane>
struct qsgd_decode {
  Lane const* summed;
  float* gradient;
  float const* squared_norm;
  float levels, ranks;
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE qsgd_decode bind() const {
    qsgd_decode b = *this;
    b.k = qsgd_scale::of(*squared_norm, levels, ranks);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i) const { gradient[i] = static_cast<float>(summed[i]) * k.mean_unit; }
};

/// The multi-scale codec's scales, finest last.
inline constexpr int max_scales = 4;
struct multiscale_scales {
  int count;
  float levels[max_scales];  // s_j = 2^bits_j - 1, ascending
  float share;               // the largest |code| of one rank: floor(127 / n)
  float ranks;
  qsgd_scale k[max_scales];
  GRADCOMP_HOST_DEVICE void bind(float squared_norm) {
    for (int j = 0; j < max_scales; ++j)  // unused scales fit nothing (an infinite scale)
      k[j] = j < count ? qsgd_scale::of(squared_norm, levels[j], ranks) : qsgd_scale{__builtin_huge_valf(), 0.0f, 0.0f};
  }
  /// k[j], by selects rather than an indexed load, so element loops vectorize.
  GRADCOMP_HOST_DEVICE qsgd_scale at(unsigned j) const {
    qsgd_scale chosen = k[0];
    for (unsigned s = 1; s < max_scales; ++s) {
      chosen.scale = j == s ? k[s].scale : chosen.scale;
      chosen.unit = j == s ? k[s].unit : chosen.unit;
      chosen.mean_unit = j == s ? k[s].mean_unit : chosen.mean_unit;
    }
    return chosen;
  }
};

template <class EF>
struct multiscale_propose {  // the finest scale whose code fits this rank's share
  float const* gradient;
  EF ef;
  std::uint8_t* index;
  float const* squared_norm;
  multiscale_scales m;
  GRADCOMP_HOST_DEVICE multiscale_propose bind() const {
    multiscale_propose b = *this;
    b.m.bind(*squared_norm);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i) const {
    float const acc = ef.accumulate(i, gradient[i]);
    float const magnitude = acc < 0.0f ? -acc : acc;
    // Scales ascend, so the finest that fits is the count of finer ones that
    // fit; a fixed trip count (unused scales never fit) lets loops vectorize.
    std::int32_t finest = 0;
    for (int j = 1; j < max_scales; ++j) finest += static_cast<std::int32_t>(magnitude * m.k[j].scale <= m.share);
    index[i] = static_cast<std::uint8_t>(finest);
  }
};

template <class EF>
struct multiscale_encode {
  float const* gradient;
  EF ef;
  std::uint8_t const* index;  // agreed (all-reduce min)
  std::int8_t* codes;
  float const* squared_norm;
  multiscale_scales m;
  GRADCOMP_HOST_DEVICE multiscale_encode bind() const {
    multiscale_encode b = *this;
    b.m.bind(*squared_norm);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i, float u) const {
    float const acc = ef.accumulate(i, gradient[i]);
    qsgd_scale const k = m.at(index[i]);
    std::int32_t const code = k.code(acc, u, m.share);
    ef.update(i, k.residual(acc, code), mean_codec<float>::fits(acc));
    codes[i] = static_cast<std::int8_t>(code);
  }
};

struct multiscale_decode {
  std::int8_t const* summed;
  std::uint8_t const* index;
  float* gradient;
  float const* squared_norm;
  multiscale_scales m;
  GRADCOMP_HOST_DEVICE multiscale_decode bind() const {
    multiscale_decode b = *this;
    b.m.bind(*squared_norm);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t i) const {
    gradient[i] = static_cast<float>(summed[i]) * m.at(index[i]).mean_unit;
  }
};

/// A random bijection of [0, n) that every rank computes alike from the
/// shared seed: a four-round balanced Feistel network on the smallest
/// 2^(2h) >= n, cycle-walking past n (at most a few steps on average).
/// The first K images are K distinct random coordinates.
struct shared_permutation {
  std::uint64_t n;
  int half_bits;
  std::uint32_t keys[4];

  static shared_permutation make(std::uint64_t n, random_stream const& shared) {
    int bits = 2;
    while ((std::uint64_t{1} << bits) < n) bits += 2;
    uint4x32 const words = shared(0);
    return {n, bits / 2, {words.v[0], words.v[1], words.v[2], words.v[3]}};
  }
  GRADCOMP_HOST_DEVICE static std::uint32_t mix(std::uint32_t x) {  // a 32-bit integer hash
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
  }
  GRADCOMP_HOST_DEVICE std::uint64_t once(std::uint64_t x) const {
    std::uint64_t const mask = (std::uint64_t{1} << half_bits) - 1;
    std::uint64_t left = x >> half_bits, right = x & mask;
    for (int r = 0; r < 4; ++r) {
      std::uint64_t const next = left ^ (mix(static_cast<std::uint32_t>(right) ^ keys[r]) & mask);
      left = right;
      right = next;
    }
    return (left << half_bits) | right;
  }
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t k) const {
    std::uint64_t x = once(k);
    while (x >= n) x = once(x);
    return x;
  }
};

template <class EF>
struct randk_gather {  // coordinate k of the step and its acc
  shared_permutation pick;
  float const* gradient;
  EF ef;
  std::uint64_t* indices;
  float* values;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t k) const {
    std::uint64_t const i = pick(k);
    indices[k] = i;
    values[k] = ef.accumulate(i, gradient[i]);
  }
};

template <class EF>
struct acc_not_finite {
  float const* gradient;
  EF ef;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const {
    return !mean_codec<float>::fits(ef.accumulate(i, gradient[i]));
  }
};

template <class Lane>
struct randk_encode {  // values: acc in, acc - own decode out
  float* values;
  Lane* codes;
  float const* squared_norm;
  float levels;
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE randk_encode bind() const {
    randk_encode b = *this;
    b.k = qsgd_scale::of(*squared_norm, levels, 1.0f);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t j, float u) const {
    float const acc = values[j];
    std::int32_t const code = k.code(acc, u, levels);
    codes[j] = static_cast<Lane>(code);
    values[j] = k.residual(acc, code);
  }
};

template <class EF>
struct randk_unsent {  // every coordinate: output 0, residual acc (the drawn ones are overwritten next)
  float* gradient;
  EF ef;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    float const acc = ef.accumulate(i, gradient[i]);
    ef.update(i, acc, mean_codec<float>::fits(acc));
    gradient[i] = 0.0f;
  }
};

template <class Lane, class EF>
struct randk_decode {
  std::uint64_t const* indices;
  Lane const* summed;
  float const* residuals;
  float* gradient;
  EF ef;
  float const* squared_norm;
  float levels, ranks;
  qsgd_scale k{};
  GRADCOMP_HOST_DEVICE randk_decode bind() const {
    randk_decode b = *this;
    b.k = qsgd_scale::of(*squared_norm, levels, ranks);
    return b;
  }
  GRADCOMP_HOST_DEVICE void element(std::size_t j) const {
    std::uint64_t const i = indices[j];
    gradient[i] = static_cast<float>(summed[j]) * k.mean_unit;
    ef.update(i, residuals[j], mean_codec<float>::fits(residuals[j]));
  }
};

template <class Lane>
constexpr bool is_signed_code_lane = std::is_same_v<Lane, std::int8_t> || std::is_same_v<Lane, std::int32_t>;

}  // namespace detail

/// QSGD-MaxNorm (see the top of this header).
///
/// \tparam Lane the summation lane: std::int8_t (bits <= 7) or std::int32_t.
template <class Lane = std::int8_t>
struct qsgd_maxnorm {
  static_assert(detail::is_signed_code_lane<Lane>, "qsgd_maxnorm sums its codes in std::int8_t or std::int32_t lanes");

  /// Name for messages and reports.
  static constexpr std::string_view name = "qsgd-maxnorm";
  /// Integer codes of every rank add element by element.
  static constexpr bool summable_payload = true;

  int bits = 4;            ///< s = 2^bits - 1 levels per sign.
  std::uint64_t seed = 0;  ///< Per-rank rounding noise derives from it.

  /// s.
  std::int64_t levels() const { return (std::int64_t{1} << bits) - 1; }

  /// Throws invalid_argument for bits outside 1..(7 for int8, 24 for int32)
  /// or n ranks whose summed codes could overflow the lane.
  void validate(bucket_layout const&, int ranks) const {
    int const most = std::is_same_v<Lane, std::int8_t> ? 7 : 24;
    GRADCOMP_EXPECTS(bits >= 1 && bits <= most, "qsgd_maxnorm: " + std::to_string(bits) + " bits is outside 1.." +
                                                    std::to_string(most) + " for the " +
                                                    std::string(name_of(dtype_of_v<Lane>)) + " lane");
    detail::expect_lane_headroom<Lane>("qsgd_maxnorm", ranks, levels(), bits);
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), static_cast<std::uint64_t>(bits));
    h = detail::hash_combine(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;
    span<float, Memory> tiles;         ///< Squared norm per tile.
    span<float, Memory> squared_norm;  ///< ||acc||^2; then the max over ranks.
    span<Lane, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.tiles = w.template take<float>(detail::norm_tiles(layout.size()));
    ws.squared_norm = w.template take<float>(1);
    ws.codes = w.template take<Lane>(layout.size());
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The norm and the codes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return sizeof(float) + detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(Lane), ranks);
  }

  /// One step: gradient <- the mean over ranks of their decoded codes.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    float const s = static_cast<float>(levels());

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    detail::agree_largest_squared_norm(ctx, d, detail::accumulated<EF>{gradient.data(), ef}, ws.tiles.data(),
                                       ws.squared_norm, ws.counters.data());
    random_stream const mine(seed, static_cast<std::uint32_t>(ctx.step()), static_cast<std::uint32_t>(ctx.rank()));
    detail::for_each_with_noise(space, d, mine,
                                detail::qsgd_encode<Lane, EF>{gradient.data(), ef, ws.codes.data(),
                                                              ws.squared_norm.data(), s});
    ctx.aggregate(ws.codes, ws.scratch);
    detail::for_each_bound(space, d,
                           detail::qsgd_decode<Lane>{ws.codes.data(), gradient.data(), ws.squared_norm.data(), s,
                                                     static_cast<float>(ctx.ranks())});
  }
};

/// QSGD-MaxNorm with several resolutions and a per-coordinate scale agreed
/// by all ranks (see the top of this header). Codes sum in int8 lanes.
struct qsgd_multiscale {
  /// Name for messages and reports.
  static constexpr std::string_view name = "qsgd-multiscale";
  /// Integer codes at agreed scales add element by element.
  static constexpr bool summable_payload = true;

  /// Bits of each scale, ascending (coarsest first); 0 ends the list.
  std::array<int, detail::max_scales> bits{6, 10, 0, 0};
  std::uint64_t seed = 0;  ///< Per-rank rounding noise derives from it.

  /// Scales in use.
  int scales() const {
    int count = 0;
    while (count < detail::max_scales && bits[count] != 0) ++count;
    return count;
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
    return detail::hash_combine(h, seed);
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;
    span<float, Memory> tiles;
    span<float, Memory> squared_norm;
    span<std::uint8_t, Memory> index;  ///< Proposed, then agreed, scale per coordinate.
    span<std::int8_t, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.tiles = w.template take<float>(detail::norm_tiles(layout.size()));
    ws.squared_norm = w.template take<float>(1);
    ws.index = w.template take<std::uint8_t>(layout.size());
    ws.codes = w.template take<std::int8_t>(layout.size());
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The norm, the scale indices (all-reduce min) and the codes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return sizeof(float) + layout.size() + detail::aggregated_wire_bytes<Aggregator>(layout.size(), ranks);
  }

  /// The scales of a step on n ranks.
  detail::multiscale_scales scales_for(int ranks) const {
    detail::multiscale_scales m{};
    m.count = scales();
    for (int j = 0; j < m.count; ++j) m.levels[j] = static_cast<float>((std::int64_t{1} << bits[j]) - 1);
    m.share = static_cast<float>(detail::per_rank_headroom<std::int8_t>(ranks));
    m.ranks = static_cast<float>(ranks);
    return m;
  }

  /// One step: gradient <- the mean over ranks of their decoded codes.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    detail::multiscale_scales const m = scales_for(ctx.ranks());

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    detail::agree_largest_squared_norm(ctx, d, detail::accumulated<EF>{gradient.data(), ef}, ws.tiles.data(),
                                       ws.squared_norm, ws.counters.data());
    detail::for_each_bound(space, d,
                           detail::multiscale_propose<EF>{gradient.data(), ef, ws.index.data(),
                                                          ws.squared_norm.data(), m});
    ctx.all_reduce(ws.index, reduce_op::min);
    random_stream const mine(seed, static_cast<std::uint32_t>(ctx.step()), static_cast<std::uint32_t>(ctx.rank()));
    detail::for_each_with_noise(space, d, mine,
                                detail::multiscale_encode<EF>{gradient.data(), ef, ws.index.data(), ws.codes.data(),
                                                              ws.squared_norm.data(), m});
    ctx.aggregate(ws.codes, ws.scratch);
    detail::for_each_bound(space, d,
                           detail::multiscale_decode{ws.codes.data(), ws.index.data(), gradient.data(),
                                                     ws.squared_norm.data(), m});
  }
};

/// GlobalRandK-MaxNorm: QSGD-MaxNorm on K coordinates that every rank draws
/// alike from the shared seed (see the top of this header).
template <class Lane = std::int8_t>
struct global_randk {
  static_assert(detail::is_signed_code_lane<Lane>, "global_randk sums its codes in std::int8_t or std::int32_t lanes");

  /// Name for messages and reports.
  static constexpr std::string_view name = "global-randk";
  /// The same coordinates on every rank: codes add element by element.
  static constexpr bool summable_payload = true;

  std::size_t k = 10000;   ///< Coordinates sent per step.
  int bits = 4;            ///< s = 2^bits - 1 levels per sign.
  std::uint64_t seed = 0;  ///< The shared coordinates and the per-rank noise derive from it.

  /// s.
  std::int64_t levels() const { return (std::int64_t{1} << bits) - 1; }

  /// Throws invalid_argument for k outside 1..d, bits outside the lane, or
  /// n ranks whose summed codes could overflow the lane.
  void validate(bucket_layout const& layout, int ranks) const {
    GRADCOMP_EXPECTS(k >= 1 && k <= layout.size(), "global_randk: k = " + std::to_string(k) +
                                                       " must be in 1..the bucket's " +
                                                       std::to_string(layout.size()) + " elements");
    qsgd_maxnorm<Lane>{bits, seed}.validate(layout, ranks);
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), k);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(bits));
    h = detail::hash_combine(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;
    span<float, Memory> tiles;
    span<float, Memory> squared_norm;
    span<std::uint64_t, Memory> indices;  ///< The step's coordinates.
    span<float, Memory> values;           ///< Their acc, then their residual.
    span<Lane, Memory> codes;
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const&, int ranks) const {
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.tiles = w.template take<float>(detail::norm_tiles(k));
    ws.squared_norm = w.template take<float>(1);
    ws.indices = w.template take<std::uint64_t>(k);
    ws.values = w.template take<float>(k);
    ws.codes = w.template take<Lane>(k);
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.codes.size_bytes(), ranks));
    return ws;
  }

  /// The norm and K codes.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const&, int ranks) const {
    return sizeof(float) + detail::aggregated_wire_bytes<Aggregator>(k * sizeof(Lane), ranks);
  }

  /// The coordinates of a step (the same on every rank).
  detail::shared_permutation coordinates(std::size_t d, std::uint64_t step) const {
    return detail::shared_permutation::make(
        d, random_stream(seed, static_cast<std::uint32_t>(step), random_stream::shared));
  }

  /// One step: the drawn coordinates <- their rank-mean decoded codes, the
  /// rest <- 0.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size();
    float const s = static_cast<float>(levels());

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    parallel_count(space, d, detail::acc_not_finite<EF>{gradient.data(), ef}, ws.counters.data());
    parallel_for(space, k,
                 detail::randk_gather<EF>{coordinates(d, ctx.step()), gradient.data(), ef, ws.indices.data(),
                                          ws.values.data()});
    detail::agree_largest_squared_norm(ctx, k, detail::read_sum{ws.values.data()}, ws.tiles.data(), ws.squared_norm,
                                       ws.counters.data());
    random_stream const mine(seed ^ 0x9e3779b97f4a7c15ull, static_cast<std::uint32_t>(ctx.step()),
                             static_cast<std::uint32_t>(ctx.rank()));
    detail::for_each_with_noise(space, k, mine,
                                detail::randk_encode<Lane>{ws.values.data(), ws.codes.data(),
                                                           ws.squared_norm.data(), s});
    ctx.aggregate(ws.codes, ws.scratch);
    parallel_for(space, d, detail::randk_unsent<EF>{gradient.data(), ef});
    detail::for_each_bound(space, k,
                           detail::randk_decode<Lane, EF>{ws.indices.data(), ws.codes.data(), ws.values.data(),
                                                          gradient.data(), ef, ws.squared_norm.data(), s,
                                                          static_cast<float>(ctx.ranks())});
  }
};

static_assert(compressor<qsgd_maxnorm<>>);
static_assert(compressor<qsgd_multiscale>);
static_assert(compressor<global_randk<>>);

}  // namespace gradcomp
