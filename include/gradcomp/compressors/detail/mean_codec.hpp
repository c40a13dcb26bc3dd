// How a value travels when ranks sum it to form a mean, for each wire type
// (float, bfloat16, half).
//
// Every wire carries acc x (1/n), rounded: the 1/n comes before the sum (as
// in PyTorch's all-reduce hooks), so the n-rank sum stays within the range
// each term had and a finite mean never overflows. (A multiplication by the
// rounded inverse, on host and device alike: a GPU's IEEE division would
// call a slow path.) `residual` is what the rank kept back: acc - n x the
// wire value, computed in double so it is exact and the same everywhere.
//
// Admission: |acc| must not exceed limit(n) = max(W) / (1 + u)^(n + 2),
// with u the wire's unit roundoff: then no rounding of the inverse, the
// product or any partial sum in any summation order can reach past max(W).
// (bf16 on 4 ranks: 0.98 of its largest value; fp32 on 1024 ranks: 0.99994.)
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/types.hpp>

#include <cmath>
#include <cstddef>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The largest finite value of a wire type, and its unit roundoff.
template <class W>
struct wire_limits;
template <>
struct wire_limits<float> {
  static constexpr double max = 3.4028234663852886e38, unit = 0x1.0p-24;
  static constexpr char const* out_of_range = "NaN, infinite or beyond the fp32 lane's range";
};
template <>
struct wire_limits<bfloat16> {
  static constexpr double max = 3.3895313892515355e38, unit = 0x1.0p-8;
  static constexpr char const* out_of_range = "NaN, infinite or beyond the bf16 lane's range";
};
template <>
struct wire_limits<half> {
  static constexpr double max = 65504.0, unit = 0x1.0p-11;
  static constexpr char const* out_of_range = "NaN, infinite or beyond the fp16 lane's range";
};

template <class W>
struct mean_codec {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, bfloat16> || std::is_same_v<W, half>,
                "a mean travels as float, bfloat16 or half");
  /// The largest |acc| n ranks may send (see the top of this header).
  static float limit(int ranks) {
    return static_cast<float>(wire_limits<W>::max / std::pow(1.0 + wire_limits<W>::unit, ranks + 2.0));
  }
  /// What makes a value bad, for messages.
  static constexpr char const* out_of_range = wire_limits<W>::out_of_range;
  /// 1/n, rounded once, the same everywhere.
  static float inverse(int ranks) { return 1.0f / static_cast<float>(ranks); }
  /// Whether acc can travel: finite, within the limit (false for NaN).
  GRADCOMP_HOST_DEVICE static bool fits(float acc, float limit) { return within(acc, limit); }
  /// The wire value for acc, given 1/n (inverse(n)).
  GRADCOMP_HOST_DEVICE static W encode(float acc, float inverse_ranks) { return W(acc * inverse_ranks); }
  /// acc minus what that wire value contributed to the sum.
  GRADCOMP_HOST_DEVICE static float residual(float acc, W wire, float ranks) {
    return static_cast<float>(static_cast<double>(acc) -
                              static_cast<double>(static_cast<float>(wire)) * static_cast<double>(ranks));
  }
  /// The mean from the sum over ranks of the wire values.
  GRADCOMP_HOST_DEVICE static float mean(W sum) { return static_cast<float>(sum); }
};

}  // namespace gradcomp::detail
