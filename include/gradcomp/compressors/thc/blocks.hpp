// THC's block passes: a step's encode (acc -> rotated, scaled, rounded lane
// values, and this rank's residual) and decode (summed lane values -> the
// output), one rotation block at a time. The host runs a block per OpenMP
// iteration with the block in a stack buffer (two butterfly stages per pass,
// so the rotation runs in cache); the CUDA kernels (thc.cuh) run the same
// steps with a thread block sharing the block in shared memory.
//
// Scales are applied where no intermediate can overflow: acc times the
// forward scale (sqrt(coordinates) / group norm, times 2^(-stages/2)) before
// the rotation, whose unnormalized butterflies then grow nothing past
// sqrt(group) * 2^(stages/2); the backward scale after the inverse rotation.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/compressors/thc/host_rotation.hpp>
#include <gradcomp/compressors/thc/math.hpp>
#include <gradcomp/detail/streaming_store.hpp>
#include <gradcomp/execution.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The clamp T for an overflow frequency o: T = Phi^-1(1 - 1/(2o)), the
/// point a standard normal coordinate exceeds in magnitude once in o.
inline float thc_clamp_for(double overflow) {
  double lo = 0, hi = 40;  // bisection on erfc(T / sqrt 2) = 1 / o
  for (int i = 0; i < 200; ++i) {
    double const mid = (lo + hi) / 2;
    (std::erfc(mid / std::sqrt(2.0)) > 1.0 / overflow ? lo : hi) = mid;
  }
  return static_cast<float>((lo + hi) / 2);
}

/// What every block of a step needs to know.
struct thc_block_params {
  std::size_t n;        // elements in the bucket
  std::size_t block;    // B
  int stages;           // butterfly stages
  std::size_t group;    // G
  double const* norms;  // squared norms, max over ranks, per group
  double rotation;      // 2^(-stages/2): makes the unnormalized butterflies orthonormal
  thc_codec codec;
  random_stream shared;  // signs
  random_stream mine;    // this rank's rounding noise
  float sum_step;        // 2T / (top x n): a lane sum of n ranks' values to z, with one fused multiply-add

  /// Elements of the bucket in the block that starts at `first`: B, fewer in
  /// the last block, none in the padding after it.
  GRADCOMP_HOST_DEVICE std::size_t inside(std::size_t first) const {
    return first + block <= n ? block : (first < n ? n - first : 0);
  }
  /// Coordinates of block b's group, and the group's norm (double).
  GRADCOMP_HOST_DEVICE double group_coordinates(std::size_t b) const {
    std::size_t const g = b * block / group, padded = (n + block - 1) / block * block;
    return static_cast<double>((g + 1) * group <= padded ? group : padded - g * group);
  }
  /// sqrt(coordinates in the group) / max norm x rotation, or 0 for a zero
  /// group (saturated: a group whose norm is below about 1e-37 sends zeros).
  GRADCOMP_HOST_DEVICE float forward_scale(std::size_t b) const {
    double const norm = sqrt(norms[b * block / group]);
    return norm > 0.0 ? saturated(sqrt(group_coordinates(b)) / norm * rotation) : 0.0f;
  }
  /// max norm / sqrt(coordinates in the group) x rotation.
  GRADCOMP_HOST_DEVICE float backward_scale(std::size_t b) const {
    return static_cast<float>(sqrt(norms[b * block / group]) / sqrt(group_coordinates(b)) * rotation);
  }
};

/// The signs of a block into `signs`: 128 per Philox call where the block
/// allows (B >= 128; the calls in vector lanes), else one call per element.
inline void host_signs(thc_block_params const& p, std::size_t first, float* signs) {
  if (p.block >= 128) {
    uint4x32 words[4096 / 128];  // (the largest block)
    p.shared.blocks(first / 128, p.block / 128, words);
    for (std::size_t t = 0; t < p.block; t += 128) thc_signs128(words[t / 128], signs + t);
  } else {
    for (std::size_t t = 0; t < p.block; ++t) signs[t] = thc_sign(p.shared, first + t);
  }
}

/// This rank's rounding noise for a host block: the Philox blocks its
/// elements [first, first + size) draw from, in vector lanes.
/// Element first + t takes words[(first + t) / share - first / share].
inline void host_noise(random_stream const& mine, std::size_t first, std::size_t size, bool table, uint4x32* words) {
  std::size_t const share = thc_noise_share(table), begin = first / share, end = (first + size - 1) / share + 1;
  mine.blocks(begin, end - begin, words);
}

/// Asks for the cache lines of `bytes` from `p` on, into L2 (`write`: to be
/// written): a block's first loads and stores otherwise wait on memory while
/// the core idles, so each block fetches its successor's before it computes.
/// (Into L2, not L1: L1's few outstanding misses would stall this loop.)
inline void host_prefetch(void const* p, std::size_t bytes, bool write = false) {
  for (std::size_t o = 0; o < bytes; o += 64) {
    if (write)
      __builtin_prefetch(static_cast<char const*>(p) + o, 1, 3);
    else
      __builtin_prefetch(static_cast<char const*>(p) + o, 0, 3);
  }
}

/// Encode: one block from acc to lane values, keeping this rank's residual
/// (e = acc - what its own values decode to).
template <class Lane, class EF, class G = float>
struct thc_encode {
  thc_block_params p;
  G const* gradient;
  EF ef;
  Lane* levels;

  // Host: the block in `buffer`, its signs in `signs`, acc in `accs` (B
  // floats each). The random numbers come one Philox call per 128 signs and
  // per 8 (uniform) or 4 (table) roundings.
  void block(std::size_t b, float* buffer, float* signs, float* accs, uint4x32* noise,
             std::size_t streamed_bytes) const {
    std::size_t const first = b * p.block;
    std::size_t const inside = p.inside(first);
    auto const e = ef.bind();                  // a local copy: its pointers stay in registers, the loops vectorize
    G const* __restrict g = gradient + first;  // (only read while it lives)
    float* __restrict acc = accs;
    float* x = buffer;  // (no __restrict: the rotations below write the block too)
    float const* sign = signs;
    float const forward = p.forward_scale(b), backward = p.backward_scale(b);
    bool streamed = false;  // (the residual, written around the cache, is not fetched)
    if constexpr (decltype(e)::keeps_residual)
      streamed = streams_output(streamed_bytes, e.next, first, p.n, e.previous);
    if (std::size_t const next = first + p.block, count = p.inside(next); count > 0) {
      host_prefetch(gradient + next, count * sizeof(G));
      if constexpr (decltype(e)::keeps_residual) {
        host_prefetch(e.previous + next, count * sizeof(float));
        if (!streamed) host_prefetch(e.next + next, count * sizeof(float), true);
      }
    }
    host_signs(p, first, signs);
    for (std::size_t t = 0; t < inside; ++t) acc[t] = e.accumulate(first + t, static_cast<float>(g[t]));
    for (std::size_t t = 0; t < inside; ++t) x[t] = thc_finite_or_zero(acc[t]) * sign[t] * forward;
    for (std::size_t t = inside; t < p.block; ++t) x[t] = 0.0f;
    host_rotate(buffer, p.block, p.stages);
    host_noise(p.mine, first, p.block, p.codec.table, noise);
    if (p.codec.table || first % thc_noise_share(false) != 0) {
      std::size_t const share = thc_noise_share(p.codec.table);
      for (std::size_t t = 0; t < p.block; ++t) quantize(buffer, first, t, noise[(first + t) / share - first / share]);
    } else {  // the same values as quantize(), in a loop that vectorizes: element t draws 16-bit uniform t
      // Scalars and __restrict: a byte store may alias anything, which would
      // otherwise force every parameter to be reloaded, element by element.
      float const clamp = p.codec.clamp, top = p.codec.top;
      std::size_t const size = p.block;
      float* __restrict z = buffer;
      Lane* __restrict out = levels + first;
      static_assert(std::endian::native == std::endian::little, "the 16-bit uniforms are read as halves of words");
      auto const* __restrict halves = reinterpret_cast<std::uint16_t const*>(noise);
      for (std::size_t t = 0; t < size; ++t) {
        float const u = to_unit_float16(halves[t]);  // uniform16(noise[t / 8], t % 8)
        std::uint32_t const value = thc_round(z[t], u, clamp, top);
        out[t] = static_cast<Lane>(value);
        z[t] = thc_unround(static_cast<float>(value), clamp, top);
      }
    }
    host_rotate(buffer, p.block, p.stages);
    if constexpr (decltype(e)::keeps_residual) {
      if (streamed) {  // a residual larger than the cache: around it
        for (std::size_t t = 0; t < inside; ++t) acc[t] = acc[t] - thc_restore(x[t], backward, sign[t]);
        return stream_copy(e.next + first, acc, inside * sizeof(float));
      }
    }
    for (std::size_t t = 0; t < inside; ++t) e.update(first + t, acc[t] - thc_restore(x[t], backward, sign[t]));
  }

  // Rotated coordinate -> lane value; the block keeps this rank's own decode
  // (in rotated units). `words` is the Philox block element first + t draws
  // from (thc_noise).
  GRADCOMP_HOST_DEVICE void quantize(float* buffer, std::size_t first, std::size_t t, uint4x32 const& words) const {
    float u1, u2;
    thc_noise(words, first + t, p.codec.table, u1, u2);
    std::uint32_t const value = p.codec.encode(buffer[t], u1, u2);
    levels[first + t] = static_cast<Lane>(value);
    buffer[t] = p.codec.decode(static_cast<float>(value));
  }
};

/// Decode: summed lane values of one block to the averaged output.
template <class Lane, class G = float>
struct thc_decode {
  thc_block_params p;
  Lane const* summed;
  G* gradient;

  // Host: the block in `buffer`, its signs in `signs`, and its output in
  // `staged` where it streams (B floats each).
  void block(std::size_t b, float* buffer, float* signs, float* staged, uint4x32*, std::size_t streamed_bytes) const {
    std::size_t const first = b * p.block;
    float const backward = p.backward_scale(b);
    bool const streamed =
        std::is_same_v<G, float> && streams_output(streamed_bytes, gradient, first, p.n);  // (then not fetched)
    if (std::size_t const next = first + p.block, count = p.inside(next); count > 0) {
      host_prefetch(summed + next, p.block * sizeof(Lane));
      if (!streamed) host_prefetch(gradient + next, count * sizeof(G), true);
    }
    for (std::size_t t = 0; t < p.block; ++t) dequantize(buffer, first, t);
    host_rotate(buffer, p.block, p.stages);
    host_signs(p, first, signs);
    G* __restrict out = gradient + first;
    float const* __restrict x = buffer;
    float const* __restrict sign = signs;
    std::size_t const inside = p.inside(first);  // (a count: the loop vectorizes)
    if constexpr (std::is_same_v<G, float>) {
      if (streamed) {  // an output larger than the cache: around it
        float* __restrict values = staged;
        for (std::size_t t = 0; t < inside; ++t) values[t] = thc_restore(x[t], backward, sign[t]);
        return stream_copy(out, values, inside * sizeof(float));
      }
    }
    for (std::size_t t = 0; t < inside; ++t) out[t] = G(thc_restore(x[t], backward, sign[t]));
  }
  GRADCOMP_HOST_DEVICE void dequantize(float* buffer, std::size_t first, std::size_t t) const {
    buffer[t] = fused(static_cast<float>(summed[first + t]), p.sum_step, -p.codec.clamp);
  }
  GRADCOMP_HOST_DEVICE void store(float const* buffer, std::size_t first, std::size_t t, float backward,
                                  float sign) const {
    gradient[first + t] = G(thc_restore(buffer[t], backward, sign));
  }
  /// A vetoed step under nonfinite_policy::propagate: NaN everywhere.
  void poison() const {
    for (std::size_t i = 0; i < p.n; ++i) gradient[i] = G(poison_value<float>());
  }
};

/// Rotation blocks first, first + 1, ..., end - 1 of a bucket.
struct block_range {
  std::size_t first, end;
  std::size_t size() const { return end - first; }
};

/// Runs f.block(b, buffer) for every rotation block b of `blocks` on the
/// host, in parallel, while `when` is open.
template <class F>
void for_each_block(host_space const& space, block_range blocks, std::size_t block_size, F const& f, gate when = {}) {
  gate_state const state = read_gate(when);
  if (state == gate_state::poisoned) {
    if constexpr (requires { f.poison(); }) f.poison();
  }
  if (state != gate_state::open) return;
  [[maybe_unused]] int const threads = space.threads_for(blocks.size() * block_size);
  GRADCOMP_OMP(parallel num_threads(threads)) {
    alignas(64) float buffer[4096], signs[4096], accs[4096];  // the largest rotation block
    uint4x32 noise[4096 / 4 + 1];
    GRADCOMP_OMP(for schedule(static) nowait)
    for (std::size_t b = blocks.first; b < blocks.end; ++b)
      f.block(b, buffer, signs, accs, noise, space.streamed_bytes);
    stream_fence();  // (a block may stream its output) before the region's barrier
  }
}

template <class Tag, class Dependent = void>
struct thc_device {
  static_assert(always_false<Tag, Dependent>,
                "THC's CUDA kernels are compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};

#if GRADCOMP_HAS_CUDA
template <class F>
void for_each_block(cuda_space const& space, block_range blocks, std::size_t block_size, F const& f, gate when = {}) {
  thc_device<cuda_kernels_tag, F>::for_each_block(space, blocks, block_size, f, when);
}
#endif

}  // namespace gradcomp::detail
