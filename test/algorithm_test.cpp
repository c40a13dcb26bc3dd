// The algorithm layer on the host space.
#include "common/algorithm_suite.hpp"
#include "common/topk_suite.hpp"

TEST_CASE_TEMPLATE_INVOKE(transform_matches, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(transform_gate, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(reduce_matches, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(select_matches, gradcomp::host_space);

// A discarded output (error_feedback::none's next residual) must give each
// element of a host chunk a slot of its own: one shared sink is a store that
// every lane makes to one address, which kept the element loop of the
// no-feedback casts from vectorizing (bf16 without error feedback ran 4x
// slower than with it).
TEST_CASE("a discarded output gives each element of a host chunk its own slot") {
  using namespace gradcomp;
  float staging[1];
  auto cursor = detail::host_output(discard<float>{}, 0, staging);
  for (std::size_t k = 1; k < detail::host_chunk; k += 511) CHECK(&cursor[k] != &cursor[k - 1]);
  CHECK(&cursor[detail::host_chunk - 1] - &cursor[0] == static_cast<std::ptrdiff_t>(detail::host_chunk - 1));
}
