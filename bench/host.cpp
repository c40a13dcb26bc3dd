// Host benchmarks of every compressor's local work (encode + decode, no
// communication: one rank), beside a plain copy of the same gradient.
//
//   gradcomp_bench [--benchmark_filter=...]
#include "common/bandwidth.hpp"

#include "common/rows.hpp"

#include <gradcomp/gradcomp.hpp>

#include <cmath>

namespace {

using namespace gradcomp;

// Copy of the gradient itself: the yardstick, as a row of its own.
void copy(benchmark::State& state) {
  std::size_t const d = static_cast<std::size_t>(state.range(0));
  host_space const space{};
  double const copy_seconds = bench::host_copy_seconds(space, d);
  buffer<float, host_space> src(d, space), dst(d, space);
  float* s = src.data();
  float* t = dst.data();
  parallel_for(space, d, [s](std::size_t i) { s[i] = 1.0f; });
  double const total = bench::timed_loop(state, bench::host_timer{}, [&] {
    parallel_for(space, d, [s, t](std::size_t i) { t[i] = s[i]; });
    benchmark::DoNotOptimize(t);
  });
  bench::report(state, d, copy_seconds, 0, total);
}

// One allreducer step on a one-rank world: the compressor's local work.
template <class Compressor, class EF>
void step(benchmark::State& state, Compressor compressor, bucket_layout const& layout) {
  std::size_t const d = layout.size();
  host_space const space{};
  double const copy_seconds = bench::host_copy_seconds(space, d);
  single_rank<host_space> world(space);
  allreducer<Compressor, EF, single_rank<host_space>> reduce(compressor, world, layout, space,
                                                             {.nonfinite = nonfinite_policy::propagate});
  std::vector<float> const g = bench::random_gradient(d, 42);
  buffer<float, host_space> gradient(d, space);
  space.copy(gradient.data(), g.data(), d * sizeof(float));
  reduce(gradient.view());  // warm-up: first touch of the workspace, the initial Q
  // The accuracy this speed buys: relative error of that one step's output.
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < d; ++i) {
    err += (double(gradient.data()[i]) - g[i]) * (double(gradient.data()[i]) - g[i]);
    norm += double(g[i]) * g[i];
  }
  state.counters["step_rel_error"] = std::sqrt(err / norm);
  // Every step starts from the same random gradient (restored untimed): fed
  // its own output, a lossy compressor would decay it toward subnormal
  // numbers, which x86 computes slowly.
  double const total = bench::timed_loop(
      state, bench::host_timer{}, [&] { reduce(gradient.view()); },
      [&] { space.copy(gradient.data(), g.data(), d * sizeof(float)); });
  // Report the wire bytes of a real multi-rank step of the same bucket.
  bench::report(state, d, copy_seconds,
                compressor.template wire_bytes<default_aggregator_t<Compressor>>(reduce.layout(), 4), total);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t d : {1 << 20, 1 << 24, 1 << 26}) b->Arg(d);
  b->Unit(benchmark::kMillisecond)->UseManualTime();
}

// Registers rows of this binary's step (see bench/common/rows.hpp).
struct registrar {
  template <class Compressor, class EF>
  static void add(std::string const& name, Compressor compressor = {}) {
    benchmark::RegisterBenchmark(name.c_str(), [compressor](benchmark::State& state) {
      step<Compressor, EF>(state, compressor, bucket_layout(static_cast<std::size_t>(state.range(0))));
    })->Apply(sizes);
  }

  // A row over a shaped bucket (its size is the row's argument).
  template <class Compressor, class EF>
  static void add_layout(std::string const& name, bucket_layout const& layout, Compressor compressor = {}) {
    benchmark::RegisterBenchmark(
        name.c_str(),
        [compressor, layout](benchmark::State& state) { step<Compressor, EF>(state, compressor, layout); })
        ->Arg(static_cast<std::int64_t>(layout.size()))
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
};

}  // namespace

int main(int argc, char** argv) {
  using namespace gradcomp;
  benchmark::RegisterBenchmark("host/copy", copy)->Apply(sizes);
  bench::register_compressor_rows<registrar>("host");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
