// PowerSGD on the CUDA space, and its parity with the host path.
#include <gradcomp/compressors/powersgd/powersgd.cuh>
#include <gradcomp/cuda.cuh>

#include "../common/powersgd_suite.hpp"

using cuda_local = gradcomp::testing::setup<gradcomp::cuda_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(psgd_exact, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(psgd_converges, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(psgd_ranks, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(psgd_residual, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(psgd_edges, gradcomp::cuda_space);

// Same inputs, same seed: the device output is within float tolerance of
// the host's (the products and reductions sum in different orders).
TEST_CASE("PowerSGD on the device matches the host path") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::vector<std::vector<float>> host(4), device(4);
  local_group::run(4, [&](local_group::communicator& comm) {
    bucket_layout layout;
    layout.add({256, 300}).add({300}).add({300, 256});
    std::uint64_t const seed = shared_seed(comm);
    auto run = [&](auto const& space) {
      using S = std::remove_cvref_t<decltype(space)>;
      allreducer<powersgd<>, error_feedback::residual, local_group::communicator, allreduce_aggregator, S> reduce(
          powersgd<>{.matrix_rank = 4}, comm, layout, space);
      std::vector<float> out;
      for (int step = 0; step < 3; ++step) {
        auto g = upload(space, random_gradient(seed + step, comm.rank(), layout.size()));
        reduce(g.view());
        out = download(space, g.data(), layout.size());
      }
      return out;
    };
    host[comm.rank()] = run(host_space{});
    device[comm.rank()] = run(cuda_space{});
  });
  for (int r = 0; r < 4; ++r) CHECK(relative_error(device[r], widen(host[r])) < 1e-4);
}
