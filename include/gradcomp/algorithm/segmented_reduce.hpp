// segmented_reduce: per-segment sums of squares or maxima of an element
// pass, in a fixed order that host loops and CUDA warps both follow, so the
// totals are bitwise equal on both.
//
//   segmented_reduce<reduction::sum_of_squares>(space, n, segment, inputs(g, e), op, finish,
//                                               {.scratch = s, .count = c, .limit = L})
//
// op(i, g[i], e[i]) returns the element's value, a float. A value that is
// NaN or beyond `limit` in magnitude (infinity, or a value a wire lane cannot
// carry) is bad: it is counted into *count and contributes nothing, so one
// bad value does not poison a norm. For each segment j of `segment`
// consecutive elements (the last may be shorter) finish(j, total) receives
// the total, a double.
//
// The canonical order. A range of up to 4096 values is reduced in 128 lanes:
// value t goes to lane t % 128, each lane accumulates its values in order,
// then lane l takes lane l + 64, then l + 32, ..., l + 1 (lane 0 holds the
// total). Squares of floats are exact in double, so each addition rounds
// once however a compiler arranges it: no fused multiply-add can change a
// bit. A segment longer than 4096 is cut into tiles of 4096, and the tile
// totals (the last segment's missing tiles count as zero) are reduced the
// same way, recursively: every level is fully parallel, and no GPU warp ever
// walks more than 4096 values. On the GPU one warp takes a range: lane l
// holds values 4l..4l+3 of every 128 (one 16-byte load per stream), so its
// shuffles xor 16, 8, 4, 2, 1 are the host's +64 ... +4, and its own four
// values the +2 and +1.
//
// Accumulating in double also means no square of a finite float overflows or
// underflows: norms of values near 1e30 or 1e-30 come out right.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/detail/checked.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/tuning.hpp>
#include <gradcomp/execution/workspace.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// What segmented_reduce computes per segment.
enum class reduction {
  sum_of_squares,  ///< Σ value^2 (a squared L2 norm).
  max_abs,         ///< max |value|.
};

/// What else segmented_reduce takes.
template <class Memory>
struct reduce_options {
  /// Scratch of segmented_reduce_scratch_bytes(n, segment) bytes (none for
  /// segments of at most 4096).
  span<std::byte, Memory> scratch{};
  /// Adds the number of bad values here (memory of the space), if not null.
  std::uint64_t* count = nullptr;
  /// Values beyond this magnitude, and NaN, are bad.
  float limit = 3.40282347e38f;
};

namespace detail {

/// Values per tile of the canonical order, and its lanes (tuning::segmented_reduce_policy).
inline constexpr std::size_t reduce_tile = tuning::segmented_reduce_policy::tile;
inline constexpr int reduce_lanes = tuning::segmented_reduce_policy::lanes;

/// Tiles of one segment.
GRADCOMP_HOST_DEVICE constexpr std::size_t tiles_per_segment(std::size_t segment) {
  return segment <= reduce_tile ? 1 : (segment + reduce_tile - 1) / reduce_tile;
}

/// What a value adds under reduction R: nothing when it is bad.
template <reduction R>
GRADCOMP_HOST_DEVICE double contribution(float value, bool good) {
  double const v = static_cast<double>(select(good, value, 0.0f));  // (a select on bits: loops vectorize)
  if constexpr (R == reduction::sum_of_squares)
    return v * v;
  else
    return v < 0 ? -v : v;
}
/// Two partial totals under R.
template <reduction R>
GRADCOMP_HOST_DEVICE double combine(double a, double b) {
  if constexpr (R == reduction::max_abs)
    return a < b ? b : a;
  else
    return a + b;
}

/// The lane tree of the canonical order over p[0..128), `len` values long
/// (levels whose upper lanes are all still zero are skipped: adding zero
/// changes no bit of a non-negative total). Returns the total.
template <reduction R>
double host_lane_tree(double* p, std::size_t len) {
  for (std::size_t o = reduce_lanes / 2; o >= 1; o /= 2) {
    if (len > o)
      for (std::size_t l = 0; l < o; ++l) p[l] = combine<R>(p[l], p[l + o]);
  }
  return p[0];
}

/// Bytes of scratch per level above the first.
inline std::size_t reduce_level_bytes(std::size_t values, std::size_t segment) {
  std::size_t const m = segment == 0 ? 0 : (values + segment - 1) / segment;
  return checked_mul(checked_mul(m, tiles_per_segment(segment), "segmented_reduce"), sizeof(double),
                     "segmented_reduce");
}

// Host: lane l of p accumulates values l, l + 128, ... of one range; v(k)
// returns value k's contribution.
template <reduction R, class Value>
void host_lanes(double* p, std::size_t len, Value const& v) {
  std::size_t base = 0;
  for (; base + reduce_lanes <= len; base += reduce_lanes) {
    GRADCOMP_OMP(simd)
    for (int l = 0; l < reduce_lanes; ++l) p[l] = combine<R>(p[l], v(base + l));
  }
  for (std::size_t l = 0; base + l < len; ++l) p[l] = combine<R>(p[l], v(base + l));
}

template <reduction R, class Op, class... I, std::size_t... Is, class Out>
void host_reduce_first(host_space const& space, std::size_t n, std::size_t segment, pack<I...> const& in, Op const& op,
                       Out const& out, std::uint64_t* count, float limit, std::index_sequence<Is...>) {
  static_assert((!std::is_same_v<I, rounding_noise> && ...), "segmented_reduce reads no noise");
  std::size_t const tiles = tiles_per_segment(segment), tile = segment <= reduce_tile ? segment : reduce_tile;
  std::size_t const ranges = (n + segment - 1) / segment * tiles;
  [[maybe_unused]] int const threads = space.threads_for(n);
  std::uint64_t bad = 0;
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads) reduction(+ : bad))
  for (std::size_t range = 0; range < ranges; ++range) {
    std::size_t const j = range / tiles, t = range % tiles;
    std::size_t const segment_end = (j + 1) * segment < n ? (j + 1) * segment : n;
    std::size_t const begin = j * segment + t * tile;
    std::size_t const len = begin >= segment_end ? 0 : (begin + tile <= segment_end ? tile : segment_end - begin);
    auto const bound = bind_op(op);
    auto const rin = resolve_all(in);
    [[maybe_unused]] alignas(64) float widened_in[(is_widened<I> || ...) ? sizeof...(I) : 1][reduce_tile];
    auto const cin = make_pack(
        host_input(get<Is>(rin), begin, len, is_widened<I> ? widened_in[(is_widened<I> || ...) ? Is : 0] : nullptr)...);
    alignas(64) double p[reduce_lanes] = {};
    std::uint64_t bad_here = 0;
    std::size_t base = 0;
    for (; base + reduce_lanes <= len; base += reduce_lanes) {
      GRADCOMP_OMP(simd reduction(+ : bad_here))
      for (int l = 0; l < reduce_lanes; ++l) {
        float const v = bound(begin + base + l, get<Is>(cin)[base + l]...);
        bool const good = within(v, limit);
        bad_here += good ? 0u : 1u;
        p[l] = combine<R>(p[l], contribution<R>(v, good));
      }
    }
    for (std::size_t l = 0; base + l < len; ++l) {
      float const v = bound(begin + base + l, get<Is>(cin)[base + l]...);
      bool const good = within(v, limit);
      bad_here += good ? 0u : 1u;
      p[l] = combine<R>(p[l], contribution<R>(v, good));
    }
    bad += bad_here;
    out(range, host_lane_tree<R>(p, len));
  }
  if (count != nullptr) *count += bad;
}

template <reduction R, class Out>
void host_reduce_upper(host_space const& space, std::size_t values, std::size_t segment, double const* in,
                       Out const& out) {
  std::size_t const tiles = tiles_per_segment(segment), tile = segment <= reduce_tile ? segment : reduce_tile;
  std::size_t const ranges = (values + segment - 1) / segment * tiles;
  [[maybe_unused]] int const threads = space.threads_for(values);
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads))
  for (std::size_t range = 0; range < ranges; ++range) {
    std::size_t const j = range / tiles, t = range % tiles;
    std::size_t const segment_end = (j + 1) * segment < values ? (j + 1) * segment : values;
    std::size_t const begin = j * segment + t * tile;
    std::size_t const len = begin >= segment_end ? 0 : (begin + tile <= segment_end ? tile : segment_end - begin);
    alignas(64) double p[reduce_lanes] = {};
    host_lanes<R>(p, len, [&](std::size_t k) { return in[begin + k]; });
    out(range, host_lane_tree<R>(p, len));
  }
}

template <class Tag, class... T>
struct cuda_reduce {
  static_assert(always_false<Tag, T...>,
                "gradcomp's CUDA segmented_reduce is compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};

/// Stores level totals into scratch, or hands the last level's to finish.
struct store_total {
  double* totals;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t range, double total) const { totals[range] = total; }
};

/// The levels of a reduction: level 0 reads the streams, each later one the
/// doubles the one before stored, until one total per segment remains.
template <class Memory, class First, class Upper, class Finish>
void reduce_levels(std::size_t n, std::size_t segment, span<std::byte, Memory> scratch, First const& first,
                   Upper const& upper, Finish const& finish) {
  workspace_carver<Memory> carver(scratch);
  if (segment <= reduce_tile) return first(finish);
  std::size_t values = n, seg = segment;
  double* previous = nullptr;
  bool first_level = true;
  while (true) {
    std::size_t const tiles = tiles_per_segment(seg);
    std::size_t const m = (values + seg - 1) / seg;
    if (tiles == 1) {  // this level's ranges are whole segments: hand the totals to finish
      upper(values, seg, previous, finish);
      return;
    }
    double* totals = carver.template take<double>(m * tiles).data();
    if (first_level)
      first(store_total{totals});
    else
      upper(values, seg, previous, store_total{totals});
    first_level = false;
    previous = totals;
    values = m * tiles;
    seg = tiles;
  }
}

}  // namespace detail

/// Bytes of scratch segmented_reduce needs for n elements in segments of
/// `segment` (none for segments of at most 4096).
inline std::size_t segmented_reduce_scratch_bytes(std::size_t n, std::size_t segment) {
  workspace_carver<host_memory> measure;
  std::size_t values = n, seg = segment;
  while (seg > detail::reduce_tile) {
    std::size_t const tiles = detail::tiles_per_segment(seg);
    measure.take<double>(detail::reduce_level_bytes(values, seg) / sizeof(double));
    values = (values + seg - 1) / seg * tiles;
    seg = tiles;
  }
  return measure.bytes();
}

/// Per-segment totals on the host (see the top of this header).
template <reduction R, class Op, class... I, class Finish>
void segmented_reduce(host_space const& space, std::size_t n, std::size_t segment, input_streams<I...> const& in,
                      Op const& op, Finish const& finish, reduce_options<host_memory> const& options = {}) {
  if (n == 0 || segment == 0) return;
  detail::reduce_levels(
      n, segment, options.scratch,
      [&](auto const& out) {
        detail::host_reduce_first<R>(space, n, segment, in.streams, op, out, options.count, options.limit,
                                     std::index_sequence_for<I...>{});
      },
      [&](std::size_t values, std::size_t seg, double const* previous, auto const& out) {
        detail::host_reduce_upper<R>(space, values, seg, previous, out);
      },
      finish);
}

#if GRADCOMP_HAS_CUDA
/// The same on the CUDA space, asynchronously (segmented_reduce.cuh; count
/// and scratch are device memory, finish runs in the kernel).
template <reduction R, class Op, class... I, class Finish>
void segmented_reduce(cuda_space const& space, std::size_t n, std::size_t segment, input_streams<I...> const& in,
                      Op const& op, Finish const& finish, reduce_options<device_memory> const& options = {}) {
  if (n == 0 || segment == 0) return;
  using kernels = detail::cuda_reduce<detail::cuda_kernels_tag, Op, detail::pack<I...>>;
  detail::reduce_levels(
      n, segment, options.scratch,
      [&](auto const& out) {
        kernels::template first<R>(space, n, segment, in.streams, op, out, options.count, options.limit);
      },
      [&](std::size_t values, std::size_t seg, double const* previous, auto const& out) {
        kernels::template upper<R>(space, values, seg, previous, out);
      },
      finish);
}
#endif

}  // namespace gradcomp
