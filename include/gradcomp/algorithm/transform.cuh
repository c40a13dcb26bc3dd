// The CUDA side of transform.hpp: a tile of transform_threads x items per
// block; each thread takes `items` consecutive elements, moving every memory
// stream as 16-byte vectors where its alignment allows (8- or 4-byte ones, or
// scalars, where it does not), drawing one Philox call per 8 elements of
// noise, and counting bad elements with one atomic per warp.
#pragma once

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Threads per block of the element passes.
inline constexpr int transform_threads = tuning::block_threads;

constexpr int ceil_pow2(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

/// The launch shape of a pass, in one place: each thread reads at least 32
/// bytes where it can (with 2048 resident threads, 64 KiB in flight per SM;
/// an H200 needs about 48), and every memory stream moves at least an
/// 8-byte vector (16 bytes for 4-byte streams once a thread has 4 items),
/// whole Philox calls for noise; at most 8 items, to stay within registers.
template <class In, class Out>
struct transform_shape;
template <class... I, class... O>
struct transform_shape<pack<I...>, pack<O...>> {
  static constexpr int read_bytes = (0 + ... + stream_bytes<I>);
  static constexpr int by_bytes = read_bytes == 0 ? 4 : ceil_pow2((32 + read_bytes - 1) / read_bytes);
  static constexpr int by_streams = ceil_pow2(std::max({1, stream_min_items<I>..., stream_min_items<O>...}));
  static constexpr int items = std::min(8, std::max(by_bytes, by_streams));
};

/// A thread's items of one stream, in registers.
template <class T, int N>
struct alignas(16) item_array {
  T v[N];
};

template <class Word, int N, class T>
__device__ __forceinline__ void load_words(T const* p, item_array<T, N>& out) {
  constexpr int words = N * static_cast<int>(sizeof(T)) / static_cast<int>(sizeof(Word));
  Word const* from = reinterpret_cast<Word const*>(p);
  Word* to = reinterpret_cast<Word*>(out.v);
#pragma unroll
  for (int w = 0; w < words; ++w) to[w] = from[w];
}

template <class Word, int N, class T>
__device__ __forceinline__ void store_words(T* p, item_array<T, N> const& in) {
  constexpr int words = N * static_cast<int>(sizeof(T)) / static_cast<int>(sizeof(Word));
  Word* to = reinterpret_cast<Word*>(p);
  Word const* from = reinterpret_cast<Word const*>(in.v);
#pragma unroll
  for (int w = 0; w < words; ++w) to[w] = from[w];
}

/// The widest word (16, 8, 4 bytes) that divides the thread's bytes and the
/// address; 0: scalars.
template <class T, int N>
__device__ __forceinline__ int vector_bytes(void const* p) {
  constexpr int bytes = N * static_cast<int>(sizeof(T));
  auto const address = reinterpret_cast<std::uintptr_t>(p);
  if (bytes % 16 == 0 && address % 16 == 0) return 16;
  if (bytes % 8 == 0 && address % 8 == 0) return 8;
  if (bytes % 4 == 0 && address % 4 == 0) return 4;
  return 0;
}

// Loading a thread's N items starting at `first`.
template <int N, class T>
__device__ __forceinline__ void load_items(T const* p, std::size_t first, item_array<T, N>& out) {
  T const* at = p + first;
  switch (vector_bytes<T, N>(at)) {
    case 16:
      if constexpr (N * sizeof(T) % 16 == 0) return load_words<uint4>(at, out);
      break;
    case 8:
      if constexpr (N * sizeof(T) % 8 == 0) return load_words<uint2>(at, out);
      break;
    case 4:
      if constexpr (N * sizeof(T) % 4 == 0) return load_words<unsigned>(at, out);
      break;
    default:
      break;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = at[k];
}
template <int N, class T>
__device__ __forceinline__ void load_items(T* p, std::size_t first, item_array<T, N>& out) {
  load_items<N>(static_cast<T const*>(p), first, out);
}
template <int N, class T>
__device__ __forceinline__ void load_items(zeros<T>, std::size_t, item_array<T, N>& out) {
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = T{};
}
template <int N, class T>
__device__ __forceinline__ void load_items(widened<T> s, std::size_t first, item_array<float, N>& out) {
  item_array<T, N> raw;
  load_items<N>(static_cast<T const*>(s.data), first, raw);
#pragma unroll
  for (int k = 0; k < N; ++k) out.v[k] = static_cast<float>(raw.v[k]);
}
template <int N>
__device__ __forceinline__ void load_items(rounding_noise const& noise, std::size_t first, item_array<float, N>& out) {
  static_assert(N % 8 == 0, "noise is drawn in whole Philox calls of 8 uniforms");
#pragma unroll
  for (int call = 0; call < N / 8; ++call) {
    uint4x32 const words = noise.stream(first / 8 + call);
#pragma unroll
    for (int j = 0; j < 8; ++j) out.v[8 * call + j] = uniform16(words, j);
  }
}

template <int N, class T>
__device__ __forceinline__ void store_items(T* p, std::size_t first, item_array<T, N> const& in) {
  T* at = p + first;
  switch (vector_bytes<T, N>(at)) {
    case 16:
      if constexpr (N * sizeof(T) % 16 == 0) return store_words<uint4>(at, in);
      break;
    case 8:
      if constexpr (N * sizeof(T) % 8 == 0) return store_words<uint2>(at, in);
      break;
    case 4:
      if constexpr (N * sizeof(T) % 4 == 0) return store_words<unsigned>(at, in);
      break;
    default:
      break;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) at[k] = in.v[k];
}
template <int N, class T>
__device__ __forceinline__ void store_items(discard<T>, std::size_t, item_array<T, N> const&) {}
template <int N, class T>
__device__ __forceinline__ void store_items(widened<T> s, std::size_t first, item_array<float, N> const& in) {
  item_array<T, N> raw;
#pragma unroll
  for (int k = 0; k < N; ++k) raw.v[k] = T(in.v[k]);
  store_items<N>(s.data, first, raw);
}

// One element, for the tail of the last tile.
template <class T>
__device__ __forceinline__ T load_one(T const* p, std::size_t i) {
  return p[i];
}
template <class T>
__device__ __forceinline__ T load_one(T* p, std::size_t i) {
  return p[i];
}
template <class T>
__device__ __forceinline__ T load_one(zeros<T>, std::size_t) {
  return T{};
}
template <class T>
__device__ __forceinline__ float load_one(widened<T> s, std::size_t i) {
  return static_cast<float>(s.data[i]);
}
__device__ __forceinline__ float load_one(rounding_noise const& noise, std::size_t i) { return noise.at(i); }

template <class T>
__device__ __forceinline__ void store_one(T* p, std::size_t i, T value) {
  p[i] = value;
}
template <class T>
__device__ __forceinline__ void store_one(discard<T>, std::size_t, T) {}
template <class T>
__device__ __forceinline__ void store_one(widened<T> s, std::size_t i, float value) {
  s.data[i] = T(value);
}

template <int N, class Op, class In, class Out, std::size_t... I, std::size_t... O>
__device__ __forceinline__ unsigned transform_items(Op const& op, In const& in, Out const& out, std::size_t first,
                                                    std::index_sequence<I...>, std::index_sequence<O...>) {
  pack<item_array<stream_value_t<std::remove_cvref_t<decltype(get<I>(in))>>, N>...> vin;
  pack<item_array<stream_value_t<std::remove_cvref_t<decltype(get<O>(out))>>, N>...> vout;
  (load_items<N>(get<I>(in), first, get<I>(vin)), ...);
  unsigned bad = 0;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if constexpr (std::is_same_v<decltype(op(first, get<I>(vin).v[k]..., get<O>(vout).v[k]...)), bool>)
      bad += op(first + k, get<I>(vin).v[k]..., get<O>(vout).v[k]...) ? 1u : 0u;
    else
      op(first + k, get<I>(vin).v[k]..., get<O>(vout).v[k]...);
  }
  (store_items<N>(get<O>(out), first, get<O>(vout)), ...);
  return bad;
}

template <class Op, class In, class Out, std::size_t... I, std::size_t... O>
__device__ __forceinline__ unsigned transform_one(Op const& op, In const& in, Out const& out, std::size_t i,
                                                  std::index_sequence<I...>, std::index_sequence<O...>) {
  pack<stream_value_t<std::remove_cvref_t<decltype(get<O>(out))>>...> values{};
  unsigned bad = 0;
  if constexpr (std::is_same_v<decltype(op(i, load_one(get<I>(in), i)..., get<O>(values)...)), bool>)
    bad = op(i, load_one(get<I>(in), i)..., get<O>(values)...) ? 1u : 0u;
  else
    op(i, load_one(get<I>(in), i)..., get<O>(values)...);
  (store_one(get<O>(out), i, get<O>(values)), ...);
  return bad;
}

template <class Out, std::size_t... O>
__device__ __forceinline__ void poison_one(Out const& out, std::size_t i, std::index_sequence<O...>) {
  (store_one(get<O>(out), i, poison_value<stream_value_t<std::remove_cvref_t<decltype(get<O>(out))>>>()), ...);
}

template <int N, class Op, class In, class Out>
__global__ void __launch_bounds__(transform_threads)
    transform_kernel(std::size_t n, In in, Out out, Op op, gate when, unsigned long long* count) {
  gate_state const state = read_gate(when);
  if (state == gate_state::closed) return;  // the same for every thread
  auto const bound = bind_op(op);
  auto const rin = resolve_all(in);
  auto const rout = resolve_all(out);
  using in_seq = decltype(std::make_index_sequence<pack_size<In>>());
  using out_seq = decltype(std::make_index_sequence<pack_size<Out>>());
  constexpr std::size_t tile = static_cast<std::size_t>(transform_threads) * N;
  unsigned bad = 0;
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * tile; base < n;
       base += static_cast<std::size_t>(gridDim.x) * tile) {
    std::size_t const first = base + static_cast<std::size_t>(threadIdx.x) * N;
    if (first >= n) continue;
    std::size_t const count_here = first + N <= n ? N : n - first;
    if (state == gate_state::poisoned) {
      for (std::size_t k = 0; k < count_here; ++k) poison_one(rout, first + k, out_seq{});
    } else if (count_here == N) {
      bad += transform_items<N>(bound, rin, rout, first, in_seq{}, out_seq{});
    } else {
      for (std::size_t k = 0; k < count_here; ++k)
        bad += transform_one(bound, rin, rout, first + k, in_seq{}, out_seq{});
    }
  }
  if (count != nullptr) {
    bad = __reduce_add_sync(0xffffffffu, bad);  // one atomic per warp, and only for bad values
    if ((threadIdx.x & 31u) == 0 && bad != 0) atomicAdd(count, static_cast<unsigned long long>(bad));
  }
}

template <class Op, class... I, class... O>
struct cuda_transform<cuda_kernels_tag, Op, pack<I...>, pack<O...>> {
  static void run(cuda_space const& space, std::size_t n, pack<I...> const& in, pack<O...> const& out, Op const& op,
                  transform_options const& options) {
    if (n == 0) return;
    constexpr int items = transform_shape<pack<I...>, pack<O...>>::items;
    constexpr std::size_t tile = static_cast<std::size_t>(transform_threads) * items;
    std::size_t const tiles = (n + tile - 1) / tile;
    unsigned const grid = static_cast<unsigned>(tiles < (1u << 20) ? tiles : (1u << 20));
    static_assert(sizeof(unsigned long long) == sizeof(std::uint64_t));
    transform_kernel<items><<<grid, transform_threads, 0, space.stream>>>(
        n, in, out, op, options.when, reinterpret_cast<unsigned long long*>(options.count));
    GRADCOMP_CUDA_TRY(cudaGetLastError());
  }
};

}  // namespace gradcomp::detail
