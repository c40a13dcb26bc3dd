// Runs of floats narrowed to 16 bits, and widened back, on the host: the
// conversions of types.hpp, element for element and bit for bit, with the
// CPU's conversion instructions where the compiler targets them (F16C for
// half: -mf16c, -march=x86-64-v3 and above). A compiler does not vectorize
// those conversions by itself (GCC 12 emits one scalar instruction per
// element even for AVX512-FP16), and the integer rounding of the portable
// path costs an fp16 pass about twice a bf16 one.
//
// Only NaN needs care: the instructions make a NaN quiet and keep its
// payload, where the portable path makes every NaN the canonical one
// (narrowing) or keeps it as it is (widening); those lanes take the portable
// result. bfloat16 keeps the portable integer rounding everywhere: AVX512-BF16's
// instruction reads subnormal floats as zero, so parity would need the
// integer path on those lanes anyway, and that path is already a few vector
// integer operations.
//
// Translation units of one program must target the same instruction set, as
// with any header-only library: the linker keeps one copy of each inline
// function.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#if defined(__F16C__) && defined(__AVX2__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#define GRADCOMP_HOST_F16C 1
#else
#define GRADCOMP_HOST_F16C 0
#endif
#if GRADCOMP_HOST_F16C && defined(__AVX512F__)  // (sixteen lanes: AVX512F's conversions)
#define GRADCOMP_HOST_AVX512_F16 1
#else
#define GRADCOMP_HOST_AVX512_F16 0
#endif

namespace gradcomp::inline GRADCOMP_ABI::detail {

GRADCOMP_AVX512_BEGIN

/// out[k] = T(in[k]) for k < n (T: bfloat16 or half).
template <class T>
inline void narrow_run(float const* in, T* out, std::size_t n) {
  std::size_t k = 0;
#if GRADCOMP_HOST_F16C
  if constexpr (std::is_same_v<T, half>) {
    __m256 const sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
    // (NaN lanes become the quiet NaN with their sign, which narrows to the
    // portable path's 0x7e00 and sign)
    __m256 const quiet = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
#if GRADCOMP_HOST_AVX512_F16
    __m512 const sign16 = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(0x80000000u)));
    __m512 const quiet16 = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000));
    for (; k + 16 <= n; k += 16) {  // the same, sixteen at a time
      __m512 x = _mm512_loadu_ps(in + k);
      __mmask16 const nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      x = _mm512_mask_blend_ps(nan, x, _mm512_or_ps(_mm512_and_ps(x, sign16), quiet16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k),
                          _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; k + 8 <= n; k += 8) {
      __m256 x = _mm256_loadu_ps(in + k);
      __m256 const nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
      x = _mm256_blendv_ps(x, _mm256_or_ps(_mm256_and_ps(x, sign), quiet), nan);
      __m128i const h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), h);
    }
  }
#endif
  for (; k < n; ++k) out[k] = T(in[k]);
}

/// out[k] = float(in[k]) for k < n (T: bfloat16 or half).
template <class T>
inline void widen_run(T const* in, float* out, std::size_t n) {
  std::size_t k = 0;
#if GRADCOMP_HOST_F16C
  if constexpr (std::is_same_v<T, half>) {
    __m128i const exponent = _mm_set1_epi16(0x7c00);
#if GRADCOMP_HOST_AVX512_F16
    __m256i const exponent16 = _mm256_set1_epi16(0x7c00);
    for (; k + 16 <= n; k += 16) {  // the same, sixteen at a time
      __m256i const h = _mm256_loadu_si256(reinterpret_cast<__m256i const*>(in + k));
      if (_mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_and_si256(h, exponent16), exponent16)) != 0) {
        for (std::size_t j = k; j < k + 16; ++j) out[j] = static_cast<float>(in[j]);
        continue;
      }
      _mm512_storeu_ps(out + k, _mm512_cvtph_ps(h));
    }
#endif
    for (; k + 8 <= n; k += 8) {
      __m128i const h = _mm_loadu_si128(reinterpret_cast<__m128i const*>(in + k));
      // Infinity or NaN among the eight (rare): the portable path, which keeps
      // a NaN's bits as they are, where the instruction sets its quiet bit.
      if (_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent)) != 0) {
        for (std::size_t j = k; j < k + 8; ++j) out[j] = static_cast<float>(in[j]);
        continue;
      }
      _mm256_storeu_ps(out + k, _mm256_cvtph_ps(h));
    }
  }
#endif
  for (; k < n; ++k) out[k] = static_cast<float>(in[k]);
}

GRADCOMP_AVX512_END

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
