// The CUDA execution space: element loops become grid-stride kernels ordered
// on one stream. This header needs only the CUDA runtime API, so host code
// compiled by g++ can allocate, copy and hold a cuda_space; launching the
// kernels needs nvcc (include <gradcomp/cuda.cuh> from a .cu file).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/span.hpp>

#if GRADCOMP_HAS_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

/// Throws gradcomp::cuda_error naming the failed call when a CUDA runtime
/// call does not return cudaSuccess.
#define GRADCOMP_CUDA_TRY(call)                                                                              \
  do {                                                                                                       \
    cudaError_t const gradcomp_status_ = (call);                                                             \
    if (gradcomp_status_ != cudaSuccess)                                                                     \
      throw ::gradcomp::cuda_error(std::string(#call) + " failed: " + cudaGetErrorString(gradcomp_status_)); \
  } while (0)

namespace gradcomp {

/// Runs element loops as CUDA kernels on `stream`. Every operation is
/// asynchronous on the stream except to_host, from_host and synchronize.
struct cuda_space {
  using memory = device_memory;  ///< Device buffers only.

  /// The stream all work is ordered on (0: the legacy default stream).
  cudaStream_t stream = nullptr;

  /// Allocates `bytes` of device memory with cudaMalloc (construction time
  /// only; the steady-state step never allocates).
  void* allocate(std::size_t bytes) const {
    void* p = nullptr;
    GRADCOMP_CUDA_TRY(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    return p;
  }
  /// Frees memory from allocate(); never throws.
  void deallocate(void* p) const { cudaFree(p); }
  /// Copies `bytes` between device buffers, asynchronously.
  void copy(void* dst, void const* src, std::size_t bytes) const {
    if (bytes != 0) GRADCOMP_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  /// Sets `bytes` to zero, asynchronously.
  void fill_zero(void* dst, std::size_t bytes) const {
    if (bytes != 0) GRADCOMP_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, stream));
  }
  /// Copies device memory to the host and waits for it.
  void to_host(void* host_dst, void const* src, std::size_t bytes) const {
    if (bytes == 0) return;
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    synchronize();
  }
  /// Copies host memory to the device and waits for it (the host buffer may
  /// be reused as soon as this returns).
  void from_host(void* dst, void const* host_src, std::size_t bytes) const {
    if (bytes == 0) return;
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
    synchronize();
  }
  /// Waits for all work on the stream.
  void synchronize() const { GRADCOMP_CUDA_TRY(cudaStreamSynchronize(stream)); }
};

/// True when a CUDA device is usable from this process.
inline bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

namespace detail {

template <class Tag, class... F>
struct cuda_kernels {
  static_assert(always_false<Tag, F...>,
                "gradcomp's CUDA kernels are compiled by nvcc: run the cuda_space path from a .cu "
                "file that includes <gradcomp/cuda.cuh>");
};
struct cuda_kernels_tag;

}  // namespace detail

/// Calls f(i) for every i in [0, n) in a grid-stride kernel on the space's
/// stream. f must be a copyable functor with a __host__ __device__ call.
template <class F>
void parallel_for(cuda_space const& space, std::size_t n, F const& f) {
  detail::cuda_kernels<detail::cuda_kernels_tag, F>::for_each(space, n, f);
}

/// Calls f(i) for every i in [0, n) and adds the number of calls that
/// returned true to `*counter`, a device pointer, asynchronously.
template <class F>
void parallel_count(cuda_space const& space, std::size_t n, F const& f, std::uint64_t* counter) {
  detail::cuda_kernels<detail::cuda_kernels_tag, F>::count(space, n, f, counter);
}

/// The CUDA side of parallel_for_chunks: f(i) for every element, in a
/// grid-stride kernel (adjacent threads share a chunk, so its branch is
/// uniform across a warp when the chunk is at least 32 elements).
template <class F>
void parallel_for_chunks(cuda_space const& space, std::size_t n, std::size_t /*chunk*/, F const& f) {
  parallel_for(space, n, f);
}

/// For each segment of `segment_size` elements: the sum of value(i)^2 in the
/// canonical lane order (one warp per segment), then finish(j, sum), whose
/// true results are counted into `*counter`. Bitwise the same as the host.
/// One warp walks a whole segment: keep segments short (sum long ones in
/// two levels with segment_sum).
template <class Value, class Finish>
void segment_sum_of_squares(cuda_space const& space, std::size_t n, std::size_t segment_size, Value const& value,
                            Finish const& finish, std::uint64_t* counter) {
  detail::cuda_kernels<detail::cuda_kernels_tag, Value>::template segment_sums<true>(space, n, segment_size, value,
                                                                                     finish, counter);
}

/// As segment_sum_of_squares, summing value(i) itself.
template <class Value, class Finish>
void segment_sum(cuda_space const& space, std::size_t n, std::size_t segment_size, Value const& value,
                 Finish const& finish, std::uint64_t* counter) {
  detail::cuda_kernels<detail::cuda_kernels_tag, Value>::template segment_sums<false>(space, n, segment_size, value,
                                                                                      finish, counter);
}

}  // namespace gradcomp

#endif  // GRADCOMP_HAS_CUDA
