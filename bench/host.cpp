// Host benchmarks of every compressor's local work (encode + decode, no
// communication: one rank), beside a plain copy of the same gradient; then
// all-reduce against reduce-scatter on four in-process ranks.
//
//   gradcomp_bench [--benchmark_filter=...]
#include "common/bandwidth.hpp"

#include "common/rows.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

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

// One step on four in-process ranks (threads sharing this machine's cores):
// the all-reduce path, or the reduce-scatter a sharded optimizer needs, of the
// same bucket. Rank 0 times its steps; wire bytes are per rank, as
// step_context counts them (a reduce-scatter is half an all-reduce).
template <class Compressor, bool Scatter>
void four_ranks(benchmark::State& state, Compressor compressor) {
  std::size_t const d = static_cast<std::size_t>(state.range(0));
  host_space const space{};
  double const copy_seconds = bench::host_copy_seconds(space, d);
  auto const steps = static_cast<std::size_t>(state.max_iterations);
  double total = 0;
  std::size_t wire = 0;
  local_group::run(4, [&](local_group::communicator& world) {
    using EF = error_feedback::residual;
    using reducer = std::conditional_t<
        Scatter, reduce_scatterer<Compressor, EF, local_group::communicator, host_space>,
        allreducer<Compressor, EF, local_group::communicator, default_aggregator_t<Compressor>, host_space>>;
    reducer reduce(compressor, world, bucket_layout(d), space);
    std::vector<float> const g = bench::random_gradient(d, 42 + static_cast<unsigned>(world.rank()));
    std::vector<float> gradient(d), shard(d);
    auto run_step = [&] {
      std::copy(g.begin(), g.end(), gradient.begin());
      std::uint64_t together[1] = {0};  // every rank starts the step at once
      world.all_reduce(together, together, 1, reduce_op::sum);
      auto const start = std::chrono::steady_clock::now();
      if constexpr (Scatter)
        reduce(span<float>(gradient.data(), d), span<float>(shard.data(), reduce.shard_size()));
      else
        reduce(span<float>(gradient.data(), d));
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    run_step();  // first touch
    if (world.rank() == 0) {
      for (auto _ : state) {
        double const seconds = run_step();
        state.SetIterationTime(seconds);
        total += seconds;
      }
      wire = reduce.wire_bytes();
    } else {
      for (std::size_t i = 0; i < steps; ++i) run_step();
    }
  });
  bench::report(state, d, copy_seconds, wire, total);
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
  // The allreducer against the reduce-scatterer on four ranks, with error
  // feedback (classic TopK: its all-gather, which cannot reduce-scatter).
  for (char const* text :
       {"bf16:ef=on", "thc:bits=4,block=1024", "qsgd_multiscale", "topkc:fraction=0.01", "topk:fraction=0.01"}) {
    compressor_spec const spec = compressor_spec::parse(text);
    visit_compressor(spec, 4, [&](auto compressor, auto) {
      using C = decltype(compressor);
      auto const add = [&](std::string const& row, auto run) {
        benchmark::RegisterBenchmark(row.c_str(), run, compressor)
            ->Arg(1 << 22)
            ->Iterations(20)
            ->Repetitions(5)
            ->Unit(benchmark::kMillisecond)
            ->UseManualTime();
      };
      add("host4/all-reduce/" + spec.str(), four_ranks<C, false>);
      if constexpr (detail::shards_by_elements<C>) add("host4/reduce-scatter/" + spec.str(), four_ranks<C, true>);
      return 0;
    });
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
