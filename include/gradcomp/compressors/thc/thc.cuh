// THC's CUDA side: one thread block per rotation block, the block in shared
// memory, the butterflies of a stage spread over the threads.
#pragma once

#include <gradcomp/compressors/thc/thc.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

namespace gradcomp::detail {

inline constexpr int thc_threads = 256;

template <class Lane, class EF>
__device__ void thc_run_block(thc_encode<Lane, EF> const& f, std::size_t b, float* buffer) {
  std::size_t const first = b * f.p.block, half = f.p.block / 2;
  for (std::size_t t = threadIdx.x; t < f.p.block; t += blockDim.x)
    f.load(buffer, first, t, thc_sign(f.p.shared, first + t));
  __syncthreads();
  for (int s = 0; s < f.p.stages; ++s) {
    for (std::size_t q = threadIdx.x; q < half; q += blockDim.x) thc_butterfly(buffer, q, s);
    __syncthreads();
  }
  float const forward = f.p.forward_scale(b), backward = f.p.backward_scale(b);
  for (std::size_t t = threadIdx.x; t < f.p.block; t += blockDim.x)
    f.quantize(buffer, first, t, forward, backward, f.p.mine((first + t) / thc_noise_share(f.p.codec.table)));
  __syncthreads();
  for (int s = 0; s < f.p.stages; ++s) {
    for (std::size_t q = threadIdx.x; q < half; q += blockDim.x) thc_butterfly(buffer, q, s);
    __syncthreads();
  }
  for (std::size_t t = threadIdx.x; t < f.p.block && first + t < f.p.n; t += blockDim.x)
    f.keep(buffer, first, t, thc_sign(f.p.shared, first + t));
}

template <class Lane>
__device__ void thc_run_block(thc_decode<Lane> const& f, std::size_t b, float* buffer) {
  std::size_t const first = b * f.p.block, half = f.p.block / 2;
  float const backward = f.p.backward_scale(b);
  for (std::size_t t = threadIdx.x; t < f.p.block; t += blockDim.x) f.dequantize(buffer, first, t, backward);
  __syncthreads();
  for (int s = 0; s < f.p.stages; ++s) {
    for (std::size_t q = threadIdx.x; q < half; q += blockDim.x) thc_butterfly(buffer, q, s);
    __syncthreads();
  }
  for (std::size_t t = threadIdx.x; t < f.p.block && first + t < f.p.n; t += blockDim.x)
    f.store(buffer, first, t, thc_sign(f.p.shared, first + t));
}

template <class F>
__global__ void __launch_bounds__(thc_threads) thc_blocks_kernel(std::size_t blocks, F f) {
  extern __shared__ float buffer[];
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    thc_run_block(f, b, buffer);
    __syncthreads();
  }
}

template <class F>
struct thc_device<thc_device_tag, F> {
  static void for_each_block(cuda_space const& space, std::size_t blocks, std::size_t block_size, F const& f) {
    if (blocks == 0) return;
    unsigned const grid = static_cast<unsigned>(std::min<std::size_t>(blocks, 65535));
    thc_blocks_kernel<<<grid, thc_threads, block_size * sizeof(float), space.stream>>>(blocks, f);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::detail
