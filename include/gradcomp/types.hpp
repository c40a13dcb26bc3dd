// The core types: 16-bit floating-point storage, the element-type tags the
// collectives understand, the gradient-element concept and the reductions.
//
// gradcomp carries its own fp16 / bf16 types so that host (g++) and device
// (nvcc) code round identically: conversions are plain integer arithmetic,
// round-to-nearest-even, and bit-for-bit the same as CUDA's __half and
// __nv_bfloat16 (whose layout they share, so NCCL can sum them).
#pragma once

#include <gradcomp/config.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

GRADCOMP_HOST_DEVICE std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GRADCOMP_HOST_DEVICE float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// a where `pick`, else b, chosen on the bits. A ?: on floats may become a
/// branch (floating point can trap, so compilers do not compute the chosen
/// value's arithmetic speculatively), and a loop with a branch does not
/// vectorize; this never does.
GRADCOMP_HOST_DEVICE float select(bool pick, float a, float b) {
  std::uint32_t const mask = 0u - static_cast<std::uint32_t>(pick);  // all ones when pick
  return bits_float((float_bits(a) & mask) | (float_bits(b) & ~mask));
}
/// The same for bit patterns (their arithmetic may involve floats too).
GRADCOMP_HOST_DEVICE std::uint32_t select(bool pick, std::uint32_t a, std::uint32_t b) {
  std::uint32_t const mask = 0u - static_cast<std::uint32_t>(pick);
  return (a & mask) | (b & ~mask);
}

/// |x| <= limit, false for NaN: one comparison, so loops vectorize.
GRADCOMP_HOST_DEVICE bool within(float x, float limit) { return bits_float(float_bits(x) & 0x7fffffffu) <= limit; }

/// True for a finite float.
GRADCOMP_HOST_DEVICE bool is_finite(float x) { return within(x, 3.40282347e38f); }

/// x * y + z rounded once, on host and device alike: where a result must be
/// the same on both, no compiler may contract or split it differently.
GRADCOMP_HOST_DEVICE float fused(float x, float y, float z) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(x, y, z);
#else
  return std::fma(x, y, z);
#endif
}
/// The same in double.
GRADCOMP_HOST_DEVICE double fused(double x, double y, double z) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(x, y, z);
#else
  return std::fma(x, y, z);
#endif
}

/// A non-negative double as a float, saturated at float's largest value.
GRADCOMP_HOST_DEVICE float saturated(double x) {
  return static_cast<float>(x < 3.4028234663852886e38 ? x : 3.4028234663852886e38);
}

/// x with its significand rounded to float's 24 bits, keeping double's
/// range. A product of such a unit and an integer code below 2^24 is exact
/// in double, so `acc - code * unit` rounds once whether or not a compiler
/// fuses it (nvcc does by default): host and device agree bit for bit.
GRADCOMP_HOST_DEVICE double float_precision(double x) {
  int exponent = 0;
  double const significand = frexp(x, &exponent);
  return ldexp(static_cast<double>(static_cast<float>(significand)), exponent);
}

/// float -> bf16, round to nearest even; NaN stays a (quiet) NaN.
GRADCOMP_HOST_DEVICE std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t const u = float_bits(f);
  bool const nan = (u & 0x7fffffffu) > 0x7f800000u;
  std::uint32_t const rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>(nan ? ((u >> 16) | 0x40u) : rounded);
}

GRADCOMP_HOST_DEVICE float bf16_bits_to_float(std::uint16_t h) {
  return bits_float(static_cast<std::uint32_t>(h) << 16);
}

/// float -> IEEE half, round to nearest even, overflow to infinity.
GRADCOMP_HOST_DEVICE std::uint16_t float_to_half_bits(float value) {
  std::uint32_t f = float_bits(value);
  std::uint32_t const sign = (f >> 16) & 0x8000u;
  f &= 0x7fffffffu;
  // Below 2^-14 the result is subnormal: adding 0.5 lines the 10 mantissa bits
  // up at the bottom of the float, and the FPU does the rounding.
  std::uint32_t const subnormal = float_bits(bits_float(f) + 0.5f) - 0x3f000000u;
  std::uint32_t const normal = (f + 0xc8000fffu + ((f >> 13) & 1u)) >> 13;  // rebias exponent, round
  std::uint32_t const special = f > 0x7f800000u ? 0x7e00u : 0x7c00u;
  std::uint32_t magnitude = select(f < 0x38800000u, subnormal, normal);  // (the subnormal path adds floats)
  magnitude = select(f >= 0x47800000u, special, magnitude);
  return static_cast<std::uint16_t>(magnitude | sign);
}

GRADCOMP_HOST_DEVICE float half_bits_to_float(std::uint16_t h) {
  std::uint32_t const magnitude = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  std::uint32_t const exponent = magnitude & 0x0f800000u;
  std::uint32_t const normal = magnitude + 0x38000000u;
  std::uint32_t const special = magnitude + 0x70000000u;  // inf / NaN
  std::uint32_t const subnormal = float_bits(bits_float(magnitude + 0x38800000u) - bits_float(0x38800000u));
  std::uint32_t out = select(exponent == 0, subnormal, normal);
  out = select(exponent == 0x0f800000u, special, out);
  return bits_float(out | (static_cast<std::uint32_t>(h & 0x8000u) << 16));
}

}  // namespace detail

/// bfloat16 storage: 8 exponent bits like float, 8 significant bits.
struct bfloat16 {
  std::uint16_t bits;  ///< Raw IEEE-style bits (sign, 8 exponent, 7 mantissa).

  bfloat16() = default;
  /// Rounds `f` to nearest even.
  GRADCOMP_HOST_DEVICE explicit bfloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  /// Exact widening to float.
  GRADCOMP_HOST_DEVICE explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  /// Largest finite value.
  GRADCOMP_HOST_DEVICE static constexpr float max() { return 3.38953139e38f; }
};

/// IEEE 754 binary16 storage: 5 exponent bits, 11 significant bits.
struct half {
  std::uint16_t bits;  ///< Raw IEEE bits (sign, 5 exponent, 10 mantissa).

  half() = default;
  /// Rounds `f` to nearest even; overflows to infinity past 65504.
  GRADCOMP_HOST_DEVICE explicit half(float f) : bits(detail::float_to_half_bits(f)) {}
  /// Exact widening to float.
  GRADCOMP_HOST_DEVICE explicit operator float() const { return detail::half_bits_to_float(bits); }
  /// Largest finite value.
  GRADCOMP_HOST_DEVICE static constexpr float max() { return 65504.0f; }
};

/// Element types a collective can carry.
enum class dtype : std::uint8_t { float32, float64, float16, bfloat16, int8, uint8, int32, uint32, int64, uint64 };

namespace detail {
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr dtype value = dtype::float32;
};
template <>
struct dtype_of<double> {
  static constexpr dtype value = dtype::float64;
};
template <>
struct dtype_of<half> {
  static constexpr dtype value = dtype::float16;
};
template <>
struct dtype_of<bfloat16> {
  static constexpr dtype value = dtype::bfloat16;
};
template <>
struct dtype_of<std::int8_t> {
  static constexpr dtype value = dtype::int8;
};
template <>
struct dtype_of<std::uint8_t> {
  static constexpr dtype value = dtype::uint8;
};
template <>
struct dtype_of<std::int32_t> {
  static constexpr dtype value = dtype::int32;
};
template <>
struct dtype_of<std::uint32_t> {
  static constexpr dtype value = dtype::uint32;
};
template <>
struct dtype_of<std::int64_t> {
  static constexpr dtype value = dtype::int64;
};
template <>
struct dtype_of<std::uint64_t> {
  static constexpr dtype value = dtype::uint64;
};

/// Calls f(T{}) with the C++ type of `t`.
template <class F>
void with_type(dtype t, F&& f) {
  switch (t) {
    case dtype::float32:
      return f(float{});
    case dtype::float64:
      return f(double{});
    case dtype::float16:
      return f(half{});
    case dtype::bfloat16:
      return f(bfloat16{});
    case dtype::int8:
      return f(std::int8_t{});
    case dtype::uint8:
      return f(std::uint8_t{});
    case dtype::int32:
      return f(std::int32_t{});
    case dtype::uint32:
      return f(std::uint32_t{});
    case dtype::int64:
      return f(std::int64_t{});
    case dtype::uint64:
      return f(std::uint64_t{});
  }
}
}  // namespace detail

/// True for the element types collectives can carry.
template <class T>
concept wire_type = requires {
  detail::dtype_of<T>::value;
};

/// The dtype tag of a wire type.
template <wire_type T>
inline constexpr dtype dtype_of_v = detail::dtype_of<T>::value;

/// Size in bytes of one element of `t`.
constexpr std::size_t size_of(dtype t) {
  switch (t) {
    case dtype::float64:
    case dtype::int64:
    case dtype::uint64:
      return 8;
    case dtype::float32:
    case dtype::int32:
    case dtype::uint32:
      return 4;
    case dtype::float16:
    case dtype::bfloat16:
      return 2;
    case dtype::int8:
    case dtype::uint8:
      return 1;
  }
  return 0;
}

/// Human-readable name of `t`, for error messages.
constexpr std::string_view name_of(dtype t) {
  constexpr std::string_view names[] = {"float32", "float64", "float16", "bfloat16", "int8",
                                        "uint8",   "int32",   "uint32",  "int64",    "uint64"};
  return names[static_cast<int>(t)];
}

/// Gradient element types: what a bucket's gradients may be stored as.
template <class G>
concept gradient_element = std::is_same_v<G, float> || std::is_same_v<G, bfloat16> || std::is_same_v<G, half>;

/// The reductions collectives support.
enum class reduce_op { sum, max, min };

/// Name of `op`, for error messages.
constexpr std::string_view name_of(reduce_op op) {
  return op == reduce_op::sum ? "sum" : op == reduce_op::max ? "max" : "min";
}

/// Converts between float and the wire types, host and device alike.
template <class To, class From>
GRADCOMP_HOST_DEVICE To convert(From x) {
  return static_cast<To>(x);
}

}  // namespace gradcomp
