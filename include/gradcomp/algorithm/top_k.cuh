// The CUDA side of top_k.hpp. The threshold key T (the count-th largest) is
// found digit by digit: three histogram rounds of 11, 11 and 10 bits, each
// followed by a one-block pick that narrows the prefix and the number of
// keys still needed; both live in device memory. Then an index-ordered
// compaction: per tile of 4096 keys the number above T and equal to T, an
// exclusive scan of those pairs, and an emit pass in which element i, when
// selected, goes to r = (keys above T before i) + min(ties before i, ties
// needed). Ten small launches, no sort, no host round trip.
#pragma once

#include <gradcomp/algorithm/top_k.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

namespace gradcomp::inline GRADCOMP_ABI::detail {

inline constexpr int select_threads = tuning::block_threads;
inline constexpr int select_items = select_tile / select_threads;  // 16 keys per thread in a tile

GRADCOMP_HOST_DEVICE std::uint64_t above_equal(std::uint64_t above, std::uint64_t equal) {
  return (above << 32) | equal;
}

template <int Threads = select_threads>  // a template: defined in every .cu that includes it
__global__ void __launch_bounds__(Threads)
    select_init_kernel(std::uint32_t* histogram, std::uint64_t* state, std::uint64_t count) {
  for (int b = threadIdx.x; b < 2048; b += select_threads) histogram[b] = 0;
  if (threadIdx.x == 0) {
    state[0] = 0;      // the threshold's digits found so far
    state[1] = count;  // keys still needed at and below that prefix
  }
}

template <int Bits, int Shift, class Key>
__global__ void __launch_bounds__(select_threads)
    select_histogram_kernel(std::size_t n, Key key, std::uint64_t const* state, std::uint32_t* histogram) {
  constexpr std::uint32_t bins = 1u << Bits;
  __shared__ std::uint32_t counts[bins];
  for (std::uint32_t b = threadIdx.x; b < bins; b += select_threads) counts[b] = 0;
  __syncthreads();
  std::uint32_t const prefix = static_cast<std::uint32_t>(state[0]);
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * select_threads + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * select_threads) {
    std::uint32_t const k = key(i);
    bool match = true;
    if constexpr (Shift + Bits < 32) match = (k >> (Shift + Bits)) == prefix;
    if (match) atomicAdd(&counts[(k >> Shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  for (std::uint32_t b = threadIdx.x; b < bins; b += select_threads)
    if (counts[b] != 0) atomicAdd(&histogram[b], counts[b]);
}

// One block: the bin, counted from the top, where the keys still needed run
// out; it becomes the next digit of the threshold.
template <int Bits>
__global__ void __launch_bounds__(select_threads) select_pick_kernel(std::uint64_t* state, std::uint32_t* histogram) {
  constexpr int bins = 1 << Bits, per_thread = bins / select_threads;
  using scan = cub::BlockScan<std::uint64_t, select_threads>;
  __shared__ typename scan::TempStorage temp;
  std::uint64_t const need = state[1], prefix = state[0];
  // Thread t owns bins top - t * per_thread ... downwards, so the scan runs from the top.
  int const top = bins - 1 - static_cast<int>(threadIdx.x) * per_thread;
  std::uint64_t mine[per_thread];
  std::uint64_t sum = 0;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) sum += mine[j] = histogram[top - j];
  std::uint64_t above = 0;
  scan(temp).ExclusiveSum(sum, above);
  __syncthreads();  // every thread has read the state and the bins
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    if (above < need && above + mine[j] >= need) {
      state[0] = (prefix << Bits) | static_cast<std::uint64_t>(top - j);
      state[1] = need - above;
    }
    above += mine[j];
  }
#pragma unroll
  for (int j = 0; j < per_thread; ++j) histogram[top - j] = 0;  // ready for the next round
}

/// Keys above and equal to the threshold among a thread's items of a tile.
template <class Key>
__device__ __forceinline__ std::uint64_t count_above_equal(Key const& key, std::size_t first, std::size_t n,
                                                           std::uint32_t threshold) {
  std::uint64_t above = 0, equal = 0;
  for (int j = 0; j < select_items && first + j < n; ++j) {
    std::uint32_t const k = key(first + j);
    above += k > threshold;
    equal += k == threshold;
  }
  return above_equal(above, equal);
}

template <class Key>
__global__ void __launch_bounds__(select_threads)
    select_count_kernel(std::size_t n, Key key, std::uint64_t const* state, std::uint64_t* tile_counts) {
  using reduce = cub::BlockReduce<std::uint64_t, select_threads>;
  __shared__ typename reduce::TempStorage temp;
  std::uint32_t const threshold = static_cast<std::uint32_t>(state[0]);
  std::size_t const first = static_cast<std::size_t>(blockIdx.x) * select_tile + threadIdx.x * select_items;
  std::uint64_t const total = reduce(temp).Sum(count_above_equal(key, first, n, threshold));
  if (threadIdx.x == 0) tile_counts[blockIdx.x] = total;
}

template <int Threads = select_threads>  // a template: defined in every .cu that includes it
__global__ void __launch_bounds__(Threads)
    select_scan_kernel(std::size_t tiles, std::uint64_t const* tile_counts, std::uint64_t* tile_offsets) {
  using scan = cub::BlockScan<std::uint64_t, Threads>;
  __shared__ typename scan::TempStorage temp;
  __shared__ std::uint64_t carry;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (std::size_t base = 0; base < tiles; base += Threads) {
    std::size_t const t = base + threadIdx.x;
    std::uint64_t const value = t < tiles ? tile_counts[t] : 0;
    std::uint64_t offset = 0, total = 0;
    scan(temp).ExclusiveSum(value, offset, total);
    if (t < tiles) tile_offsets[t] = carry + offset;
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

template <class Key, class Emit>
__global__ void __launch_bounds__(select_threads)
    select_emit_kernel(std::size_t n, Key key, Emit emit, std::uint64_t const* state,
                       std::uint64_t const* tile_offsets) {
  using scan = cub::BlockScan<std::uint64_t, select_threads>;
  __shared__ typename scan::TempStorage temp;
  std::uint32_t const threshold = static_cast<std::uint32_t>(state[0]);
  std::uint64_t const need = state[1];
  std::size_t const first = static_cast<std::size_t>(blockIdx.x) * select_tile + threadIdx.x * select_items;
  std::uint64_t before = 0;
  scan(temp).ExclusiveSum(count_above_equal(key, first, n, threshold), before);
  before += tile_offsets[blockIdx.x];
  std::uint64_t above_before = before >> 32, equal_before = before & 0xffffffffu;
  for (int j = 0; j < select_items && first + j < n; ++j) {
    std::uint32_t const k = key(first + j);
    if (k > threshold) {
      emit(first + j, above_before + (equal_before < need ? equal_before : need));
      ++above_before;
    } else if (k == threshold) {
      if (equal_before < need) emit(first + j, above_before + equal_before);
      ++equal_before;
    }
  }
}

template <class Emit>
struct emit_all {
  Emit emit;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { emit(i, i); }
};

template <class Key, class Emit>
struct cuda_top_k<cuda_kernels_tag, Key, Emit> {
  static void run(cuda_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
                  span<std::byte, device_memory> scratch) {
    if (count == 0 || n == 0) return;
    if (count >= n) return parallel_for(space, n, emit_all<Emit>{emit});
    workspace_carver<device_memory> carver(scratch);
    auto const s = carve_device_select(carver, n);
    cudaStream_t const stream = space.stream;
    std::size_t const tiles = (n + select_tile - 1) / select_tile;
    unsigned const grid = static_cast<unsigned>(std::min<std::size_t>(tiles, tuning::top_k_policy::max_blocks));
    select_init_kernel<><<<1, select_threads, 0, stream>>>(s.histogram.data(), s.state.data(), count);
    select_histogram_kernel<11, 21><<<grid, select_threads, 0, stream>>>(n, key, s.state.data(), s.histogram.data());
    select_pick_kernel<11><<<1, select_threads, 0, stream>>>(s.state.data(), s.histogram.data());
    select_histogram_kernel<11, 10><<<grid, select_threads, 0, stream>>>(n, key, s.state.data(), s.histogram.data());
    select_pick_kernel<11><<<1, select_threads, 0, stream>>>(s.state.data(), s.histogram.data());
    select_histogram_kernel<10, 0><<<grid, select_threads, 0, stream>>>(n, key, s.state.data(), s.histogram.data());
    select_pick_kernel<10><<<1, select_threads, 0, stream>>>(s.state.data(), s.histogram.data());
    select_count_kernel<<<static_cast<unsigned>(tiles), select_threads, 0, stream>>>(n, key, s.state.data(),
                                                                                     s.tile_counts.data());
    select_scan_kernel<><<<1, select_threads, 0, stream>>>(tiles, s.tile_counts.data(), s.tile_offsets.data());
    select_emit_kernel<<<static_cast<unsigned>(tiles), select_threads, 0, stream>>>(n, key, emit, s.state.data(),
                                                                                    s.tile_offsets.data());
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::detail
