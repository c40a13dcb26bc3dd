// The tuning of gradcomp's loops, in one place: the CUDA kernels' launch
// shape (every kernel runs blocks of block_threads threads and sizes its
// grids from the limits here) and the host passes' choices. Plain C++, so
// the host side can read it too.
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

/// Grid limit of the top-k histogram passes (grid-stride beyond it).
inline constexpr std::size_t select_max_blocks = 1024;

/// host_space::streamed_bytes by default: a host pass writes an output
/// larger than this around the cache, with streaming stores. Beyond it the
/// output would not stay cached for the next pass anyway, and ordinary
/// stores first read every line they write. Above a DDP bucket's 25 MiB, so
/// such buckets stay as they were.
inline constexpr std::size_t host_streamed_bytes = std::size_t{32} << 20;

}  // namespace gradcomp::detail::tuning
