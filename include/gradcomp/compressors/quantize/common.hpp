// What the integer all-reduce quantizers (QSGD-MaxNorm and its variants,
// IntSGD) share: the bucket's squared norm in two short levels, element
// loops that draw 16-bit rounding uniforms eight per Philox call, signed
// stochastic rounding, and the lane-headroom check.
//
// Element functors give `bind()`, which reads the step's scalars (a norm, a
// scale) from workspace memory once and returns a copy holding them, and
// `element(i[, u])`. The host binds once per chunk and its element loops
// vectorize; a CUDA thread binds once per call.
#pragma once

#include <gradcomp/collective.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/squared_norms.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/random.hpp>
#include <gradcomp/span.hpp>
#include <gradcomp/types.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

namespace gradcomp::detail {

/// Elements per first-level tile of a bucket's squared norm.
inline constexpr std::size_t norm_tile = 4096;

/// Tiles of a bucket of n elements.
constexpr std::size_t norm_tiles(std::size_t n) { return (n + norm_tile - 1) / norm_tile; }

/// *total = Σ value(i)^2 over [0, n), in two levels (tiles of norm_tile,
/// then all tiles as one group). Bad (non-finite) sums count into *counter.
template <class Space, class Value>
void bucket_sum_of_squares(Space const& space, std::size_t n, Value const& value, float* tiles, float* total,
                           std::uint64_t* counter) {
  grouped_sum_of_squares(space, n, norm_tile, norm_tiles(n), value, tiles, total, counter);
}

/// The norm round of the QSGD family: ||value||^2 over [0, n) (bad values
/// counted into counters[0], which the caller zeroed), every rank checks that
/// no rank saw a bad value, then all take the largest squared norm.
template <class Context, class Value>
void agree_largest_squared_norm(Context& ctx, std::size_t n, Value const& value, float* tiles,
                                span<float, typename Context::memory> squared_norm, std::uint64_t* counters) {
  bucket_sum_of_squares(ctx.space(), n, value, tiles, squared_norm.data(), counters);
  ctx.agree_all_finite(counters, "NaN, infinite, or so large that the squared norm overflows");
  ctx.all_reduce(squared_norm, reduce_op::max);
}

/// Host: f.element(i, u) over a chunk, its Philox calls first in one loop.
inline constexpr std::size_t noise_chunk = 4096;  // a multiple of 8

template <class F>
struct noise_chunks {
  F f;
  random_stream noise;
  void chunk(std::size_t, std::size_t begin, std::size_t end) const {
    uint4x32 words[noise_chunk / 8];
    std::size_t const calls = (end - begin + 7) / 8;
    for (std::size_t k = 0; k < calls; ++k) words[k] = noise(begin / 8 + k);
    static_assert(std::endian::native == std::endian::little, "the 16-bit uniforms are read as halves of words");
    auto const* __restrict halves = reinterpret_cast<std::uint16_t const*>(words);
    auto const bound = f.bind();  // a local copy: its scalars and pointers stay in registers
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // every half read was written: calls x 8 >= end - begin
#endif
    for (std::size_t i = begin; i < end; ++i) bound.element(i, to_unit_float16(halves[i - begin]));
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  }
};

/// CUDA: one thread per Philox call, the eight elements it covers.
template <class F>
struct noise_groups {
  F f;
  random_stream noise;
  std::size_t n;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t k) const {
    uint4x32 const words = noise(k);
    auto const bound = f.bind();
    for (unsigned j = 0; j < 8; ++j)
      if (8 * k + j < n) bound.element(8 * k + j, uniform16(words, j));
  }
};

/// f.element(i, u) for every i in [0, n): u is uniform j = i % 8 of Philox
/// call i / 8 of `noise` (uniform16), the same on host and device.
template <class F>
void for_each_with_noise(host_space const& space, std::size_t n, random_stream noise, F const& f) {
  parallel_for_chunks(space, n, noise_chunk, noise_chunks<F>{f, noise});
}

/// Host: f.element(i) over a chunk, bound once.
template <class F>
struct bound_chunks {
  F f;
  void chunk(std::size_t, std::size_t begin, std::size_t end) const {
    auto const bound = f.bind();
    for (std::size_t i = begin; i < end; ++i) bound.element(i);
  }
};

/// CUDA: one thread binds once for eight elements, `stride` apart, so that
/// adjacent threads still touch adjacent elements (coalesced).
template <class F>
struct bound_groups {
  F f;
  std::size_t n, stride;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t k) const {
    auto const bound = f.bind();
    for (std::size_t i = k; i < n; i += stride) bound.element(i);
  }
};

/// f.element(i) for every i in [0, n).
template <class F>
void for_each_bound(host_space const& space, std::size_t n, F const& f) {
  parallel_for_chunks(space, n, noise_chunk, bound_chunks<F>{f});
}

#if GRADCOMP_HAS_CUDA
template <class F>
void for_each_with_noise(cuda_space const& space, std::size_t n, random_stream noise, F const& f) {
  parallel_for(space, (n + 7) / 8, noise_groups<F>{f, noise, n});
}
template <class F>
void for_each_bound(cuda_space const& space, std::size_t n, F const& f) {
  std::size_t const threads = (n + 7) / 8;
  parallel_for(space, threads, bound_groups<F>{f, n, threads});
}
#endif

/// |x| rounded to an integer at random, down or up with probability the
/// fraction (unbiased), with x's sign; x within the lane's range already.
/// Truncation for floor (|x| >= 0) and single-step selects: loops vectorize.
GRADCOMP_HOST_DEVICE std::int32_t signed_stochastic_round(float x, float u) {
  float const magnitude = x < 0.0f ? -x : x;
  std::int32_t const down = static_cast<std::int32_t>(magnitude);
  std::int32_t const rounded = down + static_cast<std::int32_t>(u < magnitude - static_cast<float>(down));
  std::int32_t const negative = -static_cast<std::int32_t>(x < 0.0f);  // all ones when x < 0
  return (rounded ^ negative) - negative;
}

/// acc - code x unit, the residual after sending a code: exact product in
/// double (|code| < 2^24 times a float), so however a compiler contracts it
/// the host and the device get the same bits; and plain arithmetic (no fma
/// call that may set errno) lets the select in a residual's update vectorize.
GRADCOMP_HOST_DEVICE float minus_product(float acc, std::int32_t code, float unit) {
  return static_cast<float>(static_cast<double>(acc) - static_cast<double>(code) * static_cast<double>(unit));
}

/// The largest |code| one rank may send so that the sum over `ranks` ranks
/// always fits a signed Lane: floor(max(Lane) / ranks).
template <class Lane>
constexpr std::int64_t per_rank_headroom(int ranks) {
  return static_cast<std::int64_t>(std::numeric_limits<Lane>::max()) / ranks;
}

/// Throws invalid_argument unless n ranks' codes of up to +-`largest` sum
/// inside the Lane; the message names n, the bits and the lane.
template <class Lane>
void expect_lane_headroom(std::string_view who, int ranks, std::int64_t largest, int bits) {
  std::int64_t const limit = std::numeric_limits<Lane>::max();
  GRADCOMP_EXPECTS(largest * ranks <= limit,
                   std::string(who) + ": " + std::to_string(ranks) + " ranks x codes up to +-" + std::to_string(largest) +
                       " (" + std::to_string(bits) + " bits) sum beyond the " + std::string(name_of(dtype_of_v<Lane>)) +
                       " lane (max " + std::to_string(limit) + "); use a wider lane, fewer bits or fewer ranks");
}

}  // namespace gradcomp::detail
