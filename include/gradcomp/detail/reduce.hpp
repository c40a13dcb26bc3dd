// Element-wise reductions over ranks, shared by the in-process backend, the
// MPI backend's 16-bit operators and the all-gather aggregator.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/types.hpp>

#include <cstdint>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The type a reduction of T accumulates in: float for the 16-bit floats (so
/// a sum rounds once, at the end), a 64-bit integer for integers (sums wrap
/// modulo 2^bits on conversion back, as NCCL's do), T otherwise.
template <class T>
using accumulator_t = std::conditional_t<
    std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float,
    std::conditional_t<std::is_integral_v<T>, std::conditional_t<std::is_signed_v<T>, std::int64_t, std::uint64_t>, T>>;

template <class A>
GRADCOMP_HOST_DEVICE A combine(A a, A b, reduce_op op) {
  switch (op) {
    case reduce_op::max:
      return a < b ? b : a;
    case reduce_op::min:
      return b < a ? b : a;
    default:
      return a + b;
  }
}

/// out[i] = op over ranks r, in rank order, of gathered[r * count + i],
/// accumulated in accumulator_t<T>: the same order on every rank, so the
/// result is bitwise identical wherever it is computed.
template <class T>
struct reduce_gathered {
  T const* gathered;  // ranks rows of `count`
  T* out;
  std::size_t count;
  int ranks;
  reduce_op op;

  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    using A = accumulator_t<T>;
    A acc = static_cast<A>(gathered[i]);
    for (int r = 1; r < ranks; ++r) acc = combine(acc, static_cast<A>(gathered[r * count + i]), op);
    out[i] = static_cast<T>(acc);
  }
};

}  // namespace gradcomp::detail
