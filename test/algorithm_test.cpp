// The algorithm layer on the host space.
#include "common/algorithm_suite.hpp"
#include "common/topk_suite.hpp"

TEST_CASE_TEMPLATE_INVOKE(transform_matches, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(transform_gate, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(reduce_matches, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(select_matches, gradcomp::host_space);
