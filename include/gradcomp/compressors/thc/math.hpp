// THC's per-element and per-pair math, shared by the host block loops
// (blocks.hpp) and the CUDA block kernels (thc.cuh, one rotation block per
// CUDA thread block).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/random.hpp>
#include <gradcomp/types.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The random sign of element i, +1 or -1, shared by every rank (the D of
/// the randomized Hadamard transform): one Philox call covers 128 elements.
GRADCOMP_HOST_DEVICE float thc_sign(random_stream const& shared, std::size_t i) {
  uint4x32 const words = shared(i / 128);
  unsigned const bit = static_cast<unsigned>(i % 128);
  return bits_float(0x3f800000u | (((word_of(words, bit / 32) >> (bit % 32)) & 1u) << 31));
}

/// The signs of elements [first, first + 128) into signs[0..128), from the
/// words of Philox block first / 128 (first % 128 == 0): thc_sign's values.
GRADCOMP_HOST_DEVICE void thc_signs128(uint4x32 const& words, float* signs) {
  for (unsigned w = 0; w < 4; ++w)  // word by word, bit by bit: shifts and ors, so it vectorizes
    for (unsigned bit = 0; bit < 32; ++bit)
      signs[w * 32 + bit] = bits_float(0x3f800000u | (((words.v[w] >> bit) & 1u) << 31));
}

/// Elements whose rounding noise one Philox call of this rank's stream
/// provides: its 128 bits as eight 16-bit uniforms, one per element for the
/// uniform quantizer, two per element for the table quantizer. (16 bits
/// bias a rounding probability by at most 2^-16 of a level, far below the
/// noise of the rounding itself, and halve the generator's cost.)
GRADCOMP_HOST_DEVICE std::size_t thc_noise_share(bool table) { return table ? 4 : 8; }

/// The uniforms element i rounds with, from the words of Philox block
/// i / thc_noise_share(table).
GRADCOMP_HOST_DEVICE void thc_noise(uint4x32 const& words, std::size_t i, bool table, float& u1, float& u2) {
  if (table) {
    unsigned const pair = static_cast<unsigned>(i % 4) * 2;
    u1 = uniform16(words, pair);
    u2 = uniform16(words, pair + 1);
  } else {
    u1 = uniform16(words, static_cast<unsigned>(i % 8));
    u2 = 0.0f;
  }
}

/// Butterfly p of stage s on a block: elements lo and lo + 2^s become a + b
/// and a - b. Unnormalized (a Walsh-Hadamard matrix of +-1), so a butterfly
/// is an add and a subtract, exact to reorder and fuse across stages, with no
/// multiply a compiler could contract; the orthonormal 2^(-s/2) of s stages
/// is folded into the scale that follows (thc_rotation_scale). Stages on
/// different bits commute, and applying the same stages twice multiplies by
/// 2^s, so the scaled transform is orthonormal and its own inverse.
GRADCOMP_HOST_DEVICE void thc_butterfly(float* block, std::size_t p, int s) {
  std::size_t const low_bits = (std::size_t{1} << s) - 1;
  std::size_t const lo = ((p >> s) << (s + 1)) | (p & low_bits), hi = lo | (std::size_t{1} << s);
  float const a = block[lo], b = block[hi];
  block[lo] = a + b;
  block[hi] = a - b;
}

/// 2^(-stages/2): what makes `stages` unnormalized butterfly stages orthonormal.
inline double thc_rotation_scale(int stages) {
  return std::ldexp(stages % 2 ? 0.70710678118654752440 : 1.0, -(stages / 2));
}

/// acc, or 0 when it is not finite: a bad value (counted, and the step
/// vetoed) must not spread NaN through its block or reach a float-to-integer
/// conversion. A select, so loops vectorize.
GRADCOMP_HOST_DEVICE float thc_finite_or_zero(float acc) { return select(is_finite(acc), acc, 0.0f); }

/// A rotated coordinate back in acc's units: x * backward * sign, in that
/// order on host and device.
GRADCOMP_HOST_DEVICE float thc_restore(float x, float backward, float sign) { return x * backward * sign; }

/// THC's published non-uniform table: 16 values in 0..30, symmetric around
/// 15, R = {0, 3, 5, 7, 9, 11, 13, 14, 16, 17, 19, 21, 23, 25, 27, 30}, read
/// from two 64-bit constants (a byte each) rather than an array a GPU would
/// keep in local memory.
GRADCOMP_HOST_DEVICE int thc_table(int j) {
  constexpr std::uint64_t low = 0x0e0d0b0907050300ull, high = 0x1e1b191715131110ull;
  return static_cast<int>(((j < 8 ? low : high) >> (8 * (j & 7))) & 0xffu);
}

/// z (finite) clamped to [-clamp, clamp], mapped to x in [0, top], then to
/// an unbiased random integer: down or down + 1 with probability x - down.
/// Written so compilers vectorize it: single-step selects, and truncation
/// for floor (x >= 0), since GCC will not vectorize floorf.
GRADCOMP_HOST_DEVICE std::uint32_t thc_round(float z, float u, float clamp, float top) {
  z = z < -clamp ? -clamp : z;
  z = z > clamp ? clamp : z;
  float x = fused(z, top / (2.0f * clamp), top * 0.5f);
  x = x < 0.0f ? 0.0f : x;  // the rounding of z = -T can land a hair below 0
  x = x > top ? top : x;
  std::int32_t const down = static_cast<std::int32_t>(x);
  return static_cast<std::uint32_t>(down + (u < x - static_cast<float>(down) ? 1 : 0));  // in 0..top
}

/// A lane value (or a mean of them) in 0..top back to z in [-clamp, clamp].
GRADCOMP_HOST_DEVICE float thc_unround(float value, float clamp, float top) {
  return fused(value, 2.0f * clamp / top, -clamp);
}

/// How rotated, scaled coordinates become integer lane values and back.
/// `top` is the largest value (uniform: 2^bits - 1; table: 30); z in
/// [-clamp, clamp] maps linearly to x in [0, top].
struct thc_codec {
  float clamp;  // T
  float top;    // largest lane value of one rank
  bool table;   // THC's table (two unbiased roundings) or uniform (one)

  /// z to an unbiased random value in 0..top (one stochastic rounding).
  GRADCOMP_HOST_DEVICE std::uint32_t encode_uniform(float z, float u) const { return thc_round(z, u, clamp, top); }

  /// z to an unbiased random lane value, given two uniforms in [0, 1).
  GRADCOMP_HOST_DEVICE std::uint32_t encode(float z, float u1, float u2) const {
    std::uint32_t const fine = encode_uniform(z, u1);
    if (!table) return fine;
    int j = 0;  // the table interval [R_j, R_j+1] holding fine: how many of R_1..R_14 are <= fine
    for (int m = 1; m < 15; ++m) j += thc_table(m) <= static_cast<int>(fine) ? 1 : 0;
    int const below = thc_table(j), above = thc_table(j + 1);
    float const up = static_cast<float>(static_cast<int>(fine) - below) / static_cast<float>(above - below);
    return static_cast<std::uint32_t>(u2 < up ? above : below);
  }

  /// A lane value (or the mean over ranks of them) back to z.
  GRADCOMP_HOST_DEVICE float decode(float value) const { return thc_unround(value, clamp, top); }
};

}  // namespace gradcomp::detail
