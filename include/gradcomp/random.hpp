// Counter-based random numbers (Philox4x32-10, Salmon et al., SC 2011) and
// the random permutation built on them.
//
// A counter-based generator has no state to carry between calls: the numbers
// for element i are a pure function of (key, counter). gradcomp keys Philox by
// (seed, purpose) and counts by (element index, step, lane), so host loops and
// CUDA kernels of any launch shape draw bit-identical numbers, every rank
// draws the same "shared" numbers (THC's random signs, GlobalRandK's
// coordinates), and each rank draws its own private ones (stochastic
// rounding) by using its rank as the lane. Each purpose has a key of its own,
// so no two uses of one seed ever share numbers.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/philox_lanes.hpp>

#include <cstddef>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI {

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
  std::uint32_t* c = counter.v;
  std::uint32_t k0 = key.v[0], k1 = key.v[1];
  for (int round = 0; round < detail::philox_rounds; ++round) {
    std::uint32_t hi0, hi1;
    std::uint32_t const lo0 = detail::mulhilo32(detail::philox_multiplier0, c[0], hi0);
    std::uint32_t const lo1 = detail::mulhilo32(detail::philox_multiplier1, c[2], hi1);
    uint4x32 const next{{hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0}};
    c[0] = next.v[0], c[1] = next.v[1], c[2] = next.v[2], c[3] = next.v[3];
    k0 += detail::philox_weyl0;
    k1 += detail::philox_weyl1;
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

/// Word w (0..3) of a Philox block, by selects: a run-time index into the
/// block would put it in a GPU's local memory.
GRADCOMP_HOST_DEVICE std::uint32_t word_of(uint4x32 const& words, unsigned w) {
  std::uint32_t const low = (w & 1u) != 0 ? words.v[1] : words.v[0];
  std::uint32_t const high = (w & 1u) != 0 ? words.v[3] : words.v[2];
  return (w & 2u) != 0 ? high : low;
}

/// Uniform j (0..7) of one Philox block read as eight 16-bit uniforms: the
/// low, then the high, half of each word. (Rounding decisions need no more:
/// 16 bits bias a rounding probability by at most 2^-16.) The word is picked
/// by selects, not an indexed load: a run-time j must not put the block in
/// a GPU's local memory.
GRADCOMP_HOST_DEVICE float uniform16(uint4x32 const& words, unsigned j) {
  return to_unit_float16(word_of(words, j / 2) >> (16 * (j & 1u)));
}

/// What a stream of random numbers is for. Each purpose draws from a key of
/// its own, derived from the seed.
enum class random_purpose : std::uint32_t {
  rotation_signs = 1,  ///< THC's random +-1 diagonal, shared by every rank.
  rounding = 2,        ///< Stochastic rounding noise, private to each rank.
  coordinates = 3,     ///< GlobalRandK's coordinate permutation, shared.
  projection = 4,      ///< PowerSGD's initial Q, shared.
};

/// The random numbers of one (key, step, lane) triple, indexed by element.
///
/// Key = 64 bits; counter = (index low, index high, step, lane). Copyable and
/// stateless, so kernels take it by value.
class random_stream {
 public:
  /// Lane for numbers every rank must share.
  static constexpr std::uint32_t shared = 0xffffffffu;

  /// The stream of a raw Philox `key` at `step`; `lane` is a rank for
  /// private noise or `shared`.
  GRADCOMP_HOST_DEVICE random_stream(std::uint64_t key, std::uint32_t step, std::uint32_t lane)
      : key_{{static_cast<std::uint32_t>(key), static_cast<std::uint32_t>(key >> 32)}}, step_(step), lane_(lane) {}

  /// The stream of `purpose` for `seed` at training step `step` (any 64-bit
  /// step: its high half goes into the key), on `lane`.
  static random_stream derive(std::uint64_t seed, random_purpose purpose, std::uint64_t step, std::uint32_t lane) {
    std::uint64_t const key =
        detail::mix64(seed ^ detail::mix64(static_cast<std::uint64_t>(purpose) << 32 | (step >> 32)));
    return {key, static_cast<std::uint32_t>(step), lane};
  }

  /// The four random words of block `index`.
  GRADCOMP_HOST_DEVICE uint4x32 operator()(std::uint64_t index) const {
    uint4x32 const counter{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32), step_, lane_}};
    return philox4x32_10(counter, key_);
  }

  /// The words of blocks [first, first + count) into out[0, count) on the
  /// host: operator()'s, computed in vector lanes where the target has them
  /// (detail/philox_lanes.hpp: 32 calls at a time with AVX-512, 8 with AVX2).
  void blocks(std::uint64_t first, std::size_t count, uint4x32* out) const {
    std::size_t k = 0;
#if GRADCOMP_HOST_PHILOX_LANES > 0
    static_assert(sizeof(uint4x32) == 4 * sizeof(std::uint32_t), "blocks are stored as runs of words");
    k = lanes<detail::philox_groups>(first, 0, count, out);
    k = lanes<1>(first, k, count, out);  // (the rest, a vector at a time)
#endif
    for (; k < count; ++k) out[k] = (*this)(first + k);
  }

  /// A float uniform on [0, 1) for element `index` (one Philox call per
  /// element; loops that need four numbers per call use operator()).
  GRADCOMP_HOST_DEVICE float uniform(std::uint64_t index) const { return to_unit_float((*this)(index).v[0]); }

 private:
#if GRADCOMP_HOST_PHILOX_LANES > 0
  // blocks() from k on, G vectors of calls at a time while whole ones fit
  // and the index's high word stays the same; returns where it stopped.
  template <int G>
  std::size_t lanes(std::uint64_t first, std::size_t k, std::size_t count, uint4x32* out) const {
    constexpr std::size_t calls = G * detail::philox_vector_calls;
    for (; k + calls <= count; k += calls) {
      std::uint64_t const index = first + k;
      if (index >> 32 != (index + calls - 1) >> 32) break;  // (the high word changes inside: one by one)
      detail::philox_in_lanes<G>(key_.v[0], key_.v[1], static_cast<std::uint32_t>(index),
                                 static_cast<std::uint32_t>(index >> 32), step_, lane_,
                                 reinterpret_cast<std::uint32_t*>(out + k));
    }
    return k;
  }
#endif

  uint2x32 key_;
  std::uint32_t step_;
  std::uint32_t lane_;
};

/// A random bijection of [0, n) drawn from a stream: a four-round balanced
/// Feistel network on the smallest 2^(2h) >= n, cycle-walking past n (a few
/// steps on average). Its first K images are K distinct random elements;
/// from a shared stream every rank computes the same ones.
struct random_permutation {
  std::uint64_t n;        ///< Size of the permuted range.
  int half_bits;          ///< h: each Feistel half has h bits.
  std::uint32_t keys[4];  ///< Round keys, from the stream's block 0.

  /// The permutation of [0, n) that `stream` draws.
  static random_permutation make(std::uint64_t n, random_stream const& stream) {
    int bits = 2;
    while (bits < 64 && (std::uint64_t{1} << bits) < n) bits += 2;
    uint4x32 const words = stream(0);
    return {n, bits / 2, {words.v[0], words.v[1], words.v[2], words.v[3]}};
  }
  /// A 32-bit integer hash (the Feistel round function).
  GRADCOMP_HOST_DEVICE static std::uint32_t mix(std::uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    return x ^ (x >> 16);
  }
  /// One pass of the Feistel network over [0, 2^(2h)).
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
  /// The image of k in [0, n).
  GRADCOMP_HOST_DEVICE std::uint64_t operator()(std::uint64_t k) const {
    std::uint64_t x = once(k);
    while (x >= n) x = once(x);
    return x;
  }
};

}  // namespace gradcomp
