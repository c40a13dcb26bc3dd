// PowerSGD's CUDA path: cuBLAS for the two products (one handle per
// allreducer, made at construction on its device, with its own workspace so
// a step can be captured into a CUDA Graph), and Gram-Schmidt as one fused
// kernel (one block per matrix, norms and dot products in double; no QR for
// the small ranks PowerSGD uses). Include from a .cu file and link
// CUDA::cublas.
#pragma once

#include <gradcomp/compressors/powersgd/powersgd.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

#include <cublas_v2.h>

#include <cub/block/block_reduce.cuh>

#include <string>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI::detail {

inline constexpr int gram_schmidt_threads = tuning::block_threads;

inline void check_cublas(cublasStatus_t status, char const* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw cuda_error(std::string(what) + " failed: cuBLAS status " + std::to_string(static_cast<int>(status)));
}

/// PowerSGD's CUDA resources: a cuBLAS handle on the space's stream, with a
/// workspace of its own (so cuBLAS allocates nothing during a step), owned.
template <>
struct psgd_resources<cuda_kernels_tag, cuda_space> {
  static constexpr std::size_t workspace_bytes = std::size_t{4} << 20;

  explicit psgd_resources(cuda_space const& space) : workspace(workspace_bytes, space) {
    check_cublas(cublasCreate(&handle), "cublasCreate");
    try {
      check_cublas(cublasSetStream(handle, space.stream), "cublasSetStream");
      check_cublas(cublasSetWorkspace(handle, workspace.data(), workspace_bytes), "cublasSetWorkspace");
    } catch (...) {
      cublasDestroy(handle);
      throw;
    }
  }
  psgd_resources(psgd_resources&& other) noexcept
      : handle(std::exchange(other.handle, nullptr)), workspace(std::move(other.workspace)) {}
  psgd_resources& operator=(psgd_resources&&) = delete;
  psgd_resources(psgd_resources const&) = delete;
  ~psgd_resources() {
    if (handle != nullptr) cublasDestroy(handle);
  }

  cublasHandle_t handle = nullptr;
  buffer<std::byte, cuda_space> workspace;
};

// The vectors one after the other (element i of vector k at
// a[i * element_stride + k * vector_stride]): normalize, then remove it from
// every later vector. One block per matrix.
template <int Threads = gram_schmidt_threads>  // a template: defined in every .cu that includes it
__global__ void __launch_bounds__(Threads)
    gram_schmidt_kernel(float* a, std::size_t length, std::size_t count, std::size_t es, std::size_t vs, float eps) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage temp;
  __shared__ double shared;
  for (int pass = 0; pass < gram_schmidt_passes; ++pass)
    for (std::size_t k = 0; k < count; ++k) {
      float* v = a + k * vs;
      double part = 0.0;
      for (std::size_t i = threadIdx.x; i < length; i += blockDim.x) part += static_cast<double>(v[i * es]) * v[i * es];
      double const norm2 = reduce(temp).Sum(part);
      if (threadIdx.x == 0) shared = norm2;
      __syncthreads();
      double const scale = gram_schmidt_scale(shared, eps);
      for (std::size_t i = threadIdx.x; i < length; i += blockDim.x) v[i * es] = scaled(v[i * es], scale);
      __syncthreads();
      for (std::size_t j = k + 1; j < count; ++j) {
        float* w = a + j * vs;
        double dot = 0.0;
        for (std::size_t i = threadIdx.x; i < length; i += blockDim.x)
          dot += static_cast<double>(v[i * es]) * w[i * es];
        double const total = reduce(temp).Sum(dot);
        if (threadIdx.x == 0) shared = total;
        __syncthreads();
        double const projection = shared;
        for (std::size_t i = threadIdx.x; i < length; i += blockDim.x)
          w[i * es] = projected(w[i * es], projection, v[i * es]);
        __syncthreads();
      }
    }
}

template <class Resources>
struct psgd_device<cuda_kernels_tag, Resources> {
  static void gram_schmidt(cuda_space const& s, Resources&, float* a, std::size_t length, std::size_t count,
                           std::size_t element_stride, std::size_t vector_stride, float eps) {
    gram_schmidt_kernel<<<1, gram_schmidt_threads, 0, s.stream>>>(a, length, count, element_stride, vector_stride, eps);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }

  // cuBLAS is column-major: a row-major X (r x c) is the column-major X^T.
  // P (rows x rank) = M Q: P^T (rank x rows) = Q^T M^T, where q_t (row-major
  // rank x cols) is column-major Q (cols x rank), op T gives Q^T, and M
  // row-major is column-major M^T (cols x rows).
  static void multiply_mq(cuda_space const&, Resources& r, float const* m, float const* q_t, float* p, std::size_t rows,
                          std::size_t cols, std::size_t rank) {
    float const one = 1.0f, zero = 0.0f;
    check_cublas(cublasSgemm(r.handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rank), static_cast<int>(rows),
                             static_cast<int>(cols), &one, q_t, static_cast<int>(cols), m, static_cast<int>(cols),
                             &zero, p, static_cast<int>(rank)),
                 "cublasSgemm (P = M Q)");
  }

  // q_t (rank x cols, row-major) is column-major Q (cols x rank) = M^T P:
  // A = column-major M^T (cols x rows), B = column-major P^T, op(B) = T.
  static void multiply_mtp(cuda_space const&, Resources& r, float const* m, float const* p, float* q_t,
                           std::size_t rows, std::size_t cols, std::size_t rank) {
    float const one = 1.0f, zero = 0.0f;
    check_cublas(cublasSgemm(r.handle, CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(cols), static_cast<int>(rank),
                             static_cast<int>(rows), &one, m, static_cast<int>(cols), p, static_cast<int>(rank), &zero,
                             q_t, static_cast<int>(cols)),
                 "cublasSgemm (Q = M^T P)");
  }
};

}  // namespace gradcomp::detail
