// THC's CUDA side. Rotation blocks of 256 to 4096 (the common ones) run in
// registers: a thread holds E = 8 (16 for 4096) consecutive elements, the
// butterfly stages within them are register arithmetic, the next five are
// warp shuffles, and only stages across warps (blocks over 256 x E / 8)
// exchange through shared memory; each thread draws its own signs and
// rounding noise and quantizes its own elements. Smaller blocks take one
// thread block each, the block in shared memory. Either way the random
// numbers are the host's (one Philox call per 128 signs and per 8 (uniform)
// or 4 (table) roundings) and every butterfly adds and subtracts the same
// pair in the same stage order, so lane values and outputs are bitwise the
// host's.
#pragma once

#include <gradcomp/compressors/thc/registers.cuh>
#include <gradcomp/compressors/thc/thc.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Shared memory of a block of B: the block, acc, and the sign bits.
inline std::size_t thc_shared_bytes(std::size_t block) {
  return 2 * block * sizeof(float) + (block / 32 + 1) * sizeof(std::uint32_t);
}

struct thc_shared {
  float* x;
  float* acc;
  std::uint32_t* sign_bits;
};

__device__ __forceinline__ thc_shared thc_carve_shared(float* memory, std::size_t block) {
  return {memory, memory + block, reinterpret_cast<std::uint32_t*>(memory + 2 * block)};
}

// The sign bits of the block starting at `first` (blocks of 128 or more:
// whole Philox calls; smaller blocks take thc_sign element by element).
__device__ __forceinline__ void thc_load_signs(thc_block_params const& p, std::size_t first, std::uint32_t* bits) {
  if (p.block < 128) return;
  for (std::size_t k = threadIdx.x; k < p.block / 128; k += blockDim.x) {
    uint4x32 const words = p.shared(first / 128 + k);
    for (int w = 0; w < 4; ++w) bits[4 * k + w] = words.v[w];
  }
}

__device__ __forceinline__ float thc_block_sign(thc_block_params const& p, std::uint32_t const* bits, std::size_t first,
                                                std::size_t t) {
  if (p.block < 128) return thc_sign(p.shared, first + t);
  return bits_float(0x3f800000u | (((bits[t / 32] >> (t % 32)) & 1u) << 31));
}

__device__ __forceinline__ void thc_rotate_shared(thc_block_params const& p, float* x) {
  for (int s = 0; s < p.stages; ++s) {
    for (std::size_t q = threadIdx.x; q < p.block / 2; q += blockDim.x) thc_butterfly(x, q, s);
    __syncthreads();
  }
}

template <class Lane, class EF, class G>
__device__ void thc_run_block(thc_encode<Lane, EF, G> const f, std::size_t b, float* memory, gate_state) {
  thc_block_params const p = f.p;  // (by value: the address of a kernel parameter would copy it to local memory)
  thc_shared const sh = thc_carve_shared(memory, p.block);
  std::size_t const first = b * p.block;
  auto const ef = f.ef.bind();
  float const forward = p.forward_scale(b), backward = p.backward_scale(b);
  thc_load_signs(p, first, sh.sign_bits);
  __syncthreads();
  for (std::size_t t = threadIdx.x; t < p.block; t += blockDim.x) {
    float const acc = first + t < p.n ? ef.accumulate(first + t, static_cast<float>(f.gradient[first + t])) : 0.0f;
    sh.acc[t] = acc;
    sh.x[t] = thc_finite_or_zero(acc) * thc_block_sign(p, sh.sign_bits, first, t) * forward;
  }
  __syncthreads();
  thc_rotate_shared(p, sh.x);
  std::size_t const share = thc_noise_share(p.codec.table);
  if (p.block % share == 0) {  // each thread: one Philox call, the elements it covers
    for (std::size_t k = threadIdx.x; k < p.block / share; k += blockDim.x) {
      uint4x32 const words = p.mine(first / share + k);
      for (std::size_t j = 0; j < share; ++j) f.quantize(sh.x, first, k * share + j, words);
    }
  } else {
    for (std::size_t t = threadIdx.x; t < p.block; t += blockDim.x)
      f.quantize(sh.x, first, t, p.mine((first + t) / share));
  }
  __syncthreads();
  thc_rotate_shared(p, sh.x);
  for (std::size_t t = threadIdx.x; t < p.block && first + t < p.n; t += blockDim.x)
    ef.update(first + t, sh.acc[t] - thc_restore(sh.x[t], backward, thc_block_sign(p, sh.sign_bits, first, t)));
}

template <class Lane, class G>
__device__ void thc_run_block(thc_decode<Lane, G> const f, std::size_t b, float* memory, gate_state state) {
  thc_block_params const p = f.p;  // (by value: the address of a kernel parameter would copy it to local memory)
  std::size_t const first = b * p.block;
  if (state == gate_state::poisoned) {  // a vetoed step under propagate: NaN
    for (std::size_t t = threadIdx.x; t < p.block && first + t < p.n; t += blockDim.x)
      f.gradient[first + t] = G(poison_value<float>());
    return;
  }
  thc_shared const sh = thc_carve_shared(memory, p.block);
  float const backward = p.backward_scale(b);
  thc_load_signs(p, first, sh.sign_bits);
  for (std::size_t t = threadIdx.x; t < p.block; t += blockDim.x) f.dequantize(sh.x, first, t);
  __syncthreads();
  thc_rotate_shared(p, sh.x);
  for (std::size_t t = threadIdx.x; t < p.block && first + t < p.n; t += blockDim.x)
    f.store(sh.x, first, t, backward, thc_block_sign(p, sh.sign_bits, first, t));
}

template <class F>
__global__ void __launch_bounds__(thc_threads) thc_blocks_kernel(block_range blocks, F f, gate when) {
  extern __shared__ float memory[];
  gate_state const state = read_gate(when);
  if (state == gate_state::closed) return;
  for (std::size_t b = blocks.first + blockIdx.x; b < blocks.end; b += gridDim.x) {
    thc_run_block(f, b, memory, state);
    __syncthreads();
  }
}

template <class F>
struct thc_device<cuda_kernels_tag, F> {
  static void for_each_block(cuda_space const& space, block_range blocks, std::size_t block_size, F const& f,
                             gate when) {
    if (blocks.size() == 0) return;
    switch (block_size) {
      case 256:
        thc_launch_registers<256>(space, blocks, f, when);
        break;
      case 512:
        thc_launch_registers<512>(space, blocks, f, when);
        break;
      case 1024:
        thc_launch_registers<1024>(space, blocks, f, when);
        break;
      case 2048:
        thc_launch_registers<2048>(space, blocks, f, when);
        break;
      case 4096:
        thc_launch_registers<4096>(space, blocks, f, when);
        break;
      default: {  // small blocks: one thread block each, in shared memory
        unsigned const grid = static_cast<unsigned>(std::min<std::size_t>(blocks.size(), 65535));
        thc_blocks_kernel<<<grid, thc_threads, thc_shared_bytes(block_size), space.stream>>>(blocks, f, when);
      }
    }
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
