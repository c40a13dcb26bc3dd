// One summation order for segment sums, shared by the host loops and the CUDA
// warp kernels so both produce the same bits: element t of a segment goes to
// lane t % 32, each lane accumulates its elements in order with a fused
// multiply-add, and the 32 lanes combine in a butterfly (xor 16, 8, 4, 2, 1).
// Results that feed a selection (TopK-Chunked's scores) must not differ
// between host and device by a rounding, or the selection could differ.
#pragma once

#include <gradcomp/config.hpp>

#include <cmath>

namespace gradcomp::detail {

/// Lanes of the canonical order: a CUDA warp.
inline constexpr int sum_lanes = 32;

/// acc + x * x, rounded once (explicitly fused, so no compiler contracts or
/// splits it differently on host and device).
GRADCOMP_HOST_DEVICE float add_square(float acc, float x) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(x, x, acc);
#else
  return std::fma(x, x, acc);
#endif
}

/// x * y + z rounded once, on host and device alike (no compiler may
/// contract or split it differently).
GRADCOMP_HOST_DEVICE float fused(float x, float y, float z) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(x, y, z);
#else
  return std::fma(x, y, z);
#endif
}

/// The butterfly over 32 lane partials, in place; every lane ends with the
/// total (a + b == b + a exactly, so all lanes agree).
GRADCOMP_HOST_DEVICE float butterfly_sum(float (&partial)[sum_lanes]) {
  for (int offset = sum_lanes / 2; offset > 0; offset /= 2) {
    float next[sum_lanes];
    for (int lane = 0; lane < sum_lanes; ++lane) next[lane] = partial[lane] + partial[lane ^ offset];
    for (int lane = 0; lane < sum_lanes; ++lane) partial[lane] = next[lane];
  }
  return partial[0];
}

}  // namespace gradcomp::detail
