// THC: tensor homomorphic compression (Li et al., NSDI 2024), with the
// HotNets 2024 changes: partial rotation and saturation.
//
// Per step, with acc = g + e and the bucket cut into rotation blocks of B
// elements (the last zero-padded) and scale groups of G elements:
//   1. norm pass: the squared norm of acc per rotation block [reads g, e],
//      then per group (from the block norms: two short sums, so a GPU warp
//      never walks a whole group); the ranks agree on the largest of each
//      group with one all-reduce(max). A rotation keeps norms, so no
//      transform is needed for this.
//   2. encode pass, one block at a time [reads g, e; writes levels, e]:
//      random signs D (shared seed: the same on every rank), `stages`
//      Walsh-Hadamard butterflies (all log2 B of them: the full rotation;
//      fewer: partial rotation, cheaper and less Gaussian), scale by
//      sqrt(G) / max norm, clamp at +-T (saturation: the clipped part stays
//      in the residual), unbiased stochastic rounding to integer lane values
//      with per-rank randomness; then, in the same pass, the rank decodes its
//      own values, rotates back, and keeps e = acc - own decode (acc stays
//      in the block's buffer: g and e are read once).
//   3. all-reduce(sum) of the lane values in the Lane type.
//   4. decode pass, one block at a time [reads levels; writes g]: mean value
//      -> z -> scale back -> inverse rotation -> output.
// Wire bytes: padded d x sizeof(Lane) + 4 per group. A lane must hold the
// sum of n ranks' values: n x top <= max(Lane), checked at construction.
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/compressors/thc/math.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/mean_codec.hpp>
#include <gradcomp/detail/squared_norms.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace gradcomp {

/// THC's quantizers.
enum class thc_quantizer {
  uniform,  ///< 2^bits evenly spaced levels over [-T, T], one stochastic rounding.
  table,    ///< THC's published 16-entry table over 0..30, two stochastic roundings.
};

namespace detail {

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
  std::size_t n;       // elements in the bucket
  std::size_t block;   // B
  int stages;          // butterfly stages
  std::size_t group;   // G
  float const* norms;  // squared norms, max over ranks, per group
  float rotation;      // 2^(-stages/2): makes the unnormalized butterflies orthonormal
  thc_codec codec;
  random_stream shared;  // signs
  random_stream mine;    // this rank's rounding noise
  float sum_step;  // 2T / (top x n): a lane sum of n ranks' values to z, with one fused multiply-add

  /// sqrt(coordinates in the group) / max norm, or 0 for a zero group.
  GRADCOMP_HOST_DEVICE float forward_scale(std::size_t block_index) const {
    std::size_t const first = block_index * block, g = first / group;
    std::size_t const padded = (n + block - 1) / block * block;
    std::size_t const coords = (g + 1) * group <= padded ? group : padded - g * group;
    float const norm = sqrtf(norms[g]);
    return norm > 0.0f ? sqrtf(static_cast<float>(coords)) / norm * rotation : 0.0f;
  }
  GRADCOMP_HOST_DEVICE float backward_scale(std::size_t block_index) const {
    std::size_t const first = block_index * block, g = first / group;
    std::size_t const padded = (n + block - 1) / block * block;
    std::size_t const coords = (g + 1) * group <= padded ? group : padded - g * group;
    return sqrtf(norms[g]) / sqrtf(static_cast<float>(coords)) * rotation;
  }
};

/// The signs of a block into `signs`: 128 per Philox call where the block
/// allows (B >= 128), else one call per element.
inline void host_signs(thc_block_params const& p, std::size_t first, float* signs) {
  if (p.block >= 128) {
    for (std::size_t t = 0; t < p.block; t += 128) thc_signs128(p.shared, first + t, signs + t);
  } else {
    for (std::size_t t = 0; t < p.block; ++t) signs[t] = thc_sign(p.shared, first + t);
  }
}

/// One butterfly stage over a host block, pairs `half` apart, in runs of
/// `half` contiguous pairs: thc_butterfly's arithmetic, pair for pair. A
/// compile-time Half lets the compiler vectorize the short strides.
template <std::size_t Half>
void host_stage(float* block, std::size_t size, std::size_t half = Half) {
  for (std::size_t base = 0; base < size; base += 2 * half) {
    float* __restrict lo = block + base;
    float* __restrict hi = block + base + half;
    for (std::size_t j = 0; j < half; ++j) {
      float const a = lo[j], b = hi[j];
      lo[j] = a + b;
      hi[j] = a - b;
    }
  }
}

/// Two stages (pairs `half`, then 2 `half` apart) in one pass over the block:
/// the same adds and subtracts as two host_stage calls, so the same bits,
/// with half the loads and stores.
template <std::size_t Half>
void host_stage_pair(float* block, std::size_t size, std::size_t half = Half) {
  for (std::size_t base = 0; base < size; base += 4 * half) {
    float* __restrict q0 = block + base;
    float* __restrict q1 = q0 + half;
    float* __restrict q2 = q1 + half;
    float* __restrict q3 = q2 + half;
    for (std::size_t j = 0; j < half; ++j) {
      float const a = q0[j], b = q1[j], c = q2[j], d = q3[j];
      float const ab = a + b, a_b = a - b, cd = c + d, c_d = c - d;
      q0[j] = ab + cd;
      q2[j] = ab - cd;
      q1[j] = a_b + c_d;
      q3[j] = a_b - c_d;
    }
  }
}

/// The first `stages` butterfly stages on a host block, two per pass.
inline void host_rotate(float* block, std::size_t size, int stages) {
  int s = 0;
  for (; s + 2 <= stages; s += 2) {
    switch (s) {
      case 0:
        host_stage_pair<1>(block, size);
        break;
      case 2:
        host_stage_pair<4>(block, size);
        break;
      default:
        host_stage_pair<0>(block, size, std::size_t{1} << s);
        break;
    }
  }
  if (s < stages) {
    switch (s) {
      case 0:
        host_stage<1>(block, size);
        break;
      case 2:
        host_stage<4>(block, size);
        break;
      default:
        host_stage<0>(block, size, std::size_t{1} << s);
        break;
    }
  }
}

/// This rank's rounding noise for a host block: the Philox blocks its
/// elements [first, first + size) draw from, in one loop (which vectorizes).
/// Element first + t takes words[(first + t) / share - first / share].
inline void host_noise(random_stream const& mine, std::size_t first, std::size_t size, bool table, uint4x32* words) {
  std::size_t const share = thc_noise_share(table), begin = first / share, end = (first + size - 1) / share + 1;
  for (std::size_t k = 0; k < end - begin; ++k) words[k] = mine(begin + k);
}

/// Encode: one block from acc to lane values, keeping this rank's residual.
/// The host runs it per block; the device kernel (thc.cuh) runs the same
/// steps with a thread block sharing `buffer` in shared memory.
template <class Lane, class EF>
struct thc_encode {
  thc_block_params p;
  float const* gradient;
  EF ef;
  Lane* levels;

  // Host: the block in `buffer`, its signs in `signs`, acc in `accs` (B
  // floats each). The random numbers come one Philox call per 128 signs and
  // per 8 (uniform) or 4 (table) roundings.
  void block(std::size_t b, float* buffer, float* signs, float* accs, uint4x32* noise) const {
    std::size_t const first = b * p.block;
    std::size_t const inside = first + p.block <= p.n ? p.block : (first < p.n ? p.n - first : 0);
    EF const e = ef;                               // a local copy: its pointers stay in registers, the loops vectorize
    float const* __restrict g = gradient + first;  // (only read while it lives)
    float* __restrict acc = accs;
    float* x = buffer;  // (no __restrict: the rotations below write the block too)
    float const* sign = signs;
    host_signs(p, first, signs);
    for (std::size_t t = 0; t < inside; ++t) acc[t] = e.accumulate(first + t, g[t]);
    for (std::size_t t = 0; t < inside; ++t) x[t] = acc[t] * sign[t];
    for (std::size_t t = inside; t < p.block; ++t) x[t] = 0.0f;
    host_rotate(buffer, p.block, p.stages);
    float const forward = p.forward_scale(b), backward = p.backward_scale(b);
    host_noise(p.mine, first, p.block, p.codec.table, noise);
    if (p.codec.table || first % thc_noise_share(false) != 0) {
      std::size_t const share = thc_noise_share(p.codec.table);
      for (std::size_t t = 0; t < p.block; ++t)
        quantize(buffer, first, t, forward, backward, noise[(first + t) / share - first / share]);
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
        std::uint32_t const value = thc_round(z[t] * forward, u, clamp, top);
        out[t] = static_cast<Lane>(value);
        z[t] = thc_unround(static_cast<float>(value), clamp, top) * backward;
      }
    }
    host_rotate(buffer, p.block, p.stages);
    for (std::size_t t = 0; t < inside; ++t) e.update(first + t, acc[t] - x[t] * sign[t], mean_codec<float>::fits(acc[t]));
  }

  // Rotated coordinate -> lane value; the block keeps this rank's own decode.
  // `words` is the Philox block element first + t draws from (thc_noise).
  GRADCOMP_HOST_DEVICE void quantize(float* buffer, std::size_t first, std::size_t t, float forward, float backward,
                                     uint4x32 const& words) const {
    float u1, u2;
    thc_noise(words, first + t, p.codec.table, u1, u2);
    std::uint32_t const value = p.codec.encode(buffer[t] * forward, u1, u2);
    levels[first + t] = static_cast<Lane>(value);
    buffer[t] = p.codec.decode(static_cast<float>(value)) * backward;
  }
};

/// Decode: summed lane values of one block to the averaged output.
template <class Lane>
struct thc_decode {
  thc_block_params p;
  Lane const* summed;
  float* gradient;

  void block(std::size_t b, float* buffer, float* signs, float*, uint4x32*) const {
    std::size_t const first = b * p.block;
    float const backward = p.backward_scale(b);
    for (std::size_t t = 0; t < p.block; ++t) dequantize(buffer, first, t, backward);
    host_rotate(buffer, p.block, p.stages);
    host_signs(p, first, signs);
    float* __restrict out = gradient + first;
    float const* __restrict x = buffer;
    float const* __restrict sign = signs;
    for (std::size_t t = 0; t < p.block && first + t < p.n; ++t) out[t] = x[t] * sign[t];
  }
  GRADCOMP_HOST_DEVICE void dequantize(float* buffer, std::size_t first, std::size_t t, float backward) const {
    buffer[t] = fused(static_cast<float>(summed[first + t]), p.sum_step, -p.codec.clamp) * backward;
  }
  GRADCOMP_HOST_DEVICE void store(float const* buffer, std::size_t first, std::size_t t, float sign) const {
    gradient[first + t] = buffer[t] * sign;
  }
};

/// Runs f.block(b, buffer) for every rotation block on the host, in parallel.
template <class F>
void for_each_block(host_space const& space, std::size_t blocks, std::size_t block_size, F const& f) {
  [[maybe_unused]] int const threads = space.threads_for(blocks * block_size);
  GRADCOMP_OMP(parallel num_threads(threads)) {
    alignas(64) float buffer[4096], signs[4096], accs[4096];  // the largest rotation block
    uint4x32 noise[4096 / 4 + 1];
    GRADCOMP_OMP(for schedule(static))
    for (std::size_t b = 0; b < blocks; ++b) f.block(b, buffer, signs, accs, noise);
  }
}

template <class Tag, class Dependent = void>
struct thc_device {
  static_assert(always_false<Tag, Dependent>,
                "THC's CUDA kernels are compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};
struct thc_device_tag;

#if GRADCOMP_HAS_CUDA
template <class F>
void for_each_block(cuda_space const& space, std::size_t blocks, std::size_t block_size, F const& f) {
  thc_device<thc_device_tag, F>::for_each_block(space, blocks, block_size, f);
}
#endif

}  // namespace detail

/// THC (see the top of this header).
///
/// \tparam Lane the summation lane: std::uint8_t, std::uint32_t or
///               std::int32_t. (No 16-bit lane: NCCL cannot sum 16-bit integers.)
template <class Lane = std::uint8_t>
struct thc {
  static_assert(std::is_same_v<Lane, std::uint8_t> || std::is_same_v<Lane, std::uint32_t> ||
                    std::is_same_v<Lane, std::int32_t>,
                "thc sums its levels in std::uint8_t, std::uint32_t or std::int32_t lanes (NCCL has no 16-bit "
                "integer sum)");

  /// Name for messages and reports.
  static constexpr std::string_view name = "thc";
  /// Integer lane values of every rank add element by element.
  static constexpr bool summable_payload = true;

  std::size_t block = 1024;      ///< B, the rotation block: a power of two up to 4096.
  int stages = -1;               ///< Butterfly stages (partial rotation); -1: log2(B), the full transform.
  std::size_t group = 1u << 20;  ///< G, elements sharing a scale (a multiple of B).
  thc_quantizer quantizer = thc_quantizer::uniform;  ///< Uniform levels or THC's table.
  int bits = 4;                                      ///< uniform: 2^bits levels.
  double overflow = 32;                              ///< o: the clamp T = Phi^-1(1 - 1/(2o)) (o = 32: T = 2.15387).
  float clamp = 0;                                   ///< T itself, when > 0 (overrides `overflow`).
  std::uint64_t seed = 0;                            ///< Shared signs and per-rank rounding derive from it.

  /// Stages applied.
  int stage_count() const { return stages < 0 ? std::countr_zero(block) : stages; }
  /// The largest value one rank puts in a lane.
  std::uint32_t top() const { return quantizer == thc_quantizer::table ? 30u : (1u << bits) - 1u; }
  /// T.
  float clamp_value() const { return clamp > 0 ? clamp : detail::thc_clamp_for(overflow); }
  /// Elements after padding the bucket to whole blocks.
  std::size_t padded(std::size_t d) const { return (d + block - 1) / block * block; }
  /// Scale groups of a bucket.
  std::size_t groups(std::size_t d) const { return (padded(d) + group - 1) / group; }

  /// Throws invalid_argument for a block that is not a power of two (or
  /// beyond 4096), more stages than log2(B), a group that is not a multiple
  /// of B, levels the lane cannot hold, or n ranks whose summed levels could
  /// overflow the lane (saturation).
  void validate(bucket_layout const&, int ranks) const {
    GRADCOMP_EXPECTS(block >= 2 && block <= 4096 && std::has_single_bit(block),
                     "thc: rotation block " + std::to_string(block) + " is not a power of two in [2, 4096]");
    GRADCOMP_EXPECTS(stage_count() <= std::countr_zero(block),
                     "thc: " + std::to_string(stages) + " butterfly stages, but a block of " + std::to_string(block) +
                         " has only " + std::to_string(std::countr_zero(block)));
    GRADCOMP_EXPECTS(group >= block && group % block == 0, "thc: the scale group (" + std::to_string(group) +
                                                               ") must be a multiple of the block (" +
                                                               std::to_string(block) + ")");
    GRADCOMP_EXPECTS(quantizer == thc_quantizer::table || (bits >= 1 && bits <= 16),
                     "thc: " + std::to_string(bits) + " bits per level is outside 1..16");
    GRADCOMP_EXPECTS(clamp > 0 || overflow > 1, "thc: the overflow frequency o must exceed 1");
    std::uint64_t const limit = static_cast<std::uint64_t>(std::numeric_limits<Lane>::max());
    std::uint64_t const sum = static_cast<std::uint64_t>(ranks) * top();
    GRADCOMP_EXPECTS(sum <= limit, "thc: " + std::to_string(ranks) + " ranks x levels 0.." + std::to_string(top()) +
                                       " sum to " + std::to_string(sum) + ", beyond the " +
                                       std::string(name_of(dtype_of_v<Lane>)) + " lane (max " + std::to_string(limit) +
                                       "); use a wider lane or fewer levels");
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), block);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(stage_count()));
    h = detail::hash_combine(h, group);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(quantizer) * 64 + static_cast<std::uint64_t>(bits));
    h = detail::hash_combine(h, std::bit_cast<std::uint32_t>(clamp_value()));
    h = detail::hash_combine(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;
    span<float, Memory> block_norms;  ///< Squared norm per rotation block.
    span<float, Memory> norms;        ///< Squared norm per group; then the max over ranks.
    span<Lane, Memory> levels;  ///< Lane values of the padded bucket.
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.block_norms = w.template take<float>(padded(layout.size()) / block);
    ws.norms = w.template take<float>(groups(layout.size()));
    ws.levels = w.template take<Lane>(padded(layout.size()));
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.levels.size_bytes(), ranks));
    return ws;
  }

  /// The norms (all-reduce max) and the lane values.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return groups(layout.size()) * sizeof(float) +
           detail::aggregated_wire_bytes<Aggregator>(padded(layout.size()) * sizeof(Lane), ranks);
  }

  /// One step: gradient <- the mean over ranks of their decoded THC payloads.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    std::size_t const d = gradient.size(), blocks = ws.levels.size() / block;

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    detail::grouped_sum_of_squares(space, d, block, group / block,
                                   detail::accumulated<EF>{gradient.data(), ctx.error_feedback()},
                                   ws.block_norms.data(), ws.norms.data(), ws.counters.data());
    ctx.agree_all_finite(ws.counters.data(), "NaN, infinite, or so large that a group's squared norm overflows");
    ctx.all_reduce(ws.norms, reduce_op::max);

    std::uint32_t const step = static_cast<std::uint32_t>(ctx.step());
    detail::thc_block_params const p{
        d,
        block,
        stage_count(),
        group,
        ws.norms.data(),
        detail::thc_rotation_scale(stage_count()),
        {clamp_value(), static_cast<float>(top()), quantizer == thc_quantizer::table},
        random_stream(seed, step, random_stream::shared),
        random_stream(seed ^ 0x9e3779b97f4a7c15ull, step, static_cast<std::uint32_t>(ctx.rank())),
        static_cast<float>(2.0 * clamp_value() / (static_cast<double>(top()) * ctx.ranks()))};
    detail::for_each_block(space, blocks, block,
                           detail::thc_encode<Lane, EF>{p, gradient.data(), ctx.error_feedback(), ws.levels.data()});
    ctx.aggregate(ws.levels, ws.scratch);
    detail::for_each_block(space, blocks, block, detail::thc_decode<Lane>{p, ws.levels.data(), gradient.data()});
  }
};

static_assert(compressor<thc<>>);

}  // namespace gradcomp
