// The host execution space: loops over elements on the CPU, parallel with
// OpenMP when the translation unit is compiled with it, serial otherwise.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution/tuning.hpp>
#include <gradcomp/span.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::inline GRADCOMP_ABI {

/// Runs element loops on the host. Copyable; a value names how to run.
struct host_space {
  using memory = host_memory;  ///< Host buffers only.

  /// OpenMP threads per loop; 0 uses OpenMP's default. Ignored without OpenMP.
  int threads = 0;
  /// A pass writes an output of more bytes than this with streaming stores,
  /// around the cache (see tuning::host_streamed_bytes): lower it where a
  /// bucket's outputs are not read again while the cache still holds them.
  std::size_t streamed_bytes = detail::tuning::host_streamed_bytes;

  /// Allocates `bytes` aligned to 64 bytes (a cache line, a full AVX-512
  /// vector). Throws std::bad_alloc.
  void* allocate(std::size_t bytes) const { return ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{64}); }
  /// Frees memory from allocate().
  void deallocate(void* p) const { ::operator delete (p, std::align_val_t{64}); }
  /// Copies `bytes` between buffers of this space.
  void copy(void* dst, void const* src, std::size_t bytes) const {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  /// Sets `bytes` to zero: memset over the space's threads in runs of 256
  /// KiB (whole lines, not read first).
  void fill_zero(void* dst, std::size_t bytes) const {
    constexpr std::size_t run = std::size_t{1} << 18;
    std::size_t const runs = (bytes + run - 1) / run;
    if (runs <= 1) {  // (no thread team for a small fill)
      if (bytes != 0) std::memset(dst, 0, bytes);
      return;
    }
    [[maybe_unused]] int const team = threads_for(bytes / sizeof(float));
    GRADCOMP_OMP(parallel for schedule(static) num_threads(team))
    for (std::size_t r = 0; r < runs; ++r) {
      std::size_t const first = r * run;
      std::memset(static_cast<char*>(dst) + first, 0, bytes - first < run ? bytes - first : run);
    }
  }
  /// Copies from this space's memory to host memory.
  void to_host(void* host_dst, void const* src, std::size_t bytes) const { copy(host_dst, src, bytes); }
  /// Copies from host memory into this space's memory.
  void from_host(void* dst, void const* host_src, std::size_t bytes) const { copy(dst, host_src, bytes); }
  /// Waits for the space's work; host work is already done.
  void synchronize() const {}

  /// Threads a loop of `n` elements should use: small loops stay serial,
  /// where starting a thread team costs more than it saves.
  int threads_for(std::size_t n) const {
#if GRADCOMP_HAS_OPENMP
    if (n < 32768) return 1;
    return threads > 0 ? threads : omp_get_max_threads();
#else
    (void)n;
    return 1;
#endif
  }
};

/// The most threads a host loop ever uses for per-thread scratch, fixed for
/// the life of the process (the processors OpenMP saw first, capped at 64):
/// workspaces sized with it stay valid whatever thread count the user sets
/// later. Loops with more threads than this share the scratch out in turns.
inline int host_thread_capacity() {
#if GRADCOMP_HAS_OPENMP
  static int const capacity = omp_get_num_procs() < 1 ? 1 : (omp_get_num_procs() > 64 ? 64 : omp_get_num_procs());
  return capacity;
#else
  return 1;
#endif
}

/// Calls f(i) for every i in [0, n), in parallel over the space's threads.
/// f must be safe to call concurrently for distinct i. (Element passes over
/// a gradient use transform(), which streams their inputs and outputs; this
/// is for index loops: gathers, scatters, small fills.)
template <class F>
void parallel_for(host_space const& space, std::size_t n, F const& f) {
  [[maybe_unused]] int const threads = space.threads_for(n);
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads))
  for (std::size_t i = 0; i < n; ++i) f(i);
}

}  // namespace gradcomp
