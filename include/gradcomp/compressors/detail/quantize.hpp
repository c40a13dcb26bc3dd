// What the integer all-reduce quantizers (QSGD-MaxNorm and its variants,
// IntSGD) share: the agreed bucket norm, signed stochastic rounding, the
// residual after sending a code, and the lane-headroom check.
//
// Norms are doubles (a squared norm of values near 1e-30 or 1e20 is out of
// float's range), and so are the units that turn codes back into values (a
// norm of values near 1e38 over a large bucket is too). The code of an
// element is computed in float, with the scale saturated at float's largest
// value: a group whose norm is below about 1e-37 sends zeros, and error
// feedback keeps it. IEEE arithmetic in either type gives the same bits on
// host and device.
//
// A decoded value or residual is at most the norm (times a compressor's own
// factor), so a norm near float's largest value would decode to infinity:
// each rank counts a norm beyond the compressor's carried range as a bad
// value before the agreement, so every rank refuses such a step, as the
// float lanes refuse values beyond theirs, before anything is written.
#pragma once

#include <gradcomp/algorithm/segmented_reduce.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/types.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI::detail {

template <class Lane>
constexpr bool is_signed_code_lane = std::is_same_v<Lane, std::int8_t> || std::is_same_v<Lane, std::int32_t>;

/// x, or 0 when it is not finite: a bad value must not reach a
/// float-to-integer conversion (the step is vetoed anyway).
GRADCOMP_HOST_DEVICE float finite_or_zero(float x) { return select(is_finite(x), x, 0.0f); }

/// |x| rounded to an integer at random, down or up with probability the
/// fraction (unbiased), with x's sign; x finite and within the lane already.
/// Truncation for floor (|x| >= 0) and single-step selects: loops vectorize.
GRADCOMP_HOST_DEVICE std::int32_t signed_stochastic_round(float x, float u) {
  float const magnitude = x < 0.0f ? -x : x;
  std::int32_t const down = static_cast<std::int32_t>(magnitude);
  std::int32_t const rounded = down + static_cast<std::int32_t>(u < magnitude - static_cast<float>(down));
  std::int32_t const negative = -static_cast<std::int32_t>(x < 0.0f);  // all ones when x < 0
  return (rounded ^ negative) - negative;
}

/// x clamped to [-limit, limit] (single-step selects).
GRADCOMP_HOST_DEVICE float clamp_symmetric(float x, float limit) {
  x = x < -limit ? -limit : x;
  return x > limit ? limit : x;
}

/// The scales of one step of a QSGD-style quantizer, from the agreed squared
/// norm: x = acc x scale is the code before rounding, code x unit this rank's
/// own decode, and sum x mean_unit the decoded mean of n ranks' codes.
struct qsgd_scale {
  float scale;
  double unit, mean_unit;
  GRADCOMP_HOST_DEVICE static qsgd_scale of(double squared_norm, double levels, double ranks) {
    double const norm = sqrt(squared_norm);
    return {norm > 0.0 ? saturated(levels / norm) : 0.0f, float_precision(norm / levels),
            float_precision(norm / (levels * ranks))};
  }
  /// acc's code: acc x scale clamped to +-limit, rounded at random with u.
  GRADCOMP_HOST_DEVICE std::int32_t code(float acc, float u, float limit) const {
    return signed_stochastic_round(clamp_symmetric(finite_or_zero(acc) * scale, limit), u);
  }
  /// What is left of acc once `code` is sent (exact in double, then rounded).
  GRADCOMP_HOST_DEVICE float residual(float acc, std::int32_t code) const {
    return static_cast<float>(static_cast<double>(acc) - static_cast<double>(code) * unit);
  }
  /// The mean from the sum over ranks of the codes.
  GRADCOMP_HOST_DEVICE float mean(double sum) const { return static_cast<float>(sum * mean_unit); }
};

/// acc = g + e of element i: the norm passes' op (a reduction leaves out
/// and counts the values that are not finite).
struct accumulated {
  GRADCOMP_HOST_DEVICE float operator()(std::size_t, float g, float e) const { return g + e; }
};

/// Half of float's largest value (1.7e38): the most a quantizer lets a
/// decoded value or a residual reach, leaving room for rounding.
inline constexpr double carried_magnitude = 1.7014117331926443e38;

/// The largest norm a QSGD-style step carries: its decoded means are at most
/// the norm and its residuals at most a unit.
inline constexpr double qsgd_carried_norm = carried_magnitude;

/// Whether a squared norm (finite: the norm passes leave bad values out) is
/// beyond `limit` squared (an input-only pass over the norms).
struct squared_norm_beyond {
  static constexpr bool vectorizes = false;  // (one norm per bucket or scale group: nothing to vectorize)
  double limit;                              // the norm's, not squared
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, double squared) const { return !(squared <= limit * limit); }
};

/// Counts this rank's squared norms beyond `limit` as bad values: call it
/// before agree_all_finite, on the norms this rank computed (the agreed
/// largest norm is beyond the limit exactly when some rank's is).
template <class Context>
void count_norms_beyond(Context& ctx, span<double const, typename Context::memory> squared_norms, double limit) {
  transform(ctx.space(), squared_norms.size(), inputs(squared_norms), outputs(), squared_norm_beyond{limit},
            {.count = ctx.bad_count()});
}

/// Counts the elements whose acc = g + e is not finite (an input-only pass).
struct count_nonfinite {
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, float g, float e) const { return !is_finite(g + e); }
};

/// Stores a segment total (a double) at out[j].
struct store_total_at {
  double* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j, double total) const { out[j] = total; }
};

/// QSGD's bound on its error, E||Q(x) - x||^2 <= min(n / s^2, sqrt(n) / s)
/// ||x||^2 for n coordinates quantized with s levels (Alistarh et al.,
/// Lemma 3.1); error feedback needs it below 1 (a contraction).
inline double qsgd_error_bound(std::size_t coordinates, double levels) {
  double const n = static_cast<double>(coordinates);
  double const dense = n / (levels * levels), sparse = std::sqrt(n) / levels;
  return dense < sparse ? dense : sparse;
}

/// The largest |code| one rank may send so that the sum over `ranks` ranks
/// always fits a signed Lane: floor(max(Lane) / ranks).
template <class Lane>
constexpr std::int64_t per_rank_headroom(int ranks) {
  return static_cast<std::int64_t>(std::numeric_limits<Lane>::max()) / ranks;
}

/// Throws invalid_argument unless n ranks' codes of up to +-`largest` sum
/// inside the Lane; the message names n, the bits and the lane.
template <class Lane>
void expect_lane_headroom(std::string_view who, int ranks, std::int64_t largest, int bits) {
  std::int64_t const limit = std::numeric_limits<Lane>::max();
  GRADCOMP_EXPECTS(largest * ranks <= limit,
                   std::string(who) + ": " + std::to_string(ranks) + " ranks x codes up to +-" +
                       std::to_string(largest) + " (bits=" + std::to_string(bits) + ") sum beyond the " +
                       std::string(name_of(dtype_of_v<Lane>)) + " lane (max " + std::to_string(limit) +
                       "); use a wider lane, fewer bits or fewer ranks");
}

/// The most bits a code may take in the Lane: 7 for int8, 24 for int32 (a
/// code must stay exact in a float).
template <class Lane>
inline constexpr int max_code_bits = std::is_same_v<Lane, std::int8_t> ? 7 : 24;

/// Throws invalid_argument unless `bits` fits the Lane (1..7 for int8,
/// 1..24 for int32: a code must stay exact in a float), then unless n ranks'
/// codes of 2^bits - 1 levels sum inside it.
template <class Lane>
void expect_code_bits(std::string_view who, int ranks, int bits) {
  int const most = max_code_bits<Lane>;
  GRADCOMP_EXPECTS(bits >= 1 && bits <= most, std::string(who) + ": bits=" + std::to_string(bits) + " is outside 1.." +
                                                  std::to_string(most) + " for the " +
                                                  std::string(name_of(dtype_of_v<Lane>)) + " lane");
  expect_lane_headroom<Lane>(who, ranks, (std::int64_t{1} << bits) - 1, bits);
}

/// Whether n ranks' codes of `bits` bits sum inside the Lane, as
/// expect_code_bits requires: false for bits out of range, checked before
/// anything shifts by them (a spec's automatic lane choice).
template <class Lane>
bool code_bits_fit(int ranks, int bits) {
  return bits >= 1 && bits <= max_code_bits<Lane> &&
         ((std::int64_t{1} << bits) - 1) * ranks <= std::numeric_limits<Lane>::max();
}

/// The norm round of the QSGD family: ||acc||^2 over the bucket (bad values
/// counted, and a norm beyond `carried` counted once), the agreement (`what`:
/// its message, a string literal), then every rank takes the largest squared
/// norm.
template <class Context, class In>
void agree_largest_squared_norm(Context& ctx, std::size_t n, In const& in, span<double, typename Context::memory> norm,
                                span<std::byte, typename Context::memory> scratch, double carried, char const* what) {
  segmented_reduce<reduction::sum_of_squares>(ctx.space(), n, n, in, accumulated{}, store_total_at{norm.data()},
                                              {.scratch = scratch, .count = ctx.bad_count()});
  count_norms_beyond(ctx, span<double const, typename Context::memory>(norm), carried);
  ctx.agree_all_finite(what);
  ctx.all_reduce(norm, reduce_op::max);
}

}  // namespace gradcomp::detail
