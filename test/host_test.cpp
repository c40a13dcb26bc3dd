// The pipeline and baseline suites on the host space, four in-process ranks.
#include "common/topk_suite.hpp"

using host_local = gradcomp::testing::setup<gradcomp::host_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(fp32_mean, host_local);
TEST_CASE_TEMPLATE_INVOKE(cast_accuracy, host_local);
TEST_CASE_TEMPLATE_INVOKE(aggregators_agree, host_local);
TEST_CASE_TEMPLATE_INVOKE(residual_invariant, host_local);
TEST_CASE_TEMPLATE_INVOKE(residual_conserves, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_raise, host_local);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_propagate, host_local);
TEST_CASE_TEMPLATE_INVOKE(config_mismatch, host_local);
TEST_CASE_TEMPLATE_INVOKE(lengths, host_local);
TEST_CASE_TEMPLATE_INVOKE(wire_bytes, host_local);

TEST_CASE_TEMPLATE_INVOKE(topkc_mean, host_local);
TEST_CASE_TEMPLATE_INVOKE(topk_mean, host_local);
TEST_CASE_TEMPLATE_INVOKE(sparse_conserves, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(sparse_bad_input, host_local);
