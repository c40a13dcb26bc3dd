// Build configuration shared by every gradcomp header.
#pragma once

/// gradcomp's version, as MAJOR * 10000 + MINOR * 100 + PATCH.
#define GRADCOMP_VERSION 100

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
/// space and lets the in-process collective stage device buffers; kernels
/// still need nvcc. Programs that mix .cpp and .cu files should link
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

/// Pragmas for the host loops; empty without OpenMP so g++ stays quiet.
#define GRADCOMP_PRAGMA(x) _Pragma(#x)
#if GRADCOMP_HAS_OPENMP
#define GRADCOMP_OMP(x) GRADCOMP_PRAGMA(omp x)
#else
#define GRADCOMP_OMP(x)
#endif

namespace gradcomp::detail {
/// False, but only once T is known: for static_asserts in primary templates
/// that must fire only when instantiated.
template <class... T>
inline constexpr bool always_false = false;
}  // namespace gradcomp::detail
