// PowerSGD on the host space: the suite, and its refusals.
#include "common/powersgd_suite.hpp"

using host_local = gradcomp::testing::setup<gradcomp::host_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(psgd_exact, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(psgd_converges, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(psgd_ranks, host_local);
TEST_CASE_TEMPLATE_INVOKE(psgd_residual, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(psgd_edges, gradcomp::host_space);

TEST_CASE("PowerSGD refuses non-finite gradients, bad parameters and layouts that differ across ranks") {
  using namespace gradcomp;
  using reducer = allreducer<powersgd<>, error_feedback::residual, local_group::communicator>;
  local_group::run(4, [](local_group::communicator& comm) {
    bucket_layout layout{{20, 30}};
    reducer reduce(powersgd<>{.matrix_rank = 2}, comm, layout);
    auto g = testing::random_gradient(3, comm.rank(), 600);
    auto const before = g;
    if (comm.rank() == 2) g[17] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_AS(reduce({g.data(), g.size()}), nonfinite_error);
    CHECK(std::memcmp(g.data() + 18, before.data() + 18, 500 * 4) == 0);  // the input is untouched

    CHECK_THROWS_WITH_AS(reducer(powersgd<>{.matrix_rank = 0}, comm, layout),
                         doctest::Contains("matrix_rank=0 must be 1 or more"), invalid_argument);
    bucket_layout mine{{20, 30}};
    if (comm.rank() == 3) mine = bucket_layout{{30, 20}};  // same size, other shape
    CHECK_THROWS_WITH_AS(reducer(powersgd<>{}, comm, mine), doctest::Contains("configuration differs"),
                         invalid_argument);
  });
}
