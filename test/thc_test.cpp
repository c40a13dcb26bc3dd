// THC on the host space, and its rotation.
#include "common/thc_suite.hpp"

using host_local = gradcomp::testing::setup<gradcomp::host_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(thc_unbiased, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(thc_homomorphic, host_local);
TEST_CASE_TEMPLATE_INVOKE(thc_feedback, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(thc_bad_input, host_local);

// Any number of butterfly stages is orthonormal: it keeps the norm, and the
// same stages again undo it.
TEST_CASE("partial and full Walsh-Hadamard rotations keep norms and invert") {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (std::size_t block : {2u, 16u, 256u, 1024u, 4096u}) {
    int const log2 = std::countr_zero(block);
    for (int stages : {1, (log2 + 1) / 2, log2}) {
      std::vector<float> x(block), y;
      for (auto& v : x) v = normal(rng);
      y = x;
      for (int s = 0; s < stages; ++s)
        for (std::size_t q = 0; q < block / 2; ++q) gradcomp::detail::thc_butterfly(y.data(), q, s);
      double nx = 0, ny = 0, moved = 0;
      for (std::size_t i = 0; i < block; ++i)
        nx += double(x[i]) * x[i], ny += double(y[i]) * y[i], moved += std::fabs(y[i] - x[i]);
      CHECK(std::fabs(std::sqrt(ny) - std::sqrt(nx)) <= 1e-6 * std::sqrt(nx));
      CHECK(moved > 0);
      for (int s = 0; s < stages; ++s)
        for (std::size_t q = 0; q < block / 2; ++q) gradcomp::detail::thc_butterfly(y.data(), q, s);
      double worst = 0;
      for (std::size_t i = 0; i < block; ++i) worst = std::max(worst, double(std::fabs(y[i] - x[i])));
      INFO("block " << block << ", stages " << stages);
      CHECK(worst <= 1e-6 * std::sqrt(nx));
    }
  }
}

TEST_CASE("THC's clamp comes from the overflow frequency as published") {
  CHECK(gradcomp::detail::thc_clamp_for(32) == doctest::Approx(2.15387).epsilon(1e-5));
  CHECK(gradcomp::detail::thc_clamp_for(16) == doctest::Approx(1.8627).epsilon(1e-4));
  CHECK(gradcomp::detail::thc_clamp_for(64) == doctest::Approx(2.4176).epsilon(1e-4));
  CHECK(gradcomp::detail::thc_clamp_for(1024) == doctest::Approx(3.2972).epsilon(1e-4));
}
