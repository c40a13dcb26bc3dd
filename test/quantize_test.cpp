// The integer all-reduce quantizers on the host space.
#include "common/quantize_suite.hpp"

using host_local = gradcomp::testing::setup<gradcomp::host_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(quantize_unbiased, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(quantize_homomorphic, host_local);
TEST_CASE_TEMPLATE_INVOKE(quantize_agreement, host_local);
TEST_CASE_TEMPLATE_INVOKE(quantize_feedback, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(quantize_bad_input, host_local);

// The random permutation is a bijection: every coordinate exactly once.
TEST_CASE("GlobalRandK's coordinate permutation is a bijection for any size") {
  for (std::uint64_t n : {1u, 2u, 3u, 17u, 1000u, 4096u, 4097u}) {
    auto const p =
        gradcomp::random_permutation::make(n, gradcomp::random_stream(n, 3, gradcomp::random_stream::shared));
    std::vector<int> seen(n, 0);
    for (std::uint64_t k = 0; k < n; ++k) ++seen[p(k)];
    INFO("n = " << n);
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));
  }
}
