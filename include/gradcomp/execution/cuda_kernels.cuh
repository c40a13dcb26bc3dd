// The kernels behind parallel_for / parallel_count on cuda_space.
#pragma once

#include <gradcomp/detail/lane_sum.hpp>
#include <gradcomp/execution/cuda.hpp>

#include <algorithm>
#include <cstdint>

namespace gradcomp::detail {

/// Launch shape of the element loops: enough blocks to fill any current GPU
/// several times over, then grid-stride.
inline constexpr int element_block_threads = 256;
inline constexpr std::size_t element_max_blocks = 4096;

inline unsigned element_blocks(std::size_t n) {
  std::size_t const blocks = (n + element_block_threads - 1) / element_block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, element_max_blocks));
}

template <class F>
__global__ void __launch_bounds__(element_block_threads) for_each_kernel(std::size_t n, F f) {
  std::size_t const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

template <class F>
__global__ void __launch_bounds__(element_block_threads) count_kernel(std::size_t n, F f, unsigned long long* counter) {
  std::size_t const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  unsigned count = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    count += f(i) ? 1u : 0u;
#if __CUDA_ARCH__ >= 800
  count = __reduce_add_sync(0xffffffffu, count);  // one atomic per warp
#else
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_down_sync(0xffffffffu, count, offset);
#endif
  if ((threadIdx.x & 31u) == 0 && count != 0) atomicAdd(counter, static_cast<unsigned long long>(count));
}

// One warp per segment; lane l takes elements l, l + 32, ... of it, then the
// butterfly: the order of detail/lane_sum.hpp.
template <bool Squares, class Value, class Finish>
__global__ void __launch_bounds__(element_block_threads)
    segment_sums_kernel(std::size_t n, std::size_t segment_size, Value value, Finish finish,
                           unsigned long long* counter) {
  constexpr unsigned warps_per_block = element_block_threads / sum_lanes;
  unsigned const lane = threadIdx.x % sum_lanes;
  std::size_t const segments = (n + segment_size - 1) / segment_size;
  unsigned bad = 0;
  for (std::size_t j = static_cast<std::size_t>(blockIdx.x) * warps_per_block + threadIdx.x / sum_lanes; j < segments;
       j += static_cast<std::size_t>(gridDim.x) * warps_per_block) {
    std::size_t const begin = j * segment_size;
    std::size_t const end = begin + segment_size < n ? begin + segment_size : n;
    float partial = 0.0f;
    for (std::size_t i = begin + lane; i < end; i += sum_lanes)
      partial = Squares ? add_square(partial, value(i)) : __fadd_rn(partial, value(i));
    for (int offset = sum_lanes / 2; offset > 0; offset /= 2)
      partial = __fadd_rn(partial, __shfl_xor_sync(0xffffffffu, partial, offset));
    if (lane == 0) bad += finish(j, partial) ? 1u : 0u;
  }
  if (lane == 0 && bad != 0) atomicAdd(counter, static_cast<unsigned long long>(bad));
}

template <class F>
struct cuda_kernels<cuda_kernels_tag, F> {
  static void for_each(cuda_space const& space, std::size_t n, F const& f) {
    if (n == 0) return;
    for_each_kernel<<<element_blocks(n), element_block_threads, 0, space.stream>>>(n, f);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
  static void count(cuda_space const& space, std::size_t n, F const& f, std::uint64_t* counter) {
    if (n == 0) return;
    static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
    count_kernel<<<element_blocks(n), element_block_threads, 0, space.stream>>>(
        n, f, reinterpret_cast<unsigned long long*>(counter));
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
  template <bool Squares, class Finish>
  static void segment_sums(cuda_space const& space, std::size_t n, std::size_t segment_size, F const& value,
                           Finish const& finish, std::uint64_t* counter) {
    if (n == 0) return;
    std::size_t const segments = (n + segment_size - 1) / segment_size;
    segment_sums_kernel<Squares><<<element_blocks(segments * sum_lanes), element_block_threads, 0, space.stream>>>(
        n, segment_size, value, finish, reinterpret_cast<unsigned long long*>(counter));
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::detail
