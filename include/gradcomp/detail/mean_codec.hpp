// How a value travels when ranks sum it to form a mean, for each wire type.
//
// 16-bit wires carry acc / n, rounded: the 1/n comes before the cast so the
// n-rank sum stays within the range each term had. fp32 carries acc itself
// and divides the sum. `sent` is what this rank contributed, in acc's units:
// error feedback keeps acc - sent (exact in float for n <= 8192).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <type_traits>

namespace gradcomp::detail {

template <class W>
struct mean_codec {
  static_assert(std::is_same_v<W, bfloat16> || std::is_same_v<W, half>, "a mean travels as float, bfloat16 or half");
  /// The wire value for acc on a group of `ranks`.
  GRADCOMP_HOST_DEVICE static W encode(float acc, float ranks) { return W(acc / ranks); }
  /// What that wire value contributed to the sum, in acc's units.
  GRADCOMP_HOST_DEVICE static float sent(W wire, float ranks) { return static_cast<float>(wire) * ranks; }
  /// The mean from the sum over ranks of the wire values.
  GRADCOMP_HOST_DEVICE static float mean(W sum, float /*ranks*/) { return static_cast<float>(sum); }
  /// Whether acc can travel: finite, and the n-rank sum cannot overflow W.
  GRADCOMP_HOST_DEVICE static bool fits(float acc) { return (acc <= W::max()) & (acc >= -W::max()); }
};

template <>
struct mean_codec<float> {
  GRADCOMP_HOST_DEVICE static float encode(float acc, float) { return acc; }
  GRADCOMP_HOST_DEVICE static float sent(float wire, float) { return wire; }
  GRADCOMP_HOST_DEVICE static float mean(float sum, float ranks) { return sum / ranks; }
  GRADCOMP_HOST_DEVICE static bool fits(float acc) { return (acc <= 3.40282347e38f) & (acc >= -3.40282347e38f); }
};

/// acc = g + e into a workspace array, counting the values the wire type W
/// cannot carry (for compressors that need acc materialized: TopK selects
/// from it, PowerSGD multiplies by it).
template <class W, class EF>
struct accumulate_into {
  float const* gradient;
  EF ef;
  float* acc;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const {
    acc[i] = ef.accumulate(i, gradient[i]);
    return !mean_codec<W>::fits(acc[i]);
  }
};

}  // namespace gradcomp::detail
