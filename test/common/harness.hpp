// Test harness shared by the host, MPI and CUDA test executables: worlds of
// ranks, fresh random gradients, and moving data in and out of a space.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace gradcomp::testing {

/// The in-process world: `ranks` threads on one local_group.
struct local_world {
  static constexpr char const* name = "local_group";
  int ranks = 4;
  template <class Body>
  void run(Body&& body) const {
    local_group::run(ranks, [&](local_group::communicator& comm) { body(comm); });
  }
};

/// A seed every rank agrees on: GRADCOMP_TEST_SEED if set, else fresh from
/// rank 0's random_device, so each run draws new inputs and a failure prints
/// the seed that reproduces it.
template <class Collective>
std::uint64_t shared_seed(Collective& comm) {
  std::uint64_t seed[1] = {0};
  if (comm.rank() == 0) {
    if (char const* fixed = std::getenv("GRADCOMP_TEST_SEED"))
      seed[0] = std::strtoull(fixed, nullptr, 10);
    else
      seed[0] = (static_cast<std::uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  }
  comm.broadcast(seed, 1, 0);
  return seed[0];
}

/// Rank r's gradient: d values spread over several orders of magnitude and
/// both signs, a different stream per rank.
inline std::vector<float> random_gradient(std::uint64_t seed, int rank, std::size_t d) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 6);
  std::vector<float> g(d);
  for (auto& x : g) x = std::ldexp(normal(rng), exponent(rng));
  return g;
}

/// Every rank's gradient for one step.
inline std::vector<std::vector<float>> random_gradients(std::uint64_t seed, int ranks, std::size_t d) {
  std::vector<std::vector<float>> all;
  for (int r = 0; r < ranks; ++r) all.push_back(random_gradient(seed, r, d));
  return all;
}

/// Copies host values into a new buffer of `space`.
template <class Space, class T>
buffer<T, Space> upload(Space const& space, std::vector<T> const& values) {
  buffer<T, Space> b(values.size(), space);
  space.from_host(b.data(), values.data(), values.size() * sizeof(T));
  return b;
}

/// Copies `count` values from `space` memory to the host.
template <class Space, class T>
std::vector<std::remove_const_t<T>> download(Space const& space, T* data, std::size_t count) {
  std::vector<std::remove_const_t<T>> host(count);
  space.to_host(host.data(), data, count * sizeof(T));
  return host;
}

/// A test body's setup: where it runs and over which world.
template <class Space, class World>
struct setup {
  using space = Space;
  using world = World;
  static Space make_space() { return Space{}; }
};

/// True when `mine` holds bitwise the same values as rank 0's vector.
template <class Collective, class T>
bool same_as_rank0(Collective& comm, std::vector<T> const& mine) {
  std::vector<T> rank0 = mine;
  comm.broadcast(rank0.data(), rank0.size(), 0);
  return std::memcmp(rank0.data(), mine.data(), mine.size() * sizeof(T)) == 0;
}

/// One step, settled: on the host a bad step throws from the call itself, on
/// the CUDA space from the next call or synchronize(); this throws from
/// whichever reports it first, so one test body serves both.
template <class Reducer, class Gradient>
void settled_step(Reducer& reducer, Gradient gradient) {
  reducer(gradient);
  reducer.synchronize();
}

/// True when a and b hold the same bits (so NaN == NaN, +0 != -0).
inline bool same_bits(float a, float b) { return detail::float_bits(a) == detail::float_bits(b); }

/// The mean output of `steps` runs of compressor c (no error feedback) on
/// the same input x, one rank: each step draws new rounding noise.
template <class Space, class C>
std::vector<double> average_output(Space const& space, local_group::communicator& comm, C const& c,
                                   std::vector<float> const& x, int steps) {
  allreducer<C, error_feedback::none, local_group::communicator, allreduce_aggregator, Space> reduce(
      c, comm, bucket_layout(x.size()), space);
  std::vector<double> sum(x.size(), 0.0);
  for (int s = 0; s < steps; ++s) {
    auto g = upload(space, x);
    reduce(g.view());
    auto const out = download(space, g.data(), x.size());
    for (std::size_t i = 0; i < x.size(); ++i) sum[i] += out[i];
  }
  for (auto& v : sum) v /= steps;
  return sum;
}

/// Root mean square of a - x.
inline double rms_distance(std::vector<double> const& a, std::vector<float> const& x) {
  double e = 0;
  for (std::size_t i = 0; i < x.size(); ++i) e += (a[i] - x[i]) * (a[i] - x[i]);
  return std::sqrt(e / x.size());
}

/// How far `out` lies from the mean over ranks of every rank's `own` (what
/// it sent, decoded): the largest gap, and the largest |mean| to scale it by.
struct gap_to_mean {
  double worst = 0, scale = 0;
};
template <class Collective>
gap_to_mean gap_to_mean_of_own(Collective& comm, std::vector<float> const& own, std::vector<float> const& out) {
  std::size_t const d = own.size();
  int const n = comm.size();
  std::vector<float> all(d * n);
  comm.all_gather(own.data(), all.data(), d);
  gap_to_mean gap;
  for (std::size_t i = 0; i < d; ++i) {
    double mean = 0;
    for (int r = 0; r < n; ++r) mean += all[r * d + i];
    mean /= n;
    gap.worst = std::max(gap.worst, std::fabs(out[i] - mean));
    gap.scale = std::max(gap.scale, std::fabs(mean));
  }
  return gap;
}

/// Runs compressor c with error feedback for `steps` steps on one rank, the
/// input of step s drawn from seed + s; after each step appends to `drift`
/// the distance between the running sums of inputs and of outputs. Returns
/// the last output.
template <class Space, class C>
std::vector<float> run_with_feedback(Space const& space, local_group::communicator& comm, C const& c,
                                     std::uint64_t seed, std::size_t d, int steps, std::vector<double>& drift) {
  allreducer<C, error_feedback::residual, local_group::communicator, allreduce_aggregator, Space> reduce(
      c, comm, bucket_layout(d), space);
  std::vector<double> in(d, 0.0), out(d, 0.0);
  std::vector<float> last;
  for (int s = 0; s < steps; ++s) {
    auto const x = random_gradient(seed + s, 0, d);
    auto g = upload(space, x);
    reduce(g.view());
    last = download(space, g.data(), d);
    double diff = 0;
    for (std::size_t i = 0; i < d; ++i) {
      in[i] += x[i];
      out[i] += last[i];
      diff += (in[i] - out[i]) * (in[i] - out[i]);
    }
    drift.push_back(std::sqrt(diff));
  }
  return last;
}

}  // namespace gradcomp::testing
