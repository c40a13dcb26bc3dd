// Test bodies for the integer all-reduce quantizers (QSGD-MaxNorm, its
// multi-scale and GlobalRandK variants, IntSGD), instantiated per setup.
#pragma once

#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

namespace gradcomp::testing {

/// The workspace of a reducer as its compressor carves it.
template <class Reducer>
auto carved(Reducer const& reducer, int ranks) {
  using memory = typename std::remove_cvref_t<decltype(reducer.space())>::memory;
  workspace_carver<memory> carver(reducer.workspace());
  return reducer.compressor().template carve<allreduce_aggregator>(carver, reducer.layout(), ranks);
}

/// Calls f(compressor) for one of each quantizer, small enough for tests,
/// each a contraction on the tests' buckets (the suites run them with error
/// feedback, which the allreducer refuses otherwise).
template <class F>
void for_each_quantizer(F&& f) {
  f(qsgd<std::int32_t>{.bits = 8});
  f(qsgd_multiscale{});
  f(global_randk<>{.k = 200, .bits = 4});
  f(intsgd<>{});
  f(intsgd<std::int32_t>{.stochastic = false});
}

}  // namespace gradcomp::testing

// The stochastic quantizers are unbiased: the mean of many independent
// quantizations converges to the input, its error shrinking like
// 1 / sqrt(trials).
TEST_CASE_TEMPLATE_DEFINE("QSGD-MaxNorm and IntSGD round without bias", Space, quantize_unbiased) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    // Gaussian input (not random_gradient's heavy tails), so every coordinate
    // contributes a like share of the error and its root mean square is a
    // steady statistic.
    std::mt19937_64 rng(shared_seed(comm));
    std::normal_distribution<float> normal;
    std::vector<float> x(4096 + 100);
    for (auto& v : x) v = normal(rng);
    auto check = [&](auto const& c) {
      double const few = rms_distance(average_output(space, comm, c, x, 16), x);
      double const many = rms_distance(average_output(space, comm, c, x, 256), x);
      INFO(c.name << ": error " << few << " after 16 trials, " << many << " after 256");
      CHECK(many < 0.35 * few);  // 1 / sqrt(16) = 0.25, with room for noise
      CHECK(many > 0.15 * few);  // and not exact: it really is random
    };
    check(qsgd<>{.bits = 4});
    check(qsgd<std::int32_t>{.bits = 8});
    check(qsgd_multiscale{});
    check(intsgd<>{});
  });
}

// Homomorphism: the decoded sum equals the mean of what each rank decodes
// from its own codes (acc - e), up to float rounding, and every rank gets
// bitwise the same output.
TEST_CASE_TEMPLATE_DEFINE("integer quantizers sum homomorphically", Setup, quantize_homomorphic) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 3 * 4096 + 77;
    for_each_quantizer([&](auto c) {
      allreducer<decltype(c), error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space>
          reduce(c, comm, bucket_layout(d), space);
      for (int step = 0; step < 2; ++step) {
        auto const mine = random_gradient(seed + step, comm.rank(), d);
        auto const before = download(space, reduce.residual().data(), d);
        auto g = upload(space, mine);
        reduce(g.view());
        auto const out = download(space, g.data(), d);
        auto const residual = download(space, reduce.residual().data(), d);
        std::vector<float> own(d);  // what this rank itself sent, decoded
        for (std::size_t i = 0; i < d; ++i) own[i] = (mine[i] + before[i]) - residual[i];
        gap_to_mean const gap = gap_to_mean_of_own(comm, own, out);
        INFO(c.name << ", step " << step);
        CHECK(gap.scale > 0);
        CHECK(gap.worst < 1e-5 * gap.scale);
        CHECK(same_as_rank0(comm, out));
      }
    });
  });
}

// What the ranks must agree on, they agree on bit for bit: the multi-scale
// choice per coordinate, GlobalRandK's coordinates (distinct, new each
// step), IntSGD's running norm (and so alpha) after every step.
TEST_CASE_TEMPLATE_DEFINE("ranks agree on scales, coordinates and alpha", Setup, quantize_agreement) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    using S = typename Setup::space;
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 20000;
    int const n = comm.size();

    allreducer<qsgd_multiscale, error_feedback::residual, collective_t, allreduce_aggregator, S> multi(
        qsgd_multiscale{}, comm, bucket_layout(d), space);
    auto x = random_gradient(seed, comm.rank(), d);
    for (std::size_t i = 0; i < d; i += 1000) x[i] *= 300.0f;  // a few large coordinates need the coarse scale
    auto g = upload(space, x);
    multi(g.view());
    auto const index = download(space, carved(multi, n).index.data(), d);
    CHECK(same_as_rank0(comm, index));
    auto const coarse = std::count(index.begin(), index.end(), std::uint8_t{0});
    CHECK(coarse > 0);      // the large ones
    CHECK(coarse < d / 2);  // most coordinates get the fine scale

    allreducer<global_randk<>, error_feedback::none, collective_t, allreduce_aggregator, S> randk(
        global_randk<>{.k = 500}, comm, bucket_layout(d), space);
    std::vector<std::uint64_t> previous;
    for (int step = 0; step < 3; ++step) {
      auto h = upload(space, random_gradient(seed + step, comm.rank(), d));
      randk(h.view());
      auto const picked = download(space, carved(randk, n).indices.data(), 500);
      CHECK(same_as_rank0(comm, picked));
      std::set<std::uint64_t> const distinct(picked.begin(), picked.end());
      CHECK(distinct.size() == picked.size());
      CHECK(*distinct.rbegin() < d);
      CHECK(picked != previous);
      previous = picked;
    }

    allreducer<intsgd<>, error_feedback::residual, collective_t, allreduce_aggregator, S> integer(
        intsgd<>{}, comm, bucket_layout(d), space);
    for (int step = 0; step < 4; ++step) {
      auto h = upload(space, random_gradient(seed + 10 + step, comm.rank(), d));
      integer(h.view());
      auto const state = download(space, carved(integer, n).state.data(), 1);
      INFO("step " << step << ", r = " << state[0]);
      CHECK(std::isfinite(state[0]));
      CHECK(state[0] > 0.0f);
      CHECK(same_as_rank0(comm, state));
    }
  });
}

// Same seed, same inputs: the same bits. With error feedback the running sum
// of outputs stays a bounded distance from the running sum of inputs, for
// compressors whose error is smaller than the signal (error feedback needs
// that): QSGD-MaxNorm at 10 bits here, since at 4 bits on 4096 coordinates
// its variance, about sqrt(d) / s ||x||^2, exceeds ||x||^2 and error feedback
// diverges (it is unbiased: use it without).
TEST_CASE_TEMPLATE_DEFINE("integer quantizers are deterministic and stay on track", Space, quantize_feedback) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 4096;
    auto check = [&](auto c) {
      std::vector<double> drift, again;
      auto const first = run_with_feedback(space, comm, c, seed, d, 60, drift);
      auto const second = run_with_feedback(space, comm, c, seed, d, 60, again);
      INFO(c.name);
      CHECK(std::memcmp(first.data(), second.data(), d * sizeof(float)) == 0);
      double const early = *std::max_element(drift.begin(), drift.begin() + 20);
      double const late = *std::max_element(drift.end() - 10, drift.end());
      CHECK(late < 2.0 * early);  // it would grow like sqrt(steps) without error feedback
    };
    check(qsgd<std::int32_t>{.bits = 10});
    check(qsgd_multiscale{});
    check(global_randk<>{.k = 200, .bits = 4});
    check(intsgd<>{});
    check(intsgd<std::int32_t>{.stochastic = false});
  });
}

// Lanes that could overflow, k beyond the bucket, zero and non-finite input.
TEST_CASE_TEMPLATE_DEFINE("integer quantizers refuse bad configurations and inputs", Setup, quantize_bad_input) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    using S = typename Setup::space;
    auto const space = Setup::make_space();
    int const n = comm.size();
    bucket_layout const layout(1000);
    CHECK_THROWS_WITH_AS((qsgd<>{.bits = 5}.validate(layout, 8)),
                         doctest::Contains("8 ranks x codes up to +-31 (bits=5) sum beyond the int8 lane (max 127)"),
                         invalid_argument);
    CHECK_NOTHROW(qsgd<>{.bits = 4}.validate(layout, 8));  // 8 x 15 = 120 fits
    CHECK_NOTHROW(qsgd<std::int32_t>{.bits = 5}.validate(layout, 8));
    CHECK_THROWS_WITH_AS((qsgd<>{.bits = 8}.validate(layout, 1)), doctest::Contains("outside 1..7"), invalid_argument);
    CHECK_THROWS_WITH_AS((intsgd<>{}.validate(layout, 200)),
                         doctest::Contains("200 ranks leave no room in the int8 lane (8 bits)"), invalid_argument);
    CHECK_NOTHROW(intsgd<std::int32_t>{}.validate(layout, 200));
    CHECK_THROWS_WITH_AS((qsgd_multiscale{}.validate(layout, 200)), doctest::Contains("200 ranks"), invalid_argument);
    CHECK_THROWS_WITH_AS((qsgd_multiscale{.bits = {10, 6}}.validate(layout, 2)), doctest::Contains("ascend"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS((global_randk<>{.k = 1001}.validate(layout, 2)),
                         doctest::Contains("k=1001 is outside 1..the bucket's size, 1000 elements"), invalid_argument);
    if (n > 1) {  // the check at construction names this world's rank count
      using reducer = allreducer<qsgd<>, error_feedback::residual, collective_t, allreduce_aggregator, S>;
      std::string const expected = std::to_string(n) + " ranks x codes up to +-127 (bits=7)";
      CHECK_THROWS_WITH_AS(reducer(qsgd<>{.bits = 7}, comm, layout, space), doctest::Contains(expected.c_str()),
                           invalid_argument);
    }

    for_each_quantizer([&](auto c) {
      INFO(c.name);
      allreducer<decltype(c), error_feedback::residual, collective_t, allreduce_aggregator, S> reduce(c, comm, layout,
                                                                                                      space);
      auto zeros = upload(space, std::vector<float>(1000, 0.0f));
      reduce(zeros.view());
      auto const out = download(space, zeros.data(), 1000);
      CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }));  // not NaN

      auto const residual_before = download(space, reduce.residual().data(), 1000);
      auto bad = random_gradient(3, comm.rank(), 1000);
      if (comm.rank() == n - 1) bad[5] = std::numeric_limits<float>::quiet_NaN();
      auto b = upload(space, bad);
      CHECK_THROWS_AS(settled_step(reduce, b.view()), nonfinite_error);
      auto const residual_after = download(space, reduce.residual().data(), 1000);
      CHECK(std::memcmp(residual_before.data(), residual_after.data(), 1000 * sizeof(float)) == 0);
      auto clean = upload(space, random_gradient(4, comm.rank(), 1000));
      CHECK_NOTHROW(settled_step(reduce, clean.view()));
    });
  });
}
