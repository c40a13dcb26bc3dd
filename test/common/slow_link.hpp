// A collective of known latency and bandwidth, for the tests of what
// measures the network (the planner's fit, the DDP hook's auto).
#pragma once

#include <gradcomp/collectives/local_group.hpp>

#include <chrono>
#include <cstddef>
#include <thread>

namespace gradcomp::testing {

// Whether sleeps and spins keep their time here: not under ThreadSanitizer,
// whose scheduling of the two ranks' threads has put a fit 25% off on a
// busy 2-core machine (a fit is still checked to be every rank's).
#if defined(__SANITIZE_THREAD__)  // (as property_test.cpp detects it: CI's TSan build is GCC's)
inline constexpr bool faithful_timing = false;
#else
inline constexpr bool faithful_timing = true;
#endif
// Whether the build is optimized: a choice that rests on a compressor's
// local work being far under a modeled call's time holds only there.
#if defined(__OPTIMIZE__)
inline constexpr bool optimized_build = true;
#else
inline constexpr bool optimized_build = false;
#endif

// local_group, but every call takes latency + bytes x per_byte from its
// start, its own work included (so a slow build, as under a sanitizer, adds
// nothing while that work is shorter): a network of known terms (the bytes
// as the fits count them).
struct slow_link {
  local_group::communicator* inner;
  double latency, per_byte;
  std::size_t calls = 0;  // made so far
  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  bool accepts(memory_kind k) const { return inner->accepts(k); }
  template <class Call>
  void modeled(double bytes,
               Call&& call) {  // (sleeps overshoot by a few hundred microseconds here: the last one spins)
    ++calls;
    auto const until =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(latency + bytes * per_byte));
    call();
    std::this_thread::sleep_until(until - std::chrono::milliseconds(1));
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  template <wire_type T>
  void all_reduce(T const* s, T* r, std::size_t n, reduce_op op) {
    modeled(static_cast<double>(n * sizeof(T)), [&] { inner->all_reduce(s, r, n, op); });
  }
  template <wire_type T>
  void all_gather(T const* s, T* r, std::size_t n) {
    modeled(static_cast<double>(n * sizeof(T)) * size(), [&] { inner->all_gather(s, r, n); });
  }
  template <wire_type T>
  void broadcast(T* b, std::size_t n, int root) {
    modeled(static_cast<double>(n * sizeof(T)), [&] { inner->broadcast(b, n, root); });
  }
  template <wire_type T>
  void reduce_scatter(T const* s, T* r, std::size_t n, reduce_op op) {
    modeled(static_cast<double>(n * sizeof(T)) * size(), [&] { inner->reduce_scatter(s, r, n, op); });
  }
};

}  // namespace gradcomp::testing
