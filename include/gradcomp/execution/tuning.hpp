// The CUDA kernels' launch shape, in one place: every kernel of gradcomp
// runs blocks of block_threads threads and sizes its grids from the limits
// here. Plain C++, so the host side can read it too.
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

}  // namespace gradcomp::detail::tuning
