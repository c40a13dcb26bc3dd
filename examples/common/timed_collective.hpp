// A collective backend of your own is one class with rank(), size(),
// accepts(), all_reduce(), all_gather() and broadcast() (the concept
// gradcomp::collective), and the optional members it can offer. This one
// wraps any other backend, forwards its optional members, and measures the
// time and bytes spent communicating, which is what a training loop needs to
// split a step into compute, compression and communication.
#pragma once

#include <gradcomp/collectives/collective.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>

/// Forwards to `Inner` and accumulates wall time and message bytes.
template <gradcomp::collective Inner>
class timed_collective {
 public:
  explicit timed_collective(Inner& inner) : inner_(inner) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  bool accepts(gradcomp::memory_kind kind) const { return inner_.accepts(kind); }

  template <gradcomp::wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, gradcomp::reduce_op op) {
    timed(count * sizeof(T), [&] { inner_.all_reduce(send, recv, count, op); });
  }
  template <gradcomp::wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    timed(count * sizeof(T) * size(), [&] { inner_.all_gather(send, recv, count); });
  }
  template <gradcomp::wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    timed(count * sizeof(T), [&] { inner_.broadcast(buffer, count, root); });
  }

  template <gradcomp::wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count,
                      gradcomp::reduce_op op) requires gradcomp::reduce_scattering<Inner> {
    timed(count * sizeof(T) * size(), [&] { inner_.reduce_scatter(send, recv, count, op); });
  }

  // Optional members (see gradcomp::collective), forwarded where the inner
  // backend has them, so that wrapping it loses none: its asynchronous
  // failures, and the execution space its buffers suit (a timed NCCL
  // communicator still runs its reducers on its stream).
  void check_async() requires requires(Inner& i) { i.check_async(); }
  { inner_.check_async(); }
  friend auto default_space(timed_collective const& t) { return default_space(t.inner_); }

  /// Seconds spent in collectives so far (readable from any thread while
  /// another calls collectives: a reducer's progress thread).
  double seconds() const { return seconds_.load(); }
  /// Message bytes so far.
  std::size_t bytes() const { return bytes_.load(); }
  /// Collective calls so far.
  int calls() const { return calls_.load(); }

 private:
  // Host backends return when the data is in place; timing an asynchronous
  // backend (NCCL) this way would need CUDA events instead.
  template <class Call>
  void timed(std::size_t bytes, Call&& call) {
    auto const start = std::chrono::steady_clock::now();
    call();
    seconds_.fetch_add(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    bytes_.fetch_add(bytes);
    calls_.fetch_add(1);
  }

  Inner& inner_;
  std::atomic<double> seconds_{0};
  std::atomic<std::size_t> bytes_{0};
  std::atomic<int> calls_{0};
};
