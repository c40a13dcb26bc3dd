// The yardstick every gradcomp benchmark reports against: the time of a
// plain copy of the same gradient (read d floats, write d floats) in the same
// execution space with the same threads, measured in the same binary.
//
// Each row reports
//   bytes_per_second  gradient bytes (d * 4) processed per second,
//   copy_fraction     copy time / the row's time per step (1.0 = as fast as
//                     a copy; a compressor that moves ~4 gradient-sized
//                     passes runs near 0.25-0.5),
//   wire_B_per_elem   bytes the step puts on the wire per gradient element.
#pragma once

#include <gradcomp/execution.hpp>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <random>
#include <vector>

namespace gradcomp::bench {

/// Median of a few samples.
inline double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

/// Times host work with the wall clock.
struct host_timer {
  /// Seconds body() took.
  template <class Body>
  double operator()(Body&& body) const {
    auto const start = std::chrono::steady_clock::now();
    body();
    benchmark::ClobberMemory();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

/// Seconds for an OpenMP-parallel copy of `elements` floats on the host with
/// `space`'s threads: median of 11 after 3 warm-ups. Timed afresh for every
/// row (and every repetition of it), right beside it: a machine's bandwidth
/// drifts over a run, and a copy timed minutes earlier is no yardstick.
inline double host_copy_seconds(host_space const& space, std::size_t elements) {
  buffer<float, host_space> src(elements, space), dst(elements, space);
  float* s = src.data();
  float* d = dst.data();
  parallel_for(space, elements, [s](std::size_t i) { s[i] = static_cast<float>(i & 1023); });
  auto copy = [&] { parallel_for(space, elements, [s, d](std::size_t i) { d[i] = s[i]; }); };
  for (int rep = 0; rep < 3; ++rep) copy();
  std::vector<double> samples;
  for (int rep = 0; rep < 11; ++rep) samples.push_back(host_timer{}(copy));
  return median(samples);
}

/// Fills `values` with normally distributed gradients of mixed magnitude
/// (never zeros: some kernels are faster on them).
inline std::vector<float> random_gradient(std::size_t elements, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<float> g(elements);
  for (auto& x : g) x = normal(rng);
  return g;
}

/// Runs the benchmark loop, timing each iteration with `seconds_of(body)`
/// (wall clock on the host, CUDA events on a device) as manual time, and
/// returns the total, which report() needs. `prepare` runs untimed before
/// each iteration (e.g. to restore the input a step overwrote).
template <class Timer, class Body, class Prepare = void (*)()>
double timed_loop(
    benchmark::State& state, Timer&& seconds_of, Body&& body, Prepare&& prepare = [] {}) {
  double total = 0;
  for (auto _ : state) {
    prepare();
    double const seconds = seconds_of(body);
    state.SetIterationTime(seconds);
    total += seconds;
  }
  return total;
}

/// Sets the standard counters of a row that processed `elements` gradient
/// values per iteration in `total_seconds`, given the copy time of the same
/// gradient.
inline void report(benchmark::State& state, std::size_t elements, double copy_seconds, std::size_t wire_bytes,
                   double total_seconds) {
  double const per_step = total_seconds / static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(elements) * 4);
  state.counters["copy_fraction"] = copy_seconds / per_step;
  state.counters["wire_B_per_elem"] = static_cast<double>(wire_bytes) / static_cast<double>(elements);
  state.counters["copy_GBps"] = 8.0 * static_cast<double>(elements) / copy_seconds * 1e-9;
}

}  // namespace gradcomp::bench
