// Philox4x32-10 on the host, one call per 64-bit vector lane: 32 calls at a
// time with AVX-512 (four vectors in flight), 8 with AVX2. A compiler
// vectorizes the scalar function across calls by itself, but widens each
// 32 x 32-bit product to a 64-bit multiply (three micro-ops on AVX-512);
// here one even-lane multiply gives each product in place, and a run of
// rounding noise costs about a third as much (one core, 8M calls: 48 ms
// before, 15 now). Integer arithmetic: the words are bitwise the scalar
// function's.
//
// Translation units of one program must target the same instruction set, as
// with any header-only library: the linker keeps one copy of each inline
// function.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <cstdint>

// (Not under nvcc, whose front end takes neither the unroll pragmas nor,
// with every host compiler, the AVX-512 intrinsics: its host code draws one
// call at a time, the same words.)
// GRADCOMP_HOST_PHILOX_LANES: a vector's 32-bit lanes (0: no vector path).
#if defined(__AVX512F__) && !defined(__CUDACC__)
#include <immintrin.h>
#define GRADCOMP_HOST_PHILOX_LANES 16
#elif defined(__AVX2__) && !defined(__CUDACC__)
#include <immintrin.h>
#define GRADCOMP_HOST_PHILOX_LANES 8
#else
#define GRADCOMP_HOST_PHILOX_LANES 0  // (the scalar function serves)
#endif

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Philox4x32's round multipliers and key increments (Random123's).
inline constexpr std::uint32_t philox_multiplier0 = 0xD2511F53u, philox_multiplier1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_weyl0 = 0x9E3779B9u, philox_weyl1 = 0xBB67AE85u;
inline constexpr int philox_rounds = 10;

// A vector holds one word of several calls, one call per 64-bit lane, in the
// lane's low half (the high half is ignored): the even-lane multiply then
// gives each call's 64-bit product in place, its low word where the next
// round reads it and its high word one shuffle away.
#if GRADCOMP_HOST_PHILOX_LANES == 16
GRADCOMP_AVX512_BEGIN
using philox_vector = __m512i;
inline constexpr std::size_t philox_vector_calls = 8;
inline constexpr int philox_groups = 4;  // vectors in flight together (a round waits on a multiply's latency)

inline __m512i philox_set1(std::uint32_t x) { return _mm512_set1_epi64(x); }
inline __m512i philox_counters(std::uint32_t from) {  // from + j in lane j
  return _mm512_add_epi64(philox_set1(from), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
}
inline __m512i philox_product(__m512i a, __m512i m) { return _mm512_mul_epu32(a, m); }
inline __m512i philox_high(__m512i product) {  // the high word into the low half
  return _mm512_shuffle_epi32(product, static_cast<_MM_PERM_ENUM>(0xF5));
}
inline __m512i philox_xor3(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }

/// The calls' four words to out (16 bytes per call, lane order).
inline void philox_store(__m512i c0, __m512i c1, __m512i c2, __m512i c3, std::uint32_t* out) {
  __m512i const w01 = _mm512_mask_blend_epi32(0xAAAA, c0, _mm512_slli_epi64(c1, 32));  // words 0 and 1 per call
  __m512i const w23 = _mm512_mask_blend_epi32(0xAAAA, c2, _mm512_slli_epi64(c3, 32));
  _mm512_storeu_si512(out, _mm512_permutex2var_epi64(w01, _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), w23));
  _mm512_storeu_si512(out + 16, _mm512_permutex2var_epi64(w01, _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15), w23));
}
GRADCOMP_AVX512_END
#elif GRADCOMP_HOST_PHILOX_LANES == 8
using philox_vector = __m256i;
inline constexpr std::size_t philox_vector_calls = 4;
inline constexpr int philox_groups = 2;  // (16 vector registers)

inline __m256i philox_set1(std::uint32_t x) { return _mm256_set1_epi64x(x); }
inline __m256i philox_counters(std::uint32_t from) {
  return _mm256_add_epi64(philox_set1(from), _mm256_setr_epi64x(0, 1, 2, 3));
}
inline __m256i philox_product(__m256i a, __m256i m) { return _mm256_mul_epu32(a, m); }
inline __m256i philox_high(__m256i product) { return _mm256_shuffle_epi32(product, 0xF5); }
inline __m256i philox_xor3(__m256i a, __m256i b, __m256i c) { return _mm256_xor_si256(_mm256_xor_si256(a, b), c); }

inline void philox_store(__m256i c0, __m256i c1, __m256i c2, __m256i c3, std::uint32_t* out) {
  __m256i const w01 = _mm256_blend_epi32(c0, _mm256_slli_epi64(c1, 32), 0xAA);
  __m256i const w23 = _mm256_blend_epi32(c2, _mm256_slli_epi64(c3, 32), 0xAA);
  __m256i const even = _mm256_unpacklo_epi64(w01, w23), odd = _mm256_unpackhi_epi64(w01, w23);  // calls 0, 2 and 1, 3
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permute2x128_si256(even, odd, 0x20));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 8), _mm256_permute2x128_si256(even, odd, 0x31));
}
#endif

#if GRADCOMP_HOST_PHILOX_LANES > 0
/// The G x philox_vector_calls calls of the counters (index_low + j,
/// index_high, step, lane) (no carry into the high word), their words to
/// out[4 j ..]: philox4x32_10's, bit for bit. G = philox_groups for long
/// runs; G = 1 for short ones (THC's signs: 8 calls a block).
template <int G>
void philox_in_lanes(std::uint32_t k0, std::uint32_t k1, std::uint32_t index_low, std::uint32_t index_high,
                     std::uint32_t step, std::uint32_t lane, std::uint32_t* out) {
  philox_vector const m0 = philox_set1(philox_multiplier0), m1 = philox_set1(philox_multiplier1);
  philox_vector c0[G], c1[G], c2[G], c3[G];  // (the loops over g unrolled, so these stay in registers)
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) {
    c0[g] = philox_counters(index_low + static_cast<std::uint32_t>(g * philox_vector_calls));
    c1[g] = philox_set1(index_high);
    c2[g] = philox_set1(step);
    c3[g] = philox_set1(lane);
  }
  for (int round = 0; round < philox_rounds; ++round) {
    philox_vector const key0 = philox_set1(k0), key1 = philox_set1(k1);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      philox_vector const p0 = philox_product(c0[g], m0), p1 = philox_product(c2[g], m1);
      c0[g] = philox_xor3(philox_high(p1), c1[g], key0);
      c1[g] = p1;
      c2[g] = philox_xor3(philox_high(p0), c3[g], key1);
      c3[g] = p0;
    }
    k0 += philox_weyl0;
    k1 += philox_weyl1;
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g) philox_store(c0[g], c1[g], c2[g], c3[g], out + 4 * philox_vector_calls * g);
}
#endif

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
