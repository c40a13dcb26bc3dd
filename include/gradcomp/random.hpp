// Counter-based random numbers (Philox4x32-10, Salmon et al., SC 2011).
//
// A counter-based generator has no state to carry between calls: the numbers
// for element i are a pure function of (key, counter). gradcomp keys Philox by
// (seed, step, stream id) and counts by element index, so host loops and CUDA
// kernels of any launch shape draw bit-identical numbers, every rank draws the
// same "shared" numbers (e.g. THC's random signs), and each rank draws its own
// private ones (stochastic rounding) by using its rank as the stream id.
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>

namespace gradcomp {

/// Four 32-bit words: a Philox counter or output block.
struct uint4x32 {
  std::uint32_t v[4];  ///< The words, v[0] first.
};

/// Two 32-bit words: a Philox key.
struct uint2x32 {
  std::uint32_t v[2];  ///< The words, v[0] first.
};

namespace detail {

GRADCOMP_HOST_DEVICE std::uint32_t mulhilo32(std::uint32_t a, std::uint32_t b, std::uint32_t& hi) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  return a * b;
#else
  std::uint64_t const product = static_cast<std::uint64_t>(a) * b;
  hi = static_cast<std::uint32_t>(product >> 32);
  return static_cast<std::uint32_t>(product);
#endif
}

}  // namespace detail

/// Philox4x32 with 10 rounds: the Random123 reference function.
GRADCOMP_HOST_DEVICE uint4x32 philox4x32_10(uint4x32 counter, uint2x32 key) {
  constexpr std::uint32_t multiplier0 = 0xD2511F53u, multiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t weyl0 = 0x9E3779B9u, weyl1 = 0xBB67AE85u;
  std::uint32_t* c = counter.v;
  std::uint32_t k0 = key.v[0], k1 = key.v[1];
  for (int round = 0; round < 10; ++round) {
    std::uint32_t hi0, hi1;
    std::uint32_t const lo0 = detail::mulhilo32(multiplier0, c[0], hi0);
    std::uint32_t const lo1 = detail::mulhilo32(multiplier1, c[2], hi1);
    uint4x32 const next{{hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0}};
    c[0] = next.v[0], c[1] = next.v[1], c[2] = next.v[2], c[3] = next.v[3];
    k0 += weyl0;
    k1 += weyl1;
  }
  return counter;
}

/// Maps 32 random bits to a float uniform on [0, 1), using the top 24 bits so
/// every value is exactly representable.
GRADCOMP_HOST_DEVICE float to_unit_float(std::uint32_t bits) { return static_cast<float>(bits >> 8) * 0x1.0p-24f; }
/// The low 16 bits as a uniform in [0, 1), on a 2^-16 grid (exact in float).
GRADCOMP_HOST_DEVICE float to_unit_float16(std::uint32_t bits) {
  return static_cast<float>(bits & 0xffffu) * 0x1.0p-16f;
}

/// Uniform j (0..7) of one Philox block read as eight 16-bit uniforms: the
/// low, then the high, half of each word. (Rounding decisions need no more:
/// 16 bits bias a rounding probability by at most 2^-16.)
GRADCOMP_HOST_DEVICE float uniform16(uint4x32 const& words, unsigned j) {
  return to_unit_float16(words.v[j / 2] >> (16 * (j % 2)));
}

/// The random numbers of one (seed, step, stream) triple, indexed by element.
///
/// Key = seed (64 bits); counter = (index low, index high, step, stream).
/// Copyable and stateless, so kernels take it by value.
class random_stream {
 public:
  /// Stream id for numbers every rank must share (e.g. a random rotation).
  static constexpr std::uint32_t shared = 0xffffffffu;

  /// The stream for `seed` at training step `step`; `stream` is a rank for
  /// private noise or `shared`.
  GRADCOMP_HOST_DEVICE random_stream(std::uint64_t seed, std::uint32_t step, std::uint32_t stream)
      : key_{{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}},
        step_(step),
        stream_(stream) {}

  /// The four random words of block `index`.
  GRADCOMP_HOST_DEVICE uint4x32 operator()(std::uint64_t index) const {
    uint4x32 const counter{
        {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), step_, stream_}};
    return philox4x32_10(counter, key_);
  }

  /// A float uniform on [0, 1) for element `index` (one Philox call per
  /// element; loops that need four numbers per call use operator()).
  GRADCOMP_HOST_DEVICE float uniform(std::uint64_t index) const { return to_unit_float((*this)(index).v[0]); }

 private:
  uint2x32 key_;
  std::uint32_t step_;
  std::uint32_t stream_;
};

}  // namespace gradcomp
