// THC on the CUDA space, and its parity with the host path.
#include <gradcomp/cuda.cuh>

#include "../common/thc_suite.hpp"

using cuda_local = gradcomp::testing::setup<gradcomp::cuda_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(thc_unbiased, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(thc_homomorphic, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(thc_feedback, gradcomp::cuda_space);
TEST_CASE_TEMPLATE_INVOKE(thc_bad_input, cuda_local);

// Same inputs and seeds: the device draws the same lane values as the host,
// so outputs and residuals agree bit for bit: every register kernel (blocks
// 256 to 4096, full and partial rotations, both quantizers, 8- and 32-bit
// lanes), the shared-memory kernel of small blocks, a bucket that ends
// inside a block, and a gradient that is not 16-byte aligned.
TEST_CASE("THC gives bitwise the host's result on the device") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::vector<std::vector<float>> host(4), device(4);
  local_group::run(4, [&](local_group::communicator& comm) {
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 3 * 4096 + 500;
    auto run = [&](auto const& space) {
      using S = std::remove_cvref_t<decltype(space)>;
      std::vector<float> all;
      auto one = [&](auto c, std::size_t offset) {
        allreducer<decltype(c), error_feedback::residual, local_group::communicator, allreduce_aggregator, S> reduce(
            c, comm, bucket_layout(d), space);
        auto g = random_gradient(seed, comm.rank(), d + offset);
        auto buffer = upload(space, g);
        for (int step = 0; step < 2; ++step) reduce(buffer.view().subspan(offset, d));
        auto const out = download(space, buffer.data() + offset, d);
        auto const res = download(space, reduce.residual().data(), d);
        all.insert(all.end(), out.begin(), out.end());
        all.insert(all.end(), res.begin(), res.end());
      };
      one(thc<>{.block = 4096}, 0);
      one(thc<>{.block = 2048, .stages = 9}, 1);
      one(thc<>{.block = 1024, .stages = 5}, 0);
      one(thc<>{.block = 1024, .quantizer = thc_quantizer::table}, 3);
      one(thc<>{.block = 512, .bits = 2}, 0);
      one(thc<>{.block = 256, .quantizer = thc_quantizer::table}, 0);
      one(thc<std::int32_t>{.block = 1024, .bits = 8}, 0);
      one(thc<std::int32_t>{.block = 4096, .bits = 8}, 2);
      one(thc<>{.block = 128}, 0);
      one(thc<>{.block = 16, .stages = 3}, 1);
      return all;
    };
    host[comm.rank()] = run(host_space{});
    device[comm.rank()] = run(cuda_space{});
  });
  for (int r = 0; r < 4; ++r) CHECK(std::memcmp(host[r].data(), device[r].data(), host[r].size() * 4) == 0);
}
