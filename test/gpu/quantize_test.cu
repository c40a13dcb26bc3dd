// The integer all-reduce quantizers on the CUDA space, and their parity with
// the host path.
#include <gradcomp/cuda.cuh>

#include "../common/quantize_suite.hpp"

using cuda_local = gradcomp::testing::setup<gradcomp::cuda_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(quantize_unbiased, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(quantize_homomorphic, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(quantize_agreement, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(quantize_feedback, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(quantize_bad_input, cuda_local);

// Same inputs and seeds: the device sends the host's integer codes, so the
// codes, outputs and residuals agree bit for bit, over several steps.
TEST_CASE("integer quantizers give bitwise the host's codes on the device") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::vector<std::vector<float>> host(4), device(4);
  local_group::run(4, [&](local_group::communicator& comm) {
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 3 * 4096 + 500;
    auto run = [&](auto const& space) {
      using S = std::remove_cvref_t<decltype(space)>;
      std::vector<float> all;
      for_each_quantizer([&](auto c) {
        allreducer<decltype(c), error_feedback::residual, local_group::communicator, allreduce_aggregator, S> reduce(
            c, comm, bucket_layout(d), space);
        for (int step = 0; step < 3; ++step) {
          auto g = upload(space, random_gradient(seed + step, comm.rank(), d));
          reduce(g.view());
          auto const out = download(space, g.data(), d);
          auto const res = download(space, reduce.residual().data(), d);
          auto const ws = carved(reduce, comm.size());
          auto const codes = download(space, ws.codes.data(), ws.codes.size());
          all.insert(all.end(), out.begin(), out.end());
          all.insert(all.end(), res.begin(), res.end());
          for (auto code : codes) all.push_back(static_cast<float>(code));
        }
      });
      return all;
    };
    host[comm.rank()] = run(host_space{});
    device[comm.rank()] = run(cuda_space{});
  });
  for (int r = 0; r < 4; ++r) {
    REQUIRE(host[r].size() == device[r].size());
    CHECK(std::memcmp(host[r].data(), device[r].data(), host[r].size() * 4) == 0);
  }
}
