// Test bodies for THC, instantiated per setup.
#pragma once

#include "harness.hpp"

#include <cmath>
#include <limits>

// With the clamp out of reach (T = 8), stochastic rounding is unbiased: the
// mean of many independent quantizations converges to the input, its error
// shrinking like 1 / sqrt(trials). For the uniform and the table quantizer.
TEST_CASE_TEMPLATE_DEFINE("THC quantization is unbiased", Space, thc_unbiased) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    auto const x = random_gradient(shared_seed(comm), 0, 4096 + 100);
    for (auto quantizer : {thc_quantizer::uniform, thc_quantizer::table}) {
      thc<> const c{.block = 256, .quantizer = quantizer, .bits = 3, .clamp = 8.0f};
      double const few = rms_distance(average_output(space, comm, c, x, 16), x);
      double const many = rms_distance(average_output(space, comm, c, x, 256), x);
      INFO("quantizer " << static_cast<int>(quantizer) << ": error " << few << " after 16, " << many << " after 256");
      CHECK(many < 0.35 * few);  // 1 / sqrt(16) = 0.25, with room for noise
      CHECK(many > 0.15 * few);  // and not exact: it really is random
    }
  });
}

// Homomorphism: the decoded mean of the summed lane values equals the mean
// of what each rank decodes from its own values (acc - e), up to float
// rounding; every rank gets bitwise the same output; the ranks' rounding
// noise differs (same input, different residuals) while the signs agree.
TEST_CASE_TEMPLATE_DEFINE("THC sums lane values homomorphically", Setup, thc_homomorphic) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 3 * 1024 + 77;
    for (auto c : {thc<>{.block = 1024}, thc<>{.block = 512, .stages = 4, .group = 2048},
                   thc<>{.block = 256, .quantizer = thc_quantizer::table}}) {
      allreducer<thc<>, error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space> reduce(
          c, comm, bucket_layout(d), space);
      auto const mine = random_gradient(seed, comm.rank(), d);
      auto g = upload(space, mine);
      reduce(g.view());
      auto const out = download(space, g.data(), d);
      auto const residual = download(space, reduce.residual().data(), d);
      std::vector<float> own(d);  // what this rank itself sent, decoded
      for (std::size_t i = 0; i < d; ++i) own[i] = (mine[i] + 0.0f) - residual[i];
      gap_to_mean const gap = gap_to_mean_of_own(comm, own, out);
      CHECK(gap.worst < 1e-5 * gap.scale);
      CHECK(same_as_rank0(comm, out));
    }

    // Same input on every rank: shared signs, own noise.
    allreducer<thc<>, error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space> reduce(
        thc<>{.block = 256}, comm, bucket_layout(d), space);
    auto g = upload(space, random_gradient(seed, 0, d));
    reduce(g.view());
    std::vector<float> residual = download(space, reduce.residual().data(), d);
    bool const same = same_as_rank0(comm, residual);  // every rank takes part in the broadcast
    if (comm.rank() != 0) CHECK_FALSE(same);
  });
}

// Same seed, same inputs: the same bits. With error feedback the running sum
// of outputs stays within a bounded distance of the running sum of inputs.
TEST_CASE_TEMPLATE_DEFINE("THC is deterministic, and error feedback keeps it on track", Space, thc_feedback) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 2048;
    thc<> const c{.block = 256, .bits = 2};
    std::vector<double> drift, again;
    auto const first = run_with_feedback(space, comm, c, seed, d, 60, drift);
    auto const second = run_with_feedback(space, comm, c, seed, d, 60, again);
    CHECK(std::memcmp(first.data(), second.data(), d * sizeof(float)) == 0);
    // Bounded: the drift late in the run is no larger than early on (it would
    // grow like sqrt(steps) or worse without error feedback).
    double const early = *std::max_element(drift.begin(), drift.begin() + 10);
    double const late = *std::max_element(drift.end() - 10, drift.end());
    CHECK(late < 2.0 * early);
  });
}

// Bad parameters, lanes that could overflow, zero and non-finite input.
TEST_CASE_TEMPLATE_DEFINE("THC refuses bad configurations and inputs", Setup, thc_bad_input) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    auto const space = Setup::make_space();
    auto make8 = [&](thc<std::uint8_t> c) {
      allreducer<thc<std::uint8_t>, error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space>
          r(c, comm, bucket_layout(5000), space);
    };
    CHECK_THROWS_WITH_AS(make8({.block = 1000}), doctest::Contains("not a power of two"), invalid_argument);
    CHECK_THROWS_WITH_AS(make8({.block = 256, .stages = 9}), doctest::Contains("stages=9 is outside 0..8"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(make8({.block = 256, .group = 300}), doctest::Contains("multiple of the block"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(make8({.bits = 8}), doctest::Contains("beyond the uint8 lane (max 255)"), invalid_argument);
    if (comm.size() > 1) {
      std::string const expected = std::to_string(comm.size()) + " ranks x levels 0..255";
      CHECK_THROWS_WITH_AS(make8({.bits = 8}), doctest::Contains(expected.c_str()), invalid_argument);
      allreducer<thc<std::int32_t>, error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space>
          wide(thc<std::int32_t>{.bits = 8}, comm, bucket_layout(5000), space);  // a wider lane holds the sum
    }

    allreducer<thc<>, error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space> reduce(
        thc<>{.block = 256}, comm, bucket_layout(1000), space);
    auto zeros = upload(space, std::vector<float>(1000, 0.0f));
    reduce(zeros.view());
    auto const out = download(space, zeros.data(), 1000);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));  // not NaN

    auto bad = random_gradient(3, comm.rank(), 1000);
    if (comm.rank() == 0) bad[5] = std::numeric_limits<float>::quiet_NaN();
    auto b = upload(space, bad);
    CHECK_THROWS_AS(settled_step(reduce, b.view()), nonfinite_error);
  });
}
