// The CUDA execution space: element loops become kernels ordered on one
// stream. This header needs only the CUDA runtime API, so host code compiled
// by g++ can allocate, copy and hold a cuda_space; launching the kernels
// needs nvcc (include <gradcomp/cuda.cuh> from a .cu file).
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/span.hpp>

#if GRADCOMP_HAS_CUDA

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

/// Throws gradcomp::cuda_error naming the failed call when a CUDA runtime
/// call does not return cudaSuccess.
#define GRADCOMP_CUDA_TRY(call)                                                                              \
  do {                                                                                                       \
    cudaError_t const gradcomp_status_ = (call);                                                             \
    if (gradcomp_status_ != cudaSuccess)                                                                     \
      throw ::gradcomp::cuda_error(std::string(#call) + " failed: " + cudaGetErrorString(gradcomp_status_)); \
  } while (0)

namespace gradcomp::inline GRADCOMP_ABI {

/// Runs element loops as CUDA kernels on `stream`. Every operation is
/// asynchronous on the stream except the ones marked as waiting.
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
  /// Copies device memory to the host.
  /// @note Waits for the stream.
  void to_host(void* host_dst, void const* src, std::size_t bytes) const {
    if (bytes == 0) return;
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream));
    synchronize();
  }
  /// Copies host memory to the device (the host buffer may be reused as soon
  /// as this returns).
  /// @note Waits for the stream.
  void from_host(void* dst, void const* host_src, std::size_t bytes) const {
    if (bytes == 0) return;
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
    synchronize();
  }
  /// Waits for all work on the stream.
  /// @note Waits, by definition.
  void synchronize() const { GRADCOMP_CUDA_TRY(cudaStreamSynchronize(stream)); }
};

/// True when a CUDA device is usable from this process.
inline bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

namespace detail {

/// The kernels behind the CUDA space's loops are compiled by nvcc only: the
/// primary template is looked up where a loop is used, and <gradcomp/cuda.cuh>
/// provides the specializations.
template <class Tag, class... F>
struct cuda_kernels {
  static_assert(always_false<Tag, F...>,
                "gradcomp's CUDA kernels are compiled by nvcc: run the cuda_space path from a .cu "
                "file that includes <gradcomp/cuda.cuh>");
};

/// A CUDA event, owned.
class cuda_event {
 public:
  cuda_event() { GRADCOMP_CUDA_TRY(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  cuda_event(cuda_event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  cuda_event& operator=(cuda_event&& other) noexcept {
    std::swap(event_, other.event_);
    return *this;
  }
  ~cuda_event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  /// The event.
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

/// Page-locked host memory for `count` values of T, zeroed, owned: the
/// device can copy into it asynchronously.
template <class T>
class pinned {
 public:
  explicit pinned(std::size_t count = 1) {
    void* p = nullptr;
    GRADCOMP_CUDA_TRY(cudaMallocHost(&p, count * sizeof(T)));
    data_ = static_cast<T*>(p);
    for (std::size_t i = 0; i < count; ++i) data_[i] = T{};
  }
  pinned(pinned&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  pinned& operator=(pinned&& other) noexcept {
    std::swap(data_, other.data_);
    return *this;
  }
  ~pinned() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  /// The memory.
  T* data() const { return data_; }

 private:
  T* data_ = nullptr;
};

}  // namespace detail

/// Calls f(i) for every i in [0, n) in a grid-stride kernel on the space's
/// stream. f must be a copyable functor with a __host__ __device__ call.
template <class F>
void parallel_for(cuda_space const& space, std::size_t n, F const& f) {
  detail::cuda_kernels<detail::cuda_kernels_tag, F>::for_each(space, n, f);
}

}  // namespace gradcomp

#endif  // GRADCOMP_HAS_CUDA
