// The tuning of gradcomp's loops, in one place (as CUB's tuning headers):
// the CUDA kernels' launch shape (every kernel runs blocks of block_threads
// threads and sizes its grids from the limits here), and a policy per
// algorithm for its host passes and kernels. The algorithms name these
// values; no other header holds a tuning constant. Plain C++, so the host
// side can read it too.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>

namespace gradcomp::inline GRADCOMP_ABI::detail::tuning {

/// Threads per block of every kernel: 8 warps, enough to hide latency with
/// several blocks resident per SM, few enough for one block's shared-memory
/// reductions to stay small.
inline constexpr int block_threads = 256;

/// Grid limit of the one-index-per-thread loops (grid-stride beyond it).
inline constexpr std::size_t index_max_blocks = 4096;

/// transform (algorithm/transform.hpp): elements a host thread takes at a
/// time, as plain arrays the compiler vectorizes; a multiple of 8 (whole
/// Philox calls of noise).
struct transform_policy {
  static constexpr std::size_t host_chunk = 2048;
};

/// segmented_reduce (algorithm/segmented_reduce.hpp): values per tile of its
/// canonical order, and the lanes a tile's sum is split over in double.
/// Both fix the order of the additions, so the bits of every norm and score
/// (the same on host and device): changing them changes results, which is
/// why they are not free to tune per machine.
struct segmented_reduce_policy {
  static constexpr std::size_t tile = 4096;
  static constexpr int lanes = 128;
};

/// top_k (algorithm/top_k.hpp and detail/top_k/): the host's three
/// strategies and the device's selection.
struct top_k_policy {
  /// Radix select: 16-bit digits (2^16 bins) from this many keys on, 8-bit below.
  static constexpr std::size_t radix_wide_from = std::size_t{1} << 20;
  /// Two-pass select: histograms of the keys' bits above pass_shift (2^11
  /// bins, small enough for L1), in pass_copies interleaved copies so that
  /// equal neighbours do not wait on one counter.
  static constexpr int pass_shift = 21, pass_copies = 4;
  /// Sampled select: sample_runs runs of sample_run consecutive keys (a run is
  /// a few cache lines), spread evenly over the keys.
  static constexpr std::size_t sample_runs = 256, sample_run = 256;
  /// Both: keys tested at once (one vector test) for any that must be copied
  /// out, before going key by key.
  static constexpr std::size_t skip_run = 16;
  /// Device: keys per tile of the index-ordered compaction, and the grid
  /// limit of its histogram passes (grid-stride beyond it).
  static constexpr std::size_t tile = 4096, max_blocks = 1024;
};

/// host_space::streamed_bytes by default: a host pass writes an output
/// larger than this around the cache, with streaming stores. Beyond it the
/// output would not stay cached for the next pass anyway, and ordinary
/// stores first read every line they write. Above a DDP bucket's 25 MiB, so
/// such buckets stay as they were.
inline constexpr std::size_t host_streamed_bytes = std::size_t{32} << 20;

}  // namespace gradcomp::detail::tuning
