// The host execution space: loops over elements on the CPU, parallel with
// OpenMP when the translation unit is compiled with it, serial otherwise.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/lane_sum.hpp>
#include <gradcomp/span.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp {

/// Runs element loops on the host. Copyable; a value names how to run.
struct host_space {
  using memory = host_memory;  ///< Host buffers only.

  /// OpenMP threads per loop; 0 uses OpenMP's default. Ignored without OpenMP.
  int threads = 0;

  /// Allocates `bytes` aligned to 64 bytes (a cache line, a full AVX-512
  /// vector). Throws std::bad_alloc.
  void* allocate(std::size_t bytes) const { return ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{64}); }
  /// Frees memory from allocate().
  void deallocate(void* p) const { ::operator delete (p, std::align_val_t{64}); }
  /// Copies `bytes` between buffers of this space.
  void copy(void* dst, void const* src, std::size_t bytes) const {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  /// Sets `bytes` to zero.
  void fill_zero(void* dst, std::size_t bytes) const {
    if (bytes != 0) std::memset(dst, 0, bytes);
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

/// Calls f(i) for every i in [0, n), in parallel over the space's threads.
/// f must be safe to call concurrently for distinct i.
template <class F>
void parallel_for(host_space const& space, std::size_t n, F const& f) {
  [[maybe_unused]] int const threads = space.threads_for(n);
  GRADCOMP_OMP(parallel for simd schedule(static) num_threads(threads))
  for (std::size_t i = 0; i < n; ++i) f(i);
}

/// Calls f(i) for every i in [0, n) and adds the number of calls that
/// returned true to `*counter` (a count of bad elements, say).
template <class F>
void parallel_count(host_space const& space, std::size_t n, F const& f, std::uint64_t* counter) {
  [[maybe_unused]] int const threads = space.threads_for(n);
  std::uint64_t count = 0;
  // No `simd` here: GCC vectorizes this reduction better on its own.
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads) reduction(+ : count))
  for (std::size_t i = 0; i < n; ++i) count += f(i) ? 1u : 0u;
  *counter += count;
}

/// Calls f.chunk(j, begin, end) for every chunk [j * chunk, min(n, (j + 1) *
/// chunk)) in parallel: for loops whose work depends on the chunk, so the
/// inner loop is uniform and vectorizes. (The CUDA space calls f(i) per
/// element instead; f provides both.)
template <class F>
void parallel_for_chunks(host_space const& space, std::size_t n, std::size_t chunk, F const& f) {
  std::size_t const chunks = (n + chunk - 1) / chunk;
  [[maybe_unused]] int const threads = space.threads_for(n);
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads))
  for (std::size_t j = 0; j < chunks; ++j) f.chunk(j, j * chunk, j * chunk + chunk < n ? j * chunk + chunk : n);
}

namespace detail {
// The segment sums of both flavours (see segment_sum_of_squares / segment_sum).
template <bool Squares, class Value, class Finish>
void host_segment_sums(host_space const& space, std::size_t n, std::size_t segment_size, Value const& value,
                       Finish const& finish, std::uint64_t* counter) {
  std::size_t const segments = (n + segment_size - 1) / segment_size;
  [[maybe_unused]] int const threads = space.threads_for(n);
  auto const add = [](float acc, float x) { return Squares ? add_square(acc, x) : acc + x; };
  std::uint64_t count = 0;
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads) reduction(+ : count))
  for (std::size_t j = 0; j < segments; ++j) {
    std::size_t const begin = j * segment_size;
    std::size_t const end = begin + segment_size < n ? begin + segment_size : n;
    float partial[sum_lanes] = {};
    std::size_t i = begin;
    for (; i + sum_lanes <= end; i += sum_lanes)  // whole rows of 32: vectorized
      for (int lane = 0; lane < sum_lanes; ++lane) partial[lane] = add(partial[lane], value(i + lane));
    for (int lane = 0; i + lane < end; ++lane) partial[lane] = add(partial[lane], value(i + lane));
    count += finish(j, butterfly_sum(partial)) ? 1u : 0u;
  }
  *counter += count;
}
}  // namespace detail

/// For each segment j of `segment_size` consecutive elements of [0, n) (the
/// last may be shorter): sum = Σ value(i)^2 in the canonical lane order of
/// detail/lane_sum.hpp, then `*counter += finish(j, sum)` (finish returns
/// whether the segment was bad). Bitwise the same as the CUDA version.
template <class Value, class Finish>
void segment_sum_of_squares(host_space const& space, std::size_t n, std::size_t segment_size, Value const& value,
                            Finish const& finish, std::uint64_t* counter) {
  detail::host_segment_sums<true>(space, n, segment_size, value, finish, counter);
}

/// As segment_sum_of_squares, summing value(i) itself (plain adds in the
/// same lane order): for a second level over partial sums.
template <class Value, class Finish>
void segment_sum(host_space const& space, std::size_t n, std::size_t segment_size, Value const& value,
                 Finish const& finish, std::uint64_t* counter) {
  detail::host_segment_sums<false>(space, n, segment_size, value, finish, counter);
}

}  // namespace gradcomp
