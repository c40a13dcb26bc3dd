// Quickstart: four simulated ranks average their gradients through a
// compressor on the host, and we measure how far the result is from the
// exact mean and how many bytes went on the wire.
//
//   quickstart [fp32|fp16|bf16] [elements]
#include <gradcomp/gradcomp.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

// Every rank's gradient, reproducible from the rank.
std::vector<float> gradient_of(int rank, std::size_t d) {
  std::mt19937 rng(1234 + rank);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> g(d);
  for (auto& x : g) x = normal(rng);
  return g;
}

template <class Compressor>
int run(std::size_t d, int ranks) {
  // The exact mean, in double, to measure against.
  std::vector<double> exact(d, 0.0);
  for (int r = 0; r < ranks; ++r) {
    auto const g = gradient_of(r, d);
    for (std::size_t i = 0; i < d; ++i) exact[i] += g[i] / ranks;
  }

  double max_error = 0, sum_error = 0, norm = 0;
  std::size_t wire = 0;
  gradcomp::local_group::run(ranks, [&](gradcomp::local_group::communicator& comm) {
    // One allreducer per bucket; it owns the residual and the workspace.
    gradcomp::allreducer<Compressor, gradcomp::error_feedback::residual, gradcomp::local_group::communicator> reduce(
        Compressor{}, comm, gradcomp::bucket_layout(d));

    std::vector<float> gradient = gradient_of(comm.rank(), d);
    reduce({gradient.data(), gradient.size()});  // in place: now the rank mean

    if (comm.rank() == 0) {
      for (std::size_t i = 0; i < d; ++i) {
        double const e = std::fabs(gradient[i] - exact[i]);
        max_error = std::fmax(max_error, e);
        sum_error += e * e;
        norm += exact[i] * exact[i];
      }
      wire = reduce.wire_bytes();
    }
  });
  std::printf(
      "%-5s %d ranks, %zu elements: relative L2 error %.3g, max abs error %.3g, %zu wire bytes/step "
      "(%.2f per element)\n",
      std::string(Compressor::name).c_str(), ranks, d, std::sqrt(sum_error / norm), max_error, wire,
      static_cast<double>(wire) / static_cast<double>(d));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string const which = argc > 1 ? argv[1] : "all";
  std::size_t const d = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1 << 20;
  int const ranks = 4;
  try {
    if (which == "fp32" || which == "all") run<gradcomp::fp32>(d, ranks);
    if (which == "fp16" || which == "all") run<gradcomp::fp16>(d, ranks);
    if (which == "bf16" || which == "all") run<gradcomp::bf16>(d, ranks);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 1;
  }
  return 0;
}
