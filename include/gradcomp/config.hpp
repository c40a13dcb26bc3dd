// Build configuration shared by every gradcomp header: host/device markers,
// what this translation unit was compiled with, and the ABI namespace.
#pragma once

#include <gradcomp/version.hpp>

/// Marks a function usable from host and device code. Under a plain C++
/// compiler it is an ordinary inline function, so the math headers compile
/// with g++ and with nvcc alike.
#if defined(__CUDACC__)
#define GRADCOMP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define GRADCOMP_HOST_DEVICE inline
#endif

/// 1 when this program uses the CUDA runtime: under nvcc, or when the build
/// defines GRADCOMP_WITH_CUDA (the CMake targets gradcomp::cuda and
/// gradcomp::nccl do, for every language). It declares the CUDA execution
/// space; kernels still need nvcc. Programs that mix .cpp and .cu files link
/// gradcomp::cuda so that all their translation units agree.
#if defined(__CUDACC__) || defined(GRADCOMP_WITH_CUDA)
#define GRADCOMP_HAS_CUDA 1
#else
#define GRADCOMP_HAS_CUDA 0
#endif

/// 1 when this translation unit is compiled with OpenMP: the host space then
/// runs its loops on all threads, otherwise serially.
#if defined(_OPENMP)
#define GRADCOMP_HAS_OPENMP 1
#else
#define GRADCOMP_HAS_OPENMP 0
#endif

/// Pragmas for the host loops; empty without OpenMP so compilers stay quiet.
#define GRADCOMP_PRAGMA(x) _Pragma(#x)
#if GRADCOMP_HAS_OPENMP
#define GRADCOMP_OMP(x) GRADCOMP_PRAGMA(omp x)
#else
#define GRADCOMP_OMP(x)
#endif

/// Around host code with AVX-512 intrinsics: GCC 12 reports those
/// intrinsics' undefined pass-through operands as (maybe) uninitialized once
/// they are inlined (GCC bug 105593), in code that uses none.
#if defined(__GNUC__) && !defined(__clang__)
#define GRADCOMP_AVX512_BEGIN                               \
  GRADCOMP_PRAGMA(GCC diagnostic push)                      \
  GRADCOMP_PRAGMA(GCC diagnostic ignored "-Wuninitialized") \
  GRADCOMP_PRAGMA(GCC diagnostic ignored "-Wmaybe-uninitialized")
#define GRADCOMP_AVX512_END GRADCOMP_PRAGMA(GCC diagnostic pop)
#else
#define GRADCOMP_AVX512_BEGIN
#define GRADCOMP_AVX512_END
#endif

// The ABI namespace. Everything gradcomp declares lives in an inline
// namespace named after the version and the configuration (CUDA on or off,
// OpenMP on or off). Code says gradcomp::foo as usual, but translation units
// compiled differently see different entities: passing a gradcomp type
// between them fails to link instead of silently breaking the one-definition
// rule (a host_space that runs OpenMP loops in one file and serial ones in
// another, say).
#define GRADCOMP_ABI_JOIN_(version, cuda, omp) abi_##version##_##cuda##_##omp
#define GRADCOMP_ABI_JOIN(version, cuda, omp) GRADCOMP_ABI_JOIN_(version, cuda, omp)
#if GRADCOMP_HAS_CUDA
#define GRADCOMP_ABI_CUDA cuda
#else
#define GRADCOMP_ABI_CUDA nocuda
#endif
#if GRADCOMP_HAS_OPENMP
#define GRADCOMP_ABI_OPENMP omp
#else
#define GRADCOMP_ABI_OPENMP noomp
#endif
/// The inline namespace's name, e.g. abi_v0_3_0_cuda_omp.
#define GRADCOMP_ABI GRADCOMP_ABI_JOIN(GRADCOMP_VERSION_TAG, GRADCOMP_ABI_CUDA, GRADCOMP_ABI_OPENMP)

namespace gradcomp::inline GRADCOMP_ABI::detail {
/// False, but only once T is known: for static_asserts in primary templates
/// that must fire only when instantiated.
template <class... T>
inline constexpr bool always_false = false;

/// The key of the CUDA kernels' specializations: primary templates that
/// dispatch to them are looked up where a loop is used, and
/// <gradcomp/cuda.cuh> provides the specializations for this tag.
struct cuda_kernels_tag;
}  // namespace gradcomp::detail
