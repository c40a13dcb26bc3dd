// THC's rotation blocks of 256 to 4096 in registers (see thc.cuh): a thread
// holds E consecutive elements, the butterfly stages within them are register
// arithmetic, the next five are warp shuffles, and only stages across warps
// exchange through shared memory.
#pragma once

#include <gradcomp/compressors/thc/thc.hpp>
#include <gradcomp/execution/cuda_kernels.cuh>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Threads per block of THC's kernels.
inline constexpr int thc_threads = tuning::block_threads;

/// Elements per thread for a rotation block of B: a thread block of 256
/// threads holds 256 x E / B rotation blocks.
template <std::size_t B>
inline constexpr int thc_items = B >= 4096 ? 16 : 8;

__host__ __device__ constexpr int thc_log2(std::size_t x) { return x <= 1 ? 0 : 1 + thc_log2(x / 2); }

/// One thread's E consecutive elements of a rotation block: x, its signs, and
/// where they sit (t: the thread's place in the rotation block).
template <std::size_t B>
struct thc_lane_block {
  static constexpr int E = thc_items<B>;
  static constexpr int threads = static_cast<int>(B) / E;  // per rotation block
  float x[E];
  std::uint32_t sign_bits;  // bit e: element e's sign is negative
  unsigned t;
  std::size_t first;  // the element x[0] is

  __device__ __forceinline__ float sign(int e) const {
    return bits_float(0x3f800000u | (((sign_bits >> e) & 1u) << 31));
  }

  // thc_sign's bits for elements first .. first + E (all in one 32-bit word
  // of one Philox call: E divides 32 and first is a multiple of E).
  __device__ __forceinline__ void load_signs(random_stream const& shared) {
    uint4x32 const words = shared(first / 128);
    unsigned const bit = static_cast<unsigned>(first % 128);
    sign_bits = (word_of(words, bit / 32) >> (bit % 32)) & ((E == 32 ? 0u : 1u << E) - 1u);
  }

  /// The first `stages` butterfly stages (pairs 2^s apart, s = 0, 1, ...).
  /// `exchange` is 256 x E floats of shared memory for the stages across
  /// warps; every thread of the thread block calls this together.
  __device__ __forceinline__ void rotate(int stages, float* exchange) {
    constexpr int log_e = thc_log2(E), log_b = thc_log2(B);
#pragma unroll
    for (int s = 0; s < log_b; ++s) {
      if (s >= stages) break;  // (the same for every thread)
      if (s < log_e) {         // partners in this thread
        int const h = 1 << s;
#pragma unroll
        for (int e = 0; e < E; ++e)
          if ((e & h) == 0) {
            float const a = x[e], b = x[e | h];
            x[e] = a + b;
            x[e | h] = a - b;
          }
      } else {  // partners in thread t ^ m: in this warp by a shuffle, else through shared memory
        unsigned const m = 1u << (s - log_e);
        bool const upper = (t & m) != 0;
        float y[E];
        if (s < log_e + 5) {
#pragma unroll
          for (int e = 0; e < E; ++e) y[e] = __shfl_xor_sync(0xffffffffu, x[e], static_cast<int>(m));
        } else {
          float4* const mine = reinterpret_cast<float4*>(exchange + threadIdx.x * E);
          float4 const* const theirs = reinterpret_cast<float4 const*>(exchange + (threadIdx.x ^ m) * E);
#pragma unroll
          for (int v = 0; v < E / 4; ++v) mine[v] = make_float4(x[4 * v], x[4 * v + 1], x[4 * v + 2], x[4 * v + 3]);
          __syncthreads();
#pragma unroll
          for (int v = 0; v < E / 4; ++v) {
            float4 const q = theirs[v];
            y[4 * v] = q.x, y[4 * v + 1] = q.y, y[4 * v + 2] = q.z, y[4 * v + 3] = q.w;
          }
          __syncthreads();
        }
#pragma unroll
        for (int e = 0; e < E; ++e) x[e] = upper ? y[e] - x[e] : x[e] + y[e];  // (lower: a + b; upper: a - b)
      }
    }
  }
};

/// E lane values to memory as whole words (levels are padded to whole
/// rotation blocks and 256-byte aligned).
template <class Lane, int E>
__device__ __forceinline__ void thc_store_lanes(Lane* out, std::uint32_t const (&v)[E]) {
  if constexpr (sizeof(Lane) == 1 || sizeof(Lane) == 2) {
    constexpr int per_word = 4 / static_cast<int>(sizeof(Lane)), words = E / per_word;
    std::uint32_t w[words];
#pragma unroll
    for (int k = 0; k < words; ++k) {
      w[k] = 0;
#pragma unroll
      for (int j = 0; j < per_word; ++j)
        w[k] |= (v[k * per_word + j] & (sizeof(Lane) == 1 ? 0xffu : 0xffffu)) << (8 * sizeof(Lane) * j);
    }
    if constexpr (words == 2) {
      *reinterpret_cast<uint2*>(out) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
      for (int k = 0; k < words; k += 4)
        *reinterpret_cast<uint4*>(out + k * per_word) = make_uint4(w[k], w[k + 1], w[k + 2], w[k + 3]);
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = static_cast<Lane>(v[e]);
  }
}

/// E lane values from memory, widened to float.
template <class Lane, int E>
__device__ __forceinline__ void thc_load_lanes(Lane const* in, float (&out)[E]) {
  if constexpr (sizeof(Lane) == 1 && E % 8 == 0) {
#pragma unroll
    for (int k = 0; k < E / 8; ++k) {
      uint2 const w = reinterpret_cast<uint2 const*>(in)[k];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        std::uint32_t const word = j < 4 ? w.x : w.y;
        out[8 * k + j] = static_cast<float>(static_cast<Lane>((word >> (8 * (j % 4))) & 0xffu));
      }
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = static_cast<float>(in[e]);
  }
}

/// E floats of `data` from element `first` (those past n read as 0), as
/// 16-byte loads where the pointer allows.
template <int E>
__device__ __forceinline__ void thc_load_floats(float const* data, std::size_t first, std::size_t n, float (&out)[E]) {
  if (first + E <= n && reinterpret_cast<std::uintptr_t>(data + first) % 16 == 0) {
#pragma unroll
    for (int v = 0; v < E / 4; ++v) {
      float4 const q = reinterpret_cast<float4 const*>(data + first)[v];
      out[4 * v] = q.x, out[4 * v + 1] = q.y, out[4 * v + 2] = q.z, out[4 * v + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = first + e < n ? data[first + e] : 0.0f;
  }
}

/// E floats to `data` from element `first` (none past n), as 16-byte
/// stores where the pointer allows.
template <int E>
__device__ __forceinline__ void thc_store_floats(float* data, std::size_t first, std::size_t n, float const (&in)[E]) {
  if (first + E <= n && reinterpret_cast<std::uintptr_t>(data + first) % 16 == 0) {
#pragma unroll
    for (int v = 0; v < E / 4; ++v)
      reinterpret_cast<float4*>(data + first)[v] = make_float4(in[4 * v], in[4 * v + 1], in[4 * v + 2], in[4 * v + 3]);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (first + e < n) data[first + e] = in[e];
  }
}

/// The same for 16-bit gradients: eight elements per 16-byte access.
template <class G>
__device__ __forceinline__ float thc_widen(unsigned word, int half_index) {
  G h;
  h.bits = static_cast<std::uint16_t>(word >> (16 * half_index));
  return static_cast<float>(h);
}
template <int E, class G>
requires(!std::is_same_v<G, float>) __device__ __forceinline__
    void thc_load_floats(G const* data, std::size_t first, std::size_t n, float (&out)[E]) {
  if constexpr (E % 8 == 0) {
    if (first + E <= n && reinterpret_cast<std::uintptr_t>(data + first) % 16 == 0) {
#pragma unroll
      for (int v = 0; v < E / 8; ++v) {
        uint4 const q = reinterpret_cast<uint4 const*>(data + first)[v];
        unsigned const words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) out[8 * v + j] = thc_widen<G>(words[j / 2], j % 2);
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) out[e] = first + e < n ? static_cast<float>(data[first + e]) : 0.0f;
}
template <int E, class G>
requires(!std::is_same_v<G, float>) __device__ __forceinline__
    void thc_store_floats(G* data, std::size_t first, std::size_t n, float const (&in)[E]) {
  if constexpr (E % 8 == 0) {
    if (first + E <= n && reinterpret_cast<std::uintptr_t>(data + first) % 16 == 0) {
#pragma unroll
      for (int v = 0; v < E / 8; ++v) {
        unsigned words[4];
#pragma unroll
        for (int w = 0; w < 4; ++w)
          words[w] = static_cast<unsigned>(G(in[8 * v + 2 * w]).bits) |
                     (static_cast<unsigned>(G(in[8 * v + 2 * w + 1]).bits) << 16);
        reinterpret_cast<uint4*>(data + first)[v] = make_uint4(words[0], words[1], words[2], words[3]);
      }
      return;
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (first + e < n) data[first + e] = G(in[e]);
}

/// The uniforms element e of a thread's run rounds with: thc_noise's, with
/// e's place in its Philox block known at compile time (first % 8 == 0).
template <bool Table>
__device__ __forceinline__ void thc_register_noise(uint4x32 const& words, int e, float& u1, float& u2) {
  if constexpr (Table) {
    u1 = uniform16(words, static_cast<unsigned>(e % 4) * 2);
    u2 = uniform16(words, static_cast<unsigned>(e % 4) * 2 + 1);
  } else {
    u1 = uniform16(words, static_cast<unsigned>(e % 8));
    u2 = 0.0f;
  }
}

template <std::size_t B, bool Table, class Lane, class EF, class G>
__device__ __forceinline__ void thc_register_block(thc_encode<Lane, EF, G> const& f, thc_lane_block<B>& r,
                                                   std::size_t b, bool valid, float* exchange) {
  constexpr int E = thc_lane_block<B>::E;
  thc_block_params const p = f.p;
  float acc[E];
  float forward = 0.0f, backward = 0.0f;
  if (valid) {
    auto const ef = f.ef.bind();
    float g[E];
    thc_load_floats<E>(f.gradient, r.first, p.n, g);
    if constexpr (decltype(ef)::keeps_residual) {  // the residual as vectors too (its accumulate: g + e)
      float e_previous[E];
      thc_load_floats<E>(ef.previous, r.first, p.n, e_previous);
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = r.first + e < p.n ? g[e] + e_previous[e] : 0.0f;
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) acc[e] = r.first + e < p.n ? ef.accumulate(r.first + e, g[e]) : 0.0f;
    }
    forward = p.forward_scale(b);
    backward = p.backward_scale(b);
    r.load_signs(p.shared);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) acc[e] = 0.0f;
    r.sign_bits = 0;
  }
#pragma unroll
  for (int e = 0; e < E; ++e)  // (past the bucket's end: +0, as on the host)
    r.x[e] = r.first + e < p.n ? thc_finite_or_zero(acc[e]) * r.sign(e) * forward : 0.0f;
  r.rotate(p.stages, exchange);
  constexpr int share = Table ? 4 : 8;
  std::uint32_t values[E];
#pragma unroll
  for (int c = 0; c < E / share; ++c) {
    uint4x32 const words = p.mine((r.first + c * share) / share);
#pragma unroll
    for (int j = 0; j < share; ++j) {
      int const e = c * share + j;
      float u1, u2;
      thc_register_noise<Table>(words, e, u1, u2);
      values[e] = p.codec.encode(r.x[e], u1, u2);
      r.x[e] = p.codec.decode(static_cast<float>(values[e]));
    }
  }
  if (valid) thc_store_lanes<Lane, E>(f.levels + r.first, values);
  r.rotate(p.stages, exchange);
  if (valid) {
    auto const ef = f.ef.bind();
    float kept[E];
#pragma unroll
    for (int e = 0; e < E; ++e) kept[e] = acc[e] - thc_restore(r.x[e], backward, r.sign(e));
    if constexpr (requires { ef.next; }) {
      thc_store_floats<E>(ef.next, r.first, p.n, kept);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e)
        if (r.first + e < p.n) ef.update(r.first + e, kept[e]);
    }
  }
}

template <std::size_t B, bool Table, class Lane, class G>
__device__ __forceinline__ void thc_register_block(thc_decode<Lane, G> const& f, thc_lane_block<B>& r, std::size_t b,
                                                   bool valid, float* exchange) {
  constexpr int E = thc_lane_block<B>::E;
  thc_block_params const p = f.p;
  float backward = 0.0f;
  if (valid) {
    thc_load_lanes<Lane, E>(f.summed + r.first, r.x);
#pragma unroll
    for (int e = 0; e < E; ++e) r.x[e] = fused(r.x[e], p.sum_step, -p.codec.clamp);
    backward = p.backward_scale(b);
    r.load_signs(p.shared);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) r.x[e] = 0.0f;
    r.sign_bits = 0;
  }
  r.rotate(p.stages, exchange);
  if (valid) {
    float out[E];
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = thc_restore(r.x[e], backward, r.sign(e));
    thc_store_floats<E>(f.gradient, r.first, p.n, out);
  }
}

template <class F>
__device__ __forceinline__ void thc_poison_run(F const&, std::size_t, std::size_t) {}
template <class Lane, class G>
__device__ __forceinline__ void thc_poison_run(thc_decode<Lane, G> const& f, std::size_t first, std::size_t count) {
  for (std::size_t e = 0; e < count && first + e < f.p.n; ++e) f.gradient[first + e] = G(poison_value<float>());
}

/// 256 threads; each group of B / E threads takes one rotation block at a
/// time, the thread block striding over the bucket's blocks.
template <std::size_t B, bool Table, class F>
__global__ void __launch_bounds__(thc_threads) thc_register_kernel(block_range blocks, F f, gate when) {
  using run = thc_lane_block<B>;
  __shared__ __align__(16) float exchange[thc_threads * run::E];
  gate_state const state = read_gate(when);
  if (state == gate_state::closed) return;
  constexpr std::size_t per_thread_block = thc_threads / run::threads;
  run r;
  r.t = threadIdx.x % run::threads;
  for (std::size_t base = blocks.first + blockIdx.x * per_thread_block; base < blocks.end;
       base += gridDim.x * per_thread_block) {
    std::size_t const b = base + threadIdx.x / run::threads;
    bool const valid = b < blocks.end;
    r.first = b * B + r.t * run::E;
    if (state == gate_state::poisoned) {  // a vetoed step under propagate: NaN (no stage runs, so no barrier)
      if (valid) thc_poison_run(f, r.first, run::E);
      continue;
    }
    thc_register_block<B, Table>(f, r, b, valid, exchange);
  }
}

template <std::size_t B, class F>
void thc_launch_registers(cuda_space const& space, block_range blocks, F const& f, gate when) {
  constexpr std::size_t per_thread_block = thc_threads / thc_lane_block<B>::threads;
  unsigned const grid =
      static_cast<unsigned>(std::min<std::size_t>((blocks.size() + per_thread_block - 1) / per_thread_block, 65535));
  if (f.p.codec.table)
    thc_register_kernel<B, true><<<grid, thc_threads, 0, space.stream>>>(blocks, f, when);
  else
    thc_register_kernel<B, false><<<grid, thc_threads, 0, space.stream>>>(blocks, f, when);
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
