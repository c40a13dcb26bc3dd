// The kernel behind parallel_for on cuda_space.
#pragma once

#include <gradcomp/execution/cuda.hpp>
#include <gradcomp/execution/tuning.hpp>

#include <algorithm>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Launch shape of index loops: enough blocks to fill any current GPU
/// several times over, then grid-stride.
inline constexpr int index_block_threads = tuning::block_threads;
inline constexpr std::size_t index_max_blocks = tuning::index_max_blocks;

inline unsigned index_blocks(std::size_t n) {
  std::size_t const blocks = (n + index_block_threads - 1) / index_block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, index_max_blocks));
}

template <class F>
__global__ void __launch_bounds__(index_block_threads) for_each_kernel(std::size_t n, F f) {
  std::size_t const stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

template <class F>
struct cuda_kernels<cuda_kernels_tag, F> {
  static void for_each(cuda_space const& space, std::size_t n, F const& f) {
    if (n == 0) return;
    for_each_kernel<<<index_blocks(n), index_block_threads, 0, space.stream>>>(n, f);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::detail
