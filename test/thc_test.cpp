// THC on the host space, and its rotation.
#include "common/thc_suite.hpp"

#include <bit>

using host_local = gradcomp::testing::setup<gradcomp::host_space, gradcomp::testing::local_world>;

TEST_CASE_TEMPLATE_INVOKE(thc_unbiased, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(thc_homomorphic, host_local);
TEST_CASE_TEMPLATE_INVOKE(thc_feedback, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(thc_bad_input, host_local);

// Any number of butterfly stages, scaled by thc_rotation_scale, is
// orthonormal: it keeps the norm, and the same stages again undo it. The host
// loops (two stages per pass) give the bits of the device's pair-by-pair
// butterflies.
TEST_CASE("partial and full Walsh-Hadamard rotations keep norms and invert") {
  using namespace gradcomp::detail;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (std::size_t block : {2u, 4u, 8u, 16u, 256u, 1024u, 4096u}) {
    int const log2 = std::countr_zero(block);
    for (int stages : {1, 2, 3, (log2 + 1) / 2, log2}) {
      if (stages > log2) continue;
      INFO("block " << block << ", stages " << stages);
      std::vector<float> x(block), y, pairwise;
      for (auto& v : x) v = normal(rng);
      y = x;
      host_rotate(y.data(), block, stages);
      pairwise = x;
      for (int s = 0; s < stages; ++s)
        for (std::size_t q = 0; q < block / 2; ++q) thc_butterfly(pairwise.data(), q, s);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < block; ++i)
        differ += std::bit_cast<std::uint32_t>(y[i]) != std::bit_cast<std::uint32_t>(pairwise[i]);
      CHECK(differ == 0);

      float const scale = thc_rotation_scale(stages);
      for (auto& v : y) v *= scale;
      double nx = 0, ny = 0, moved = 0;
      for (std::size_t i = 0; i < block; ++i)
        nx += double(x[i]) * x[i], ny += double(y[i]) * y[i], moved += std::fabs(y[i] - x[i]);
      CHECK(std::fabs(std::sqrt(ny) - std::sqrt(nx)) <= 1e-6 * std::sqrt(nx));
      CHECK(moved > 0);
      host_rotate(y.data(), block, stages);
      for (auto& v : y) v *= scale;
      double worst = 0;
      for (std::size_t i = 0; i < block; ++i) worst = std::max(worst, double(std::fabs(y[i] - x[i])));
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

// Saturated coordinates (at and far beyond +-T) must still land in the lane
// range 0..top: an out-of-range value would decode to garbage after the sum.
TEST_CASE("THC's codec keeps saturated coordinates inside the lane range") {
  for (bool table : {false, true}) {
    for (float top : {3.0f, 15.0f, 30.0f}) {
      if (table && top != 30.0f) continue;
      for (float clamp : {2.15387f, 1.8627f, 8.0f}) {
        gradcomp::detail::thc_codec const codec{clamp, top, table};
        for (float z :
             {-1e30f, -clamp * 1.0000001f, -clamp, -clamp * 0.9999999f, 0.0f, clamp, clamp * 1.0000001f, 1e30f}) {
          for (float u : {0.0f, 0.5f, 0.99999994f}) {
            std::uint32_t const v = codec.encode(z, u, u);
            CHECK(v <= static_cast<std::uint32_t>(top));
            CHECK(std::fabs(codec.decode(static_cast<float>(v))) <= clamp * 1.000001f);
          }
        }
      }
    }
  }
}
