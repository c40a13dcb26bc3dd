// The CUDA side of segmented_reduce.hpp: one warp per range of up to 4096
// values, lane l taking values 4l..4l+3 of every 128 (one vector load per
// stream), then the canonical lane tree with shuffles.
#pragma once

#include <gradcomp/algorithm/segmented_reduce.hpp>
#include <gradcomp/algorithm/transform.cuh>

namespace gradcomp::inline GRADCOMP_ABI::detail {

inline constexpr int reduce_threads = tuning::block_threads;
inline constexpr int reduce_warps = reduce_threads / 32;

inline unsigned reduce_blocks(std::size_t ranges) {
  std::size_t const blocks = (ranges + reduce_warps - 1) / reduce_warps;
  return static_cast<unsigned>(blocks < (1u << 20) ? (blocks == 0 ? 1 : blocks) : (1u << 20));
}

/// Where range `range` of a level starts and how long it is.
struct reduce_range {
  std::size_t begin, len;
  GRADCOMP_HOST_DEVICE static reduce_range of(std::size_t range, std::size_t values, std::size_t segment) {
    std::size_t const tiles = tiles_per_segment(segment), tile = segment <= reduce_tile ? segment : reduce_tile;
    std::size_t const j = range / tiles, t = range % tiles;
    std::size_t const segment_end = (j + 1) * segment < values ? (j + 1) * segment : values;
    std::size_t const begin = j * segment + t * tile;
    return {begin, begin >= segment_end ? 0 : (begin + tile <= segment_end ? tile : segment_end - begin)};
  }
};

/// The lane tree over a warp's four partials per lane (see the header).
template <reduction R>
__device__ __forceinline__ double warp_tree(double (&p)[4]) {
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2)
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = combine<R>(p[k], __shfl_xor_sync(0xffffffffu, p[k], offset));
  return combine<R>(combine<R>(p[0], p[2]), combine<R>(p[1], p[3]));
}

template <reduction R, class Op, class In, class Out, std::size_t... I>
__device__ __forceinline__ unsigned reduce_four(Op const& op, In const& in, std::size_t at, std::size_t available,
                                                float limit, double (&p)[4], std::index_sequence<I...>) {
  unsigned bad = 0;
  if (available >= 4) {
    pack<item_array<stream_value_t<std::remove_cvref_t<decltype(get<I>(in))>>, 4>...> v;
    (load_items<4>(get<I>(in), at, get<I>(v)), ...);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float const value = op(at + k, get<I>(v).v[k]...);
      bool const good = within(value, limit);
      bad += good ? 0u : 1u;
      p[k] = combine<R>(p[k], contribution<R>(value, good));
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // constant indices keep p in registers
      if (static_cast<std::size_t>(k) >= available) break;
      float const value = op(at + k, load_one(get<I>(in), at + k)...);
      bool const good = within(value, limit);
      bad += good ? 0u : 1u;
      p[k] = combine<R>(p[k], contribution<R>(value, good));
    }
  }
  return bad;
}

template <reduction R, class Op, class In, class Out>
__global__ void __launch_bounds__(reduce_threads) reduce_first_kernel(std::size_t n, std::size_t segment, In in, Op op,
                                                                      Out out, unsigned long long* count, float limit) {
  unsigned const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  std::size_t const ranges = (n + segment - 1) / segment * tiles_per_segment(segment);
  auto const bound = bind_op(op);
  auto const rin = resolve_all(in);
  unsigned bad = 0;
  for (std::size_t range = static_cast<std::size_t>(blockIdx.x) * reduce_warps + warp; range < ranges;
       range += static_cast<std::size_t>(gridDim.x) * reduce_warps) {
    reduce_range const r = reduce_range::of(range, n, segment);
    double p[4] = {0.0, 0.0, 0.0, 0.0};
    for (std::size_t base = 4 * lane; base < r.len; base += reduce_lanes)
      bad += reduce_four<R, decltype(bound), decltype(rin), Out>(bound, rin, r.begin + base, r.len - base, limit, p,
                                                                 std::make_index_sequence<pack_size<In>>{});
    double const total = warp_tree<R>(p);
    if (lane == 0) out(range, total);
  }
  if (count != nullptr) {
    bad = __reduce_add_sync(0xffffffffu, bad);
    if (lane == 0 && bad != 0) atomicAdd(count, static_cast<unsigned long long>(bad));
  }
}

template <reduction R, class Out>
__global__ void __launch_bounds__(reduce_threads)
    reduce_upper_kernel(std::size_t values, std::size_t segment, double const* in, Out out) {
  unsigned const lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  std::size_t const ranges = (values + segment - 1) / segment * tiles_per_segment(segment);
  for (std::size_t range = static_cast<std::size_t>(blockIdx.x) * reduce_warps + warp; range < ranges;
       range += static_cast<std::size_t>(gridDim.x) * reduce_warps) {
    reduce_range const r = reduce_range::of(range, values, segment);
    double p[4] = {0.0, 0.0, 0.0, 0.0};
    for (std::size_t base = 4 * lane; base < r.len; base += reduce_lanes)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (base + k < r.len) p[k] = combine<R>(p[k], in[r.begin + base + k]);
    double const total = warp_tree<R>(p);
    if (lane == 0) out(range, total);
  }
}

template <class Op, class... I>
struct cuda_reduce<cuda_kernels_tag, Op, pack<I...>> {
  template <reduction R, class Out>
  static void first(cuda_space const& space, std::size_t n, std::size_t segment, pack<I...> const& in, Op const& op,
                    Out const& out, std::uint64_t* count, float limit) {
    std::size_t const ranges = (n + segment - 1) / segment * tiles_per_segment(segment);
    reduce_first_kernel<R><<<reduce_blocks(ranges), reduce_threads, 0, space.stream>>>(
        n, segment, in, op, out, reinterpret_cast<unsigned long long*>(count), limit);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
  template <reduction R, class Out>
  static void upper(cuda_space const& space, std::size_t values, std::size_t segment, double const* in,
                    Out const& out) {
    std::size_t const ranges = (values + segment - 1) / segment * tiles_per_segment(segment);
    reduce_upper_kernel<R><<<reduce_blocks(ranges), reduce_threads, 0, space.stream>>>(values, segment, in, out);
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::detail
