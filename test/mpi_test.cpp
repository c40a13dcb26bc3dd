// The pipeline and baseline suites over MPI: run as `mpiexec -n 4`.
#define DOCTEST_CONFIG_IMPLEMENT
#include <gradcomp/collectives/mpi.hpp>

#include <cstdio>
#include <cstring>

#include "common/model_reducer_suite.hpp"
#include "common/powersgd_suite.hpp"
#include "common/quantize_suite.hpp"
#include "common/topk_suite.hpp"

namespace {

// This process is one rank of MPI_COMM_WORLD.
struct mpi_world {
  template <class Body>
  void run(Body&& body) const {
    gradcomp::mpi_communicator comm(MPI_COMM_WORLD);
    body(comm);
  }
};

using host_mpi = gradcomp::testing::setup<gradcomp::host_space, mpi_world>;

}  // namespace

TEST_CASE("the MPI backend reduces every wire type across all ranks") {
  gradcomp::mpi_communicator comm;
  REQUIRE(comm.size() > 1);  // a one-rank run would test nothing
  int const n = comm.size();
  std::vector<gradcomp::bfloat16> b(10, gradcomp::bfloat16(static_cast<float>(comm.rank() + 1)));
  comm.all_reduce(b.data(), b.data(), b.size(), gradcomp::reduce_op::sum);
  CHECK(static_cast<float>(b[3]) == static_cast<float>(n * (n + 1) / 2));
  std::vector<gradcomp::half> h(10, gradcomp::half(static_cast<float>(comm.rank())));
  comm.all_reduce(h.data(), h.data(), h.size(), gradcomp::reduce_op::max);
  CHECK(static_cast<float>(h[9]) == static_cast<float>(n - 1));
  std::vector<std::int8_t> all(n);
  std::int8_t const mine = static_cast<std::int8_t>(comm.rank() * 3);
  comm.all_gather(&mine, all.data(), 1);
  for (int r = 0; r < n; ++r) CHECK(all[r] == r * 3);
}

TEST_CASE("hierarchical over MPI: nodes by override and by detection, bitwise the same on every rank") {
  using namespace gradcomp;
  mpi_communicator world;
  int const n = world.size();
  std::vector<float> block(100), mine(100 * n);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(world.rank() * 1000 + i);
  world.reduce_scatter(mine.data(), block.data(), 100, reduce_op::sum);
  for (std::size_t i = 0; i < 100; ++i)  // sum over ranks r of (1000 r + 100 rank + i)
    CHECK(block[i] == static_cast<float>(1000 * n * (n - 1) / 2 + n * (100 * world.rank() + i)));
  for (int per_node : {2, 0}) {  // 0: detected (every rank of this run shares one node)
    auto groups = split_nodes(world, per_node);
    CHECK(groups.nodes() * groups.ranks_per_node() == n);
    if (per_node == 0) CHECK(groups.nodes() == 1);
    hierarchical_allreducer<thc<>, error_feedback::residual, mpi_communicator, host_space> h(
        thc<>{.block = 256}, groups, bucket_layout(10007), host_space{});
    auto g = gradcomp::testing::random_gradient(5, world.rank(), 10007);
    h({g.data(), g.size()});
    std::vector<float> all(g.size() * n);
    world.all_gather(g.data(), all.data(), g.size());
    for (int r = 1; r < n; ++r) CHECK(std::memcmp(all.data() + r * g.size(), all.data(), g.size() * 4) == 0);
    // PowerSGD, by whole tensors, on 16-bit buckets: the same bits on every rank too.
    bucket_layout const matrices({{64, 48}, {48}, {30, 20}});
    hierarchical_allreducer<powersgd<>, error_feedback::residual, mpi_communicator, host_space, bfloat16> p(
        powersgd<>{.matrix_rank = 2}, groups, matrices, host_space{}, {.bf16_within_node = true});
    auto const drawn = gradcomp::testing::random_gradient(6, world.rank(), matrices.size());
    std::vector<bfloat16> b(drawn.size());
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = bfloat16(drawn[i]);
    p({b.data(), b.size()});
    std::vector<bfloat16> every(b.size() * n);
    world.all_gather(b.data(), every.data(), b.size());
    for (int r = 1; r < n; ++r)
      CHECK(std::memcmp(every.data() + r * b.size(), every.data(), b.size() * sizeof(bfloat16)) == 0);
  }
}

TEST_CASE("two-level reduce-scatter over MPI: each rank's shard is bitwise the hierarchical all-reduce's slice") {
  using namespace gradcomp;
  mpi_communicator world;
  REQUIRE(world.size() % 2 == 0);
  auto groups = split_nodes(world, 2);
  thc<> const c{.block = 256};  // integer lanes: a reduce-scatter's sums are its all-reduce's, bit for bit
  std::size_t const d = 256 * static_cast<std::size_t>(world.size()) * 3;  // the two cut the same parts
  hierarchical_options const options{.reduce = {.warmup_steps = 1}, .bf16_within_node = true};
  hierarchical_reduce_scatterer<thc<>, error_feedback::residual, mpi_communicator, host_space> rs(
      c, groups, bucket_layout(d), host_space{}, options);
  hierarchical_allreducer<thc<>, error_feedback::residual, mpi_communicator, host_space> ar(c, groups, bucket_layout(d),
                                                                                            host_space{}, options);
  for (int step = 0; step < 3; ++step) {
    auto g = gradcomp::testing::random_gradient(40 + step, world.rank(), d), reference = g;
    ar({reference.data(), d});
    std::vector<float> shard(rs.shard_size(), -1.0f);
    rs({g.data(), d}, {shard.data(), shard.size()});
    INFO("step " << step);
    CHECK(std::memcmp(shard.data(), reference.data() + rs.shard_offset(), shard.size() * sizeof(float)) == 0);
  }
  CHECK(rs.shard_offset() == rs.shard_offset(world.rank()));
}

TEST_CASE("over MPI, ranks agree in world order across two levels, and a disagreement names the rank everywhere") {
  using namespace gradcomp;
  mpi_communicator world;
  int const n = world.size(), rank = world.rank();
  REQUIRE(n % 2 == 0);
  auto groups = split_nodes(world, 2);
  agreement const all(groups.local, groups.cross, host_space{}, 10 + static_cast<std::uint64_t>(rank), 0,
                      rank == n - 1 ? "the last rank's reason" : "");
  REQUIRE(all.ranks() == n);
  CHECK(all.self() == rank);
  for (int r = 0; r < n; ++r) CHECK(all.of(r).a == 10 + static_cast<std::uint64_t>(r));
  CHECK(all.first_failed() == n - 1);
  CHECK(all.why(n - 1) == "the last rank's reason");
  using reducer = hierarchical_allreducer<thc<>, error_feedback::residual, mpi_communicator, host_space>;
  std::size_t const d = rank == 1 ? 4000 : 4096;
  CHECK_THROWS_WITH_AS(reducer(thc<>{.block = 256}, groups, bucket_layout(d), host_space{}),
                       doctest::Contains("rank 0 has 4096 elements, rank 1 has 4000"), invalid_argument);
  CHECK_NOTHROW(reducer(thc<>{.block = 256}, groups, bucket_layout(4096), host_space{}));  // nobody was left behind
}

TEST_CASE("reduce-scatter over MPI: each rank's shard is the all-reduce path's slice, at half the bytes") {
  using namespace gradcomp;
  mpi_communicator world;
  int const n = world.size();
  // Integer lanes sum exactly: bitwise. MPI may add bf16 values in another
  // order in a reduce-scatter than in an all-reduce: within a few roundings.
  auto check = [&](auto c, bool exact) {
    using C = decltype(c);
    // (No error feedback: each step's payload is then this step's gradient,
    // which bounds the rounding of a bf16 sum.)
    reduce_scatterer<C, error_feedback::none, mpi_communicator, host_space> rs(c, world, bucket_layout(10007),
                                                                               host_space{});
    allreducer<C, error_feedback::none, mpi_communicator, allreduce_aggregator, host_space> ar(
        c, world, rs.padded_layout(), host_space{});
    for (int step = 0; step < 3; ++step) {
      auto g = gradcomp::testing::random_gradient(7 + step, world.rank(), 10007);
      auto reference = g;
      reference.resize(rs.padded_layout().size(), 0.0f);
      ar({reference.data(), reference.size()});
      std::vector<float> shard(rs.shard_size(), -1.0f);
      rs({g.data(), g.size()}, {shard.data(), shard.size()});
      INFO(C::name << ", step " << step);
      float const* slice = reference.data() + rs.shard_offset();
      if (exact) {
        CHECK(std::memcmp(shard.data(), slice, shard.size() * sizeof(float)) == 0);
      } else {
        std::vector<double> magnitude(shard.size(), 0.0);
        for (int r = 0; r < n; ++r) {
          auto const theirs = gradcomp::testing::random_gradient(7 + step, r, 10007);
          for (std::size_t i = 0; i < shard.size(); ++i) magnitude[i] += std::abs(theirs[rs.shard_offset() + i]) / n;
        }
        for (std::size_t i = 0; i < shard.size(); ++i) CHECK(std::abs(shard[i] - slice[i]) <= 0x1.0p-6 * magnitude[i]);
      }
      CHECK(rs.wire_bytes() < ar.wire_bytes());
    }
  };
  check(bf16{}, false);
  check(thc<>{.block = 256}, true);
  check(qsgd<>{.bits = 4}, true);
}

TEST_CASE_TEMPLATE_INVOKE(fp32_mean, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(cast_accuracy, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(aggregators_agree, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(residual_invariant, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_raise, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_propagate, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(config_mismatch, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(lengths, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(wire_bytes, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(topkc_mean, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(topk_mean, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(sparse_bad_input, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(psgd_ranks, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(quantize_homomorphic, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(quantize_agreement, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(quantize_bad_input, host_mpi);
TEST_CASE_TEMPLATE_INVOKE(model_any_order, host_mpi);  // its progress thread calls MPI: THREAD_SERIALIZED

int main(int argc, char** argv) {
  int provided = 0;  // the model reducer's progress thread makes the calls while the main thread waits
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "this MPI does not provide MPI_THREAD_SERIALIZED\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("minimal", true);  // every rank checks; only rank 0 prints a summary
  int const failed = context.run();
  // Every rank must agree on the verdict, so one failing rank fails the run.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
