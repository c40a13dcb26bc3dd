// CUDA benchmarks of every compressor's local work (encode + decode on one
// rank), timed with CUDA events, beside a device-to-device copy of the same
// gradient. Rows are skipped where no GPU is present.
//
//   gradcomp_bench_cuda [--benchmark_filter=...]
#include "common/bandwidth.hpp"

#include "common/rows.hpp"

#include <gradcomp/compressors/powersgd/powersgd.cuh>
#include <gradcomp/cuda.cuh>

namespace {

using namespace gradcomp;

// Times `body` with CUDA events on the space's stream.
class event_timer {
 public:
  explicit event_timer(cudaStream_t stream) : stream_(stream) {
    GRADCOMP_CUDA_TRY(cudaEventCreate(&start_));
    GRADCOMP_CUDA_TRY(cudaEventCreate(&stop_));
  }
  ~event_timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  template <class Body>
  double operator()(Body&& body) {
    GRADCOMP_CUDA_TRY(cudaEventRecord(start_, stream_));
    body();
    GRADCOMP_CUDA_TRY(cudaEventRecord(stop_, stream_));
    GRADCOMP_CUDA_TRY(cudaEventSynchronize(stop_));
    float ms = 0;
    GRADCOMP_CUDA_TRY(cudaEventElapsedTime(&ms, start_, stop_));
    return ms * 1e-3;
  }

 private:
  cudaStream_t stream_;
  cudaEvent_t start_{}, stop_{};
};

// Device-to-device copy of d floats: median of 9 after a warm-up, cached.
double device_copy_seconds(cuda_space const& space, std::size_t d) {
  static std::map<std::size_t, double> cache;
  if (auto hit = cache.find(d); hit != cache.end()) return hit->second;
  buffer<float, cuda_space> src(d, space), dst(d, space);
  space.fill_zero(src.data(), d * sizeof(float));
  event_timer timer(space.stream);
  auto copy = [&] { space.copy(dst.data(), src.data(), d * sizeof(float)); };
  copy();
  std::vector<double> samples;
  for (int rep = 0; rep < 9; ++rep) samples.push_back(timer(copy));
  return cache[d] = bench::median(samples);
}

bool skip_without_device(benchmark::State& state) {
  if (cuda_device_available()) return false;
  state.SkipWithError("no CUDA device");
  return true;
}

void copy(benchmark::State& state) {
  if (skip_without_device(state)) return;
  std::size_t const d = static_cast<std::size_t>(state.range(0));
  cuda_space const space{};
  double const copy_seconds = device_copy_seconds(space, d);
  buffer<float, cuda_space> src(d, space), dst(d, space);
  event_timer timer(space.stream);
  double const total = bench::timed_loop(state, timer, [&] { space.copy(dst.data(), src.data(), d * sizeof(float)); });
  bench::report(state, d, copy_seconds, 0, total);
}

// One allreducer step on a one-rank world: the compressor's local work.
template <class Compressor, class EF, nonfinite_policy Policy>
void step(benchmark::State& state, Compressor compressor, bucket_layout const& layout) {
  if (skip_without_device(state)) return;
  std::size_t const d = layout.size();
  cuda_space const space{};
  double const copy_seconds = device_copy_seconds(space, d);
  single_rank<cuda_space> world(space);
  allreducer<Compressor, EF, single_rank<cuda_space>> reduce(compressor, world, layout, space, {.nonfinite = Policy});
  std::vector<float> const g = bench::random_gradient(d, 42);
  buffer<float, cuda_space> gradient(d, space);
  space.from_host(gradient.data(), g.data(), d * sizeof(float));
  buffer<float, cuda_space> pristine(d, space);
  space.copy(pristine.data(), gradient.data(), d * sizeof(float));
  event_timer timer(space.stream);
  reduce(gradient.view());  // warm-up
  double const total = bench::timed_loop(
      state, timer, [&] { reduce(gradient.view()); },
      [&] { space.copy(gradient.data(), pristine.data(), d * sizeof(float)); });
  bench::report(state, d, copy_seconds,
                compressor.template wire_bytes<default_aggregator_t<Compressor>>(reduce.layout(), 4), total);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t d : {1 << 20, 1 << 24, 1 << 26}) b->Arg(d);
  b->Unit(benchmark::kMillisecond)->UseManualTime();
}

// Registers rows of this binary's step (see bench/common/rows.hpp).
struct registrar {
  template <class Compressor, class EF, nonfinite_policy Policy = nonfinite_policy::propagate>
  static void add(std::string const& name, Compressor compressor = {}) {
    benchmark::RegisterBenchmark(name.c_str(), [compressor](benchmark::State& state) {
      step<Compressor, EF, Policy>(state, compressor, bucket_layout(static_cast<std::size_t>(state.range(0))));
    })->Apply(sizes);
  }

  // A row over a shaped bucket (its size is the row's argument).
  template <class Compressor, class EF>
  static void add_layout(std::string const& name, bucket_layout const& layout, Compressor compressor = {}) {
    benchmark::RegisterBenchmark(name.c_str(),
                                 [compressor, layout](benchmark::State& state) {
                                   step<Compressor, EF, nonfinite_policy::propagate>(state, compressor, layout);
                                 })
        ->Arg(static_cast<std::int64_t>(layout.size()))
        ->Unit(benchmark::kMillisecond)
        ->UseManualTime();
  }
};

}  // namespace

int main(int argc, char** argv) {
  using namespace gradcomp;
  benchmark::RegisterBenchmark("cuda/copy", copy)->Apply(sizes);
  bench::register_compressor_rows<registrar>("cuda");
  // What nonfinite_policy::raise costs on the device beside propagate: the
  // verdict's copy at the end of a step, and the next call's look at it.
  registrar::add<bf16, error_feedback::residual, nonfinite_policy::raise>("cuda/bf16:ef=on+raise");
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
