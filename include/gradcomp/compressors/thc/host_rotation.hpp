// THC's rotation on the host: the first `stages` Walsh-Hadamard butterfly
// stages of one block, exactly thc_butterfly's additions pair by pair (the
// same bits as the device). In vector registers where the target has 256-bit
// vectors (FFHT's scheme), two stages a pass over memory otherwise.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// One butterfly stage over a host block, pairs `half` apart, in runs of
/// `half` contiguous pairs: thc_butterfly's arithmetic, pair for pair. A
/// compile-time Half lets the compiler vectorize the short strides.
template <std::size_t Half>
void host_stage(float* block, std::size_t size, std::size_t half = Half) {
  for (std::size_t base = 0; base < size; base += 2 * half) {
    float* __restrict lo = block + base;
    float* __restrict hi = block + base + half;
    for (std::size_t j = 0; j < half; ++j) {
      float const a = lo[j], b = hi[j];
      lo[j] = a + b;
      hi[j] = a - b;
    }
  }
}

/// Two stages (pairs `half`, then 2 `half` apart) in one pass over the block:
/// the same adds and subtracts as two host_stage calls, so the same bits,
/// with half the loads and stores.
template <std::size_t Half>
void host_stage_pair(float* block, std::size_t size, std::size_t half = Half) {
  for (std::size_t base = 0; base < size; base += 4 * half) {
    float* __restrict q0 = block + base;
    float* __restrict q1 = q0 + half;
    float* __restrict q2 = q1 + half;
    float* __restrict q3 = q2 + half;
    for (std::size_t j = 0; j < half; ++j) {
      float const a = q0[j], b = q1[j], c = q2[j], d = q3[j];
      float const ab = a + b, a_b = a - b, cd = c + d, c_d = c - d;
      q0[j] = ab + cd;
      q2[j] = ab - cd;
      q1[j] = a_b + c_d;
      q3[j] = a_b - c_d;
    }
  }
}

/// The first `stages` butterfly stages on a host block, two per pass.
inline void host_rotate_pairs(float* block, std::size_t size, int stages) {
  int s = 0;
  for (; s + 2 <= stages; s += 2) {
    switch (s) {
      case 0:
        host_stage_pair<1>(block, size);
        break;
      case 2:
        host_stage_pair<4>(block, size);
        break;
      default:
        host_stage_pair<0>(block, size, std::size_t{1} << s);
        break;
    }
  }
  if (s < stages) {
    switch (s) {
      case 0:
        host_stage<1>(block, size);
        break;
      case 2:
        host_stage<4>(block, size);
        break;
      default:
        host_stage<0>(block, size, std::size_t{1} << s);
        break;
    }
  }
}

#if defined(__CUDACC__) || !defined(__AVX__)
/// The first `stages` butterfly stages on a host block, two per pass: under
/// nvcc, and for targets without 256-bit vectors (where the register form
/// below would be split in halves); the register form is the same arithmetic.
inline void host_rotate(float* block, std::size_t size, int stages) { host_rotate_pairs(block, size, stages); }
#else
/// Eight floats in a vector register (GCC and clang vector extensions).
typedef float thc_v8 __attribute__((vector_size(32)));

inline thc_v8 thc_load8(float const* p) {
  thc_v8 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void thc_store8(float* p, thc_v8 v) { __builtin_memcpy(p, &v, sizeof v); }

/// Stage S (pairs 1, 2 or 4 lanes apart) within a register: the lower lane
/// of a pair gets a + b, the upper a - b. With p the register's pairs
/// swapped, that is x * (+-1) + p: the product by +-1 is exact, so one
/// rounding whether or not the compiler fuses it, the bits of a + b and of
/// b' - a' (one permute and one multiply-add where a blend form needs four).
template <int S>
inline thc_v8 thc_stage_within(thc_v8 x) {
  if constexpr (S == 0)
    return x * thc_v8{1, -1, 1, -1, 1, -1, 1, -1} + __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6);
  else if constexpr (S == 1)
    return x * thc_v8{1, 1, -1, -1, 1, 1, -1, -1} + __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5);
  else
    return x * thc_v8{1, 1, 1, 1, -1, -1, -1, -1} + __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3);
}

/// Count stages (up to 3) across registers r[0, N) held in registers, pairs
/// 1, 2, 4 registers apart: a radix-8 butterfly where N is 8.
template <int Count, int N = (1 << Count)>
inline void thc_stages_across(thc_v8* r) {
  [&]<int... T>(std::integer_sequence<int, T...>) {
    auto stage = [&]<int Half>(std::integral_constant<int, Half>) {
      GRADCOMP_PRAGMA(GCC unroll 8)
      for (int j = 0; j < N; ++j)
        if ((j & Half) == 0) {
          thc_v8 const a = r[j], b = r[j + Half];
          r[j] = a + b;
          r[j + Half] = a - b;
        }
    };
    (stage(std::integral_constant<int, 1 << T>{}), ...);
  }
  (std::make_integer_sequence<int, Count>{});
}

/// The first Within + Across stages (Within <= 3; Across <= 3 only when
/// Within is 3) over each run of 64 floats: Within inside each register,
/// Across across the run's eight.
template <int Within, int Across>
inline void thc_first_stages(float* block, std::size_t size) {
  for (std::size_t run = 0; run < size; run += 64) {
    thc_v8 r[8];  // (the loops unroll, so r stays in registers)
    GRADCOMP_PRAGMA(GCC unroll 8)
    for (int k = 0; k < 8; ++k) {
      r[k] = thc_load8(block + run + 8 * k);
      if constexpr (Within > 0) r[k] = thc_stage_within<0>(r[k]);
      if constexpr (Within > 1) r[k] = thc_stage_within<1>(r[k]);
      if constexpr (Within > 2) r[k] = thc_stage_within<2>(r[k]);
    }
    if constexpr (Across > 0) thc_stages_across<Across, 8>(r);
    GRADCOMP_PRAGMA(GCC unroll 8)
    for (int k = 0; k < 8; ++k) thc_store8(block + run + 8 * k, r[k]);
  }
}

/// Count stages (up to 3) from stage s >= 3 on: registers 2^s floats apart.
template <int Count>
inline void thc_later_stages(float* block, std::size_t size, int s) {
  std::size_t const stride = std::size_t{1} << s, span = stride << Count;
  for (std::size_t base = 0; base < size; base += span)
    for (std::size_t o = base; o < base + stride; o += 8) {
      thc_v8 r[1 << Count];
      GRADCOMP_PRAGMA(GCC unroll 8)
      for (int k = 0; k < (1 << Count); ++k) r[k] = thc_load8(block + o + k * stride);
      thc_stages_across<Count>(r);
      GRADCOMP_PRAGMA(GCC unroll 8)
      for (int k = 0; k < (1 << Count); ++k) thc_store8(block + o + k * stride, r[k]);
    }
}

/// The first `stages` butterfly stages on a host block: stage s pairs
/// elements 2^s apart, the lower getting a + b, the upper a - b, exactly as
/// thc_butterfly does pair by pair (the same additions in the same order, so
/// the same bits). A block of 64 floats or more runs in vector registers
/// (FFHT's scheme): the first six stages in one pass over each run of 64
/// (three inside each register, three across eight), then up to three
/// stages a pass over registers 2^s floats apart. Smaller blocks take two
/// stages a pass.
inline void host_rotate(float* block, std::size_t size, int stages) {
  if (size < 64) return host_rotate_pairs(block, size, stages);
  switch (stages < 6 ? stages : 6) {
    case 0:
      break;
    case 1:
      thc_first_stages<1, 0>(block, size);
      break;
    case 2:
      thc_first_stages<2, 0>(block, size);
      break;
    case 3:
      thc_first_stages<3, 0>(block, size);
      break;
    case 4:
      thc_first_stages<3, 1>(block, size);
      break;
    case 5:
      thc_first_stages<3, 2>(block, size);
      break;
    default:
      thc_first_stages<3, 3>(block, size);
      break;
  }
  for (int s = 6; s < stages; s += 3) {
    if (stages - s >= 3)
      thc_later_stages<3>(block, size, s);
    else if (stages - s == 2)
      thc_later_stages<2>(block, size, s);
    else
      thc_later_stages<1>(block, size, s);
  }
}
#endif

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
