// PowerSGD's CUDA path: cuBLAS for the two products, and Gram-Schmidt as one
// fused kernel (one block per matrix; no QR for the small ranks PowerSGD
// uses). Include from a .cu file and link CUDA::cublas.
#pragma once

#include <gradcomp/compressors/powersgd/powersgd.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

#include <cublas_v2.h>

#include <cub/block/block_reduce.cuh>

namespace gradcomp::detail {

inline constexpr int gram_schmidt_threads = 256;

// The vectors one after the other (element i of vector k at
// a[i * element_stride + k * vector_stride]): normalize, then remove it from
// every later vector. fp32 throughout; one block per matrix.
template <int Threads = gram_schmidt_threads>  // a template: defined in every .cu that includes it
__global__ void __launch_bounds__(Threads)
    gram_schmidt_kernel(float* a, std::size_t length, std::size_t count, std::size_t es, std::size_t vs, float eps) {
  using reduce = cub::BlockReduce<float, Threads>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ float shared;
  for (int pass = 0; pass < gram_schmidt_passes; ++pass)
    for (std::size_t k = 0; k < count; ++k) {
      float* v = a + k * vs;
      float part = 0.0f;
      for (std::size_t i = threadIdx.x; i < length; i += blockDim.x) part += v[i * es] * v[i * es];
      float const norm2 = reduce(temp).Sum(part);
      if (threadIdx.x == 0) shared = gram_schmidt_scale(norm2, eps);
      __syncthreads();
      float const scale = shared;
      for (std::size_t i = threadIdx.x; i < length; i += blockDim.x) v[i * es] *= scale;
      __syncthreads();
      for (std::size_t j = k + 1; j < count; ++j) {
        float* w = a + j * vs;
        float dot = 0.0f;
        for (std::size_t i = threadIdx.x; i < length; i += blockDim.x) dot += v[i * es] * w[i * es];
        float const total = reduce(temp).Sum(dot);
        if (threadIdx.x == 0) shared = total;
        __syncthreads();
        float const projection = shared;
        for (std::size_t i = threadIdx.x; i < length; i += blockDim.x) w[i * es] -= projection * v[i * es];
        __syncthreads();
      }
    }
}

template <class Dependent>
struct psgd_device<psgd_device_tag, Dependent> {
  // One cuBLAS handle per host thread, made on first use and kept (like the
  // CUDA context itself); its stream is set per call.
  static cublasHandle_t handle(cudaStream_t stream) {
    thread_local cublasHandle_t h = [] {
      cublasHandle_t made = nullptr;
      if (cublasCreate(&made) != CUBLAS_STATUS_SUCCESS) throw cuda_error("cublasCreate failed");
      return made;
    }();
    if (cublasSetStream(h, stream) != CUBLAS_STATUS_SUCCESS) throw cuda_error("cublasSetStream failed");
    return h;
  }

  static void check(cublasStatus_t status, char const* what) {
    if (status != CUBLAS_STATUS_SUCCESS)
      throw cuda_error(std::string(what) + " failed: cuBLAS status " + std::to_string(status));
  }

  static void gram_schmidt(cuda_space const& s, float* a, std::size_t length, std::size_t count,
                           std::size_t element_stride, std::size_t vector_stride, float eps) {
    gram_schmidt_kernel<<<1, gram_schmidt_threads, 0, s.stream>>>(a, length, count, element_stride, vector_stride, eps);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }

  // cuBLAS is column-major: a row-major X (r x c) is the column-major X^T.
  // P (rows x rank) = M Q, as P^T (rank x rows) = (q_t)^T... : q_t row-major
  // (rank x cols) is column-major Q (cols x rank), so op(A) = T gives Q^T;
  // M row-major is column-major M^T (cols x rows).
  static void multiply_mq(cuda_space const& s, float const* m, float const* q_t, float* p, std::size_t rows,
                          std::size_t cols, std::size_t rank) {
    float const one = 1.0f, zero = 0.0f;
    check(cublasSgemm(handle(s.stream), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rank), static_cast<int>(rows),
                      static_cast<int>(cols), &one, q_t, static_cast<int>(cols), m, static_cast<int>(cols), &zero, p,
                      static_cast<int>(rank)),
          "cublasSgemm (P = M Q)");
  }

  // q_t (rank x cols, row-major) is column-major Q (cols x rank) = M^T P:
  // A = column-major M^T (cols x rows), B = column-major P^T, op(B) = T.
  static void multiply_mtp(cuda_space const& s, float const* m, float const* p, float* q_t, std::size_t rows,
                           std::size_t cols, std::size_t rank) {
    float const one = 1.0f, zero = 0.0f;
    check(cublasSgemm(handle(s.stream), CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(cols), static_cast<int>(rank),
                      static_cast<int>(rows), &one, m, static_cast<int>(cols), p, static_cast<int>(rank), &zero, q_t,
                      static_cast<int>(cols)),
          "cublasSgemm (Q = M^T P)");
  }
};

}  // namespace gradcomp::detail
