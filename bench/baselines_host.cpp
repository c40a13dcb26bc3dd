// Host benchmarks of the baselines' local work (encode + decode, no
// communication: one rank), beside a plain copy of the same gradient.
//
//   gradcomp_bench [--benchmark_filter=...]
#include "common/bandwidth.hpp"

#include <gradcomp/gradcomp.hpp>

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
void step(benchmark::State& state) {
  std::size_t const d = static_cast<std::size_t>(state.range(0));
  host_space const space{};
  double const copy_seconds = bench::host_copy_seconds(space, d);
  single_rank<host_space> world(space);
  allreducer<Compressor, EF, single_rank<host_space>> reduce(Compressor{}, world, bucket_layout(d), space,
                                                             {.nonfinite = nonfinite_policy::propagate});
  std::vector<float> const g = bench::random_gradient(d, 42);
  buffer<float, host_space> gradient(d, space);
  space.copy(gradient.data(), g.data(), d * sizeof(float));
  // Each step rewrites the gradient with its mean over one rank: the data
  // stays random, and no kernel's speed depends on the values.
  double const total = bench::timed_loop(state, bench::host_timer{}, [&] { reduce(gradient.view()); });
  // Report the wire bytes of a real multi-rank step of the same bucket.
  bench::report(state, d, copy_seconds, Compressor{}.template wire_bytes<allreduce_aggregator>(reduce.layout(), 4),
                total);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t d : {1 << 20, 1 << 24, 1 << 26}) b->Arg(d);
  b->Unit(benchmark::kMillisecond)->UseManualTime();
}

BENCHMARK(copy)->Name("host/copy")->Apply(sizes);
BENCHMARK(step<fp32, error_feedback::none>)->Name("host/fp32")->Apply(sizes);
BENCHMARK(step<bf16, error_feedback::none>)->Name("host/bf16")->Apply(sizes);
BENCHMARK(step<bf16, error_feedback::residual>)->Name("host/bf16+ef")->Apply(sizes);
BENCHMARK(step<fp16, error_feedback::none>)->Name("host/fp16")->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
