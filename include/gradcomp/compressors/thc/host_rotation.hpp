// THC's rotation on the host: the first `stages` Walsh-Hadamard butterfly
// stages of one block, exactly thc_butterfly's additions pair by pair (the
// same bits as the device). In vector registers where the target has 256-bit
// or 512-bit vectors (FFHT's scheme), two stages a pass over memory otherwise.
#pragma once

#include <gradcomp/config.hpp>

#include <bit>
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
/// W floats in a vector register (GCC and clang vector extensions): 8 in a
/// 256-bit register, 16 in an AVX-512 one.
template <int W>
struct thc_lanes;
template <>
struct thc_lanes<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct thc_lanes<16> {
  typedef float type __attribute__((vector_size(64)));
};
template <int W>
using thc_vec = typename thc_lanes<W>::type;

/// The widest register the target has.
#if defined(__AVX512F__)
inline constexpr int thc_width = 16;
#else
inline constexpr int thc_width = 8;
#endif

template <int W>
inline thc_vec<W> thc_load(float const* p) {
  thc_vec<W> v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
template <int W>
inline void thc_store(float* p, thc_vec<W> v) {
  __builtin_memcpy(p, &v, sizeof v);
}

/// Stage S (pairs 2^S lanes apart) within a register: the lower lane of a
/// pair gets a + b, the upper a - b. With p the register's pairs swapped,
/// that is x * (+-1) + p: the product by +-1 is exact, so one rounding
/// whether or not the compiler fuses it, the bits of a + b and of b' - a'
/// (one permute and one multiply-add where a blend form needs four).
template <int W, int S>
inline thc_vec<W> thc_stage_within(thc_vec<W> x) {
  return [&]<int... L>(std::integer_sequence<int, L...>) {
    return x * thc_vec<W>{(((L >> S) & 1) != 0 ? -1.0f : 1.0f)...} + __builtin_shufflevector(x, x, (L ^ (1 << S))...);
  }
  (std::make_integer_sequence<int, W>{});
}

/// Count stages (up to 3) across registers r[0, N) held in registers, pairs
/// 1, 2, 4 registers apart: a radix-8 butterfly where N is 8.
template <int W, int Count, int N = (1 << Count)>
inline void thc_stages_across(thc_vec<W>* r) {
  [&]<int... T>(std::integer_sequence<int, T...>) {
    auto stage = [&]<int Half>(std::integral_constant<int, Half>) {
      GRADCOMP_PRAGMA(GCC unroll 8)
      for (int j = 0; j < N; ++j)
        if ((j & Half) == 0) {
          thc_vec<W> const a = r[j], b = r[j + Half];
          r[j] = a + b;
          r[j + Half] = a - b;
        }
    };
    (stage(std::integral_constant<int, 1 << T>{}), ...);
  }
  (std::make_integer_sequence<int, Count>{});
}

/// The first Within + Across stages (Across only once Within is all of a
/// register's, log2 W) over each run of 8 W floats: Within inside each
/// register, Across (up to 3) across the run's eight.
template <int W, int Within, int Across>
inline void thc_first_stages(float* block, std::size_t size) {
  for (std::size_t run = 0; run < size; run += 8 * W) {
    thc_vec<W> r[8];  // (the loops unroll, so r stays in registers)
    GRADCOMP_PRAGMA(GCC unroll 8)
    for (int k = 0; k < 8; ++k) {
      r[k] = thc_load<W>(block + run + W * k);
      [&]<int... S>(std::integer_sequence<int, S...>) { ((r[k] = thc_stage_within<W, S>(r[k])), ...); }
      (std::make_integer_sequence<int, Within>{});
    }
    if constexpr (Across > 0) thc_stages_across<W, Across, 8>(r);
    GRADCOMP_PRAGMA(GCC unroll 8)
    for (int k = 0; k < 8; ++k) thc_store<W>(block + run + W * k, r[k]);
  }
}

/// Count stages (up to 3) from stage s on, for 2^s >= W: registers 2^s
/// floats apart.
template <int W, int Count>
inline void thc_later_stages(float* block, std::size_t size, int s) {
  std::size_t const stride = std::size_t{1} << s, span = stride << Count;
  for (std::size_t base = 0; base < size; base += span)
    for (std::size_t o = base; o < base + stride; o += W) {
      thc_vec<W> r[1 << Count];
      GRADCOMP_PRAGMA(GCC unroll 8)
      for (int k = 0; k < (1 << Count); ++k) r[k] = thc_load<W>(block + o + k * stride);
      thc_stages_across<W, Count>(r);
      GRADCOMP_PRAGMA(GCC unroll 8)
      for (int k = 0; k < (1 << Count); ++k) thc_store<W>(block + o + k * stride, r[k]);
    }
}

/// thc_first_stages for a count of stages known only at run time (1 to
/// log2 W + 3).
template <int W, int First = 1>
inline void thc_first_stages(float* block, std::size_t size, int count) {
  constexpr int within = std::countr_zero(unsigned{W});
  if constexpr (First <= within + 3) {
    if (count == First)
      thc_first_stages<W, (First < within ? First : within), (First < within ? 0 : First - within)>(block, size);
    else
      thc_first_stages<W, First + 1>(block, size, count);
  }
}

/// The first `stages` stages on a block of at least 8 W floats: the first
/// log2 W + 3 in one pass over each run of 8 W floats (inside each register,
/// then across eight), then up to three a pass over registers 2^s floats
/// apart.
template <int W>
inline void thc_rotate_in_registers(float* block, std::size_t size, int stages) {
  constexpr int first = std::countr_zero(unsigned{W}) + 3;
  if (stages > 0) thc_first_stages<W>(block, size, stages < first ? stages : first);
  for (int s = first; s < stages; s += 3) {
    if (stages - s >= 3)
      thc_later_stages<W, 3>(block, size, s);
    else if (stages - s == 2)
      thc_later_stages<W, 2>(block, size, s);
    else
      thc_later_stages<W, 1>(block, size, s);
  }
}

/// The first `stages` butterfly stages on a host block: stage s pairs
/// elements 2^s apart, the lower getting a + b, the upper a - b, exactly as
/// thc_butterfly does pair by pair (the same additions in the same order, so
/// the same bits). A block of 64 floats or more runs in vector registers
/// (FFHT's scheme), 16 floats to a register from 128 floats on where the
/// target has AVX-512 (the first seven stages, then three a pass: a block of
/// 1024 in two passes), else 8 (the first six, then three a pass). Smaller
/// blocks take two stages a pass.
inline void host_rotate(float* block, std::size_t size, int stages) {
  if (size >= 8 * thc_width) return thc_rotate_in_registers<thc_width>(block, size, stages);
  if (size >= 64) return thc_rotate_in_registers<8>(block, size, stages);
  host_rotate_pairs(block, size, stages);
}
#endif

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
