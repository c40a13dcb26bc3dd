// Test bodies for the baseline compressors and the allreducer pipeline,
// written once and instantiated per setup (execution space x world of ranks)
// by each test executable with TEST_CASE_TEMPLATE_INVOKE.
#pragma once

#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace gradcomp::testing {

/// Runs `steps` steps of an allreducer on this rank and returns its outputs.
template <class Compressor, class EF, class Aggregator = default_aggregator_t<Compressor>, class Space,
          class Collective>
std::vector<std::vector<float>> reduce_steps(Collective& comm, Space const& space,
                                             std::vector<std::vector<float>> const& steps,
                                             allreducer_options options = {}) {
  allreducer<Compressor, EF, Collective, Aggregator, Space> reducer(
      Compressor{}, comm, bucket_layout(steps.front().size()), space, options);
  std::vector<std::vector<float>> outputs;
  for (auto const& g : steps) {
    auto device = upload(space, g);
    reducer(device.view());
    outputs.push_back(download(space, device.data(), device.size()));
  }
  return outputs;
}

/// The (Σ|g_r| / n) scale that 16-bit rounding errors are relative to.
inline double mean_magnitude(std::vector<std::vector<float>> const& grads, std::size_t i) {
  double m = 0;
  for (auto const& g : grads) m += std::fabs(static_cast<double>(g[i]));
  return m / static_cast<double>(grads.size());
}

template <class Setup>
int world_size() {
  int n = 0;
  typename Setup::world{}.run([&](auto& comm) {
    if (comm.rank() == 0) n = comm.size();
  });
  return n;
}

}  // namespace gradcomp::testing

// fp32 pre-scales by 1/n and sums in rank order on the in-process backend, so
// its result must equal the float sum of g_r x fl(1/n), bit for bit; over MPI
// the order is the library's, so it must match the float64 mean to rounding.
TEST_CASE_TEMPLATE_DEFINE("fp32 baseline returns the rank mean on every rank", Setup, fp32_mean) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    for (std::size_t d : {std::size_t{1}, std::size_t{1000}, std::size_t{70001}}) {
      auto const grads = random_gradients(seed + d, comm.size(), d);
      auto const out = reduce_steps<fp32, error_feedback::none>(comm, space, {grads[comm.rank()]}).front();
      std::size_t mismatches = 0;
      float const inverse = 1.0f / static_cast<float>(comm.size());
      for (std::size_t i = 0; i < d; ++i) {
        float in_order = grads[0][i] * inverse;
        double exact = grads[0][i];
        for (int r = 1; r < comm.size(); ++r) in_order += grads[r][i] * inverse, exact += grads[r][i];
        exact /= comm.size();
        bool const ok = std::is_same_v<typename Setup::world, local_world>
                            ? same_bits(out[i], in_order)
                            : std::fabs(out[i] - exact) <= 1e-6 * mean_magnitude(grads, i) * comm.size();
        mismatches += ok ? 0 : 1;
      }
      INFO("seed " << seed << ", d " << d << ", rank " << comm.rank());
      CHECK(mismatches == 0);
    }
  });
}

// Each rank's term rounds once to 16 bits (relative u = 2^-8 for bf16,
// 2^-11 for fp16, plus fp16's subnormal spacing 2^-24 absolute), and the sum
// rounds once more: |out - mean| <= 2u * Σ|g_r|/n + n * 2^-24 (fp16). Over
// MPI the 16-bit operator rounds once per pair: n rounding steps.
TEST_CASE_TEMPLATE_DEFINE("bf16 and fp16 baselines stay within their rounding bound", Setup, cast_accuracy) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 50000;
    auto const grads = random_gradients(seed, comm.size(), d);
    int const n = comm.size();
    int const rounding_steps = std::is_same_v<typename Setup::world, local_world> ? 2 : n + 1;
    auto check = [&](std::vector<float> const& out, double unit, double floor, std::string const& name) {
      std::size_t violations = 0, inexact = 0;
      for (std::size_t i = 0; i < d; ++i) {
        double exact = 0;
        for (auto const& g : grads) exact += g[i];
        exact /= n;
        double const error = std::fabs(out[i] - exact);
        violations += error <= rounding_steps * unit * mean_magnitude(grads, i) + n * floor ? 0 : 1;
        inexact += error > 0 ? 1 : 0;
      }
      INFO(name << ", seed " << seed << ", rank " << comm.rank());
      CHECK(violations == 0);
      CHECK(inexact > 0);  // the test really exercises rounding
    };
    check(reduce_steps<bf16, error_feedback::none>(comm, space, {grads[comm.rank()]}).front(), 0x1.0p-8, 0, "bf16");
    check(reduce_steps<fp16, error_feedback::none>(comm, space, {grads[comm.rank()]}).front(), 0x1.0p-11, 0x1.0p-24,
          "fp16");
  });
}

// The all-gather aggregator must give what the all-reduce gives; on the
// in-process backend both accumulate in float in rank order: bitwise equal.
TEST_CASE_TEMPLATE_DEFINE("all-gather and all-reduce aggregation agree", Setup, aggregators_agree) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    auto const grads = random_gradients(seed, comm.size(), 4099);
    std::vector<std::vector<float>> const mine{grads[comm.rank()]};
    auto compare = [&](auto const& a, auto const& b, double tolerance) {
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        mismatches +=
            (tolerance == 0 ? same_bits(a[i], b[i]) : std::fabs(a[i] - b[i]) <= tolerance * mean_magnitude(grads, i))
                ? 0
                : 1;
      return mismatches;
    };
    bool const local = std::is_same_v<typename Setup::world, local_world>;
    INFO("seed " << seed);
    CHECK(compare(reduce_steps<fp32, error_feedback::none, allgather_aggregator>(comm, space, mine).front(),
                  reduce_steps<fp32, error_feedback::none>(comm, space, mine).front(), local ? 0 : 1e-6) == 0);
    CHECK(compare(reduce_steps<bf16, error_feedback::residual, allgather_aggregator>(comm, space, mine).front(),
                  reduce_steps<bf16, error_feedback::residual>(comm, space, mine).front(),
                  local ? 0 : comm.size() * 0x1.0p-7) == 0);
  });
}

// With residual error feedback, what a rank sends plus what it keeps equals
// what it had: n * W(acc / n) + e_next == acc, where acc = g + e_prev. The
// test reads e through residual() and checks that acc - e_next is a value the
// rank could have sent, and that the residual is within half a 16-bit ulp.
TEST_CASE_TEMPLATE_DEFINE("residual error feedback keeps exactly what was not sent", Setup, residual_invariant) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 3000;
    float const n = static_cast<float>(comm.size());
    allreducer<bf16, error_feedback::residual, std::remove_cvref_t<decltype(comm)>, allreduce_aggregator,
               typename Setup::space>
        reducer(bf16{}, comm, bucket_layout(d), space);
    std::vector<float> residual(d, 0.0f);
    std::size_t violations = 0;
    for (int step = 0; step < 20; ++step) {
      auto const g = random_gradient(seed + step, comm.rank(), d);
      auto device = upload(space, g);
      reducer(device.view());
      auto const next = download(space, reducer.residual().data(), d);
      for (std::size_t i = 0; i < d; ++i) {
        float const acc = g[i] + residual[i];
        float const sent = acc - next[i];
        bool const representable = static_cast<float>(bfloat16(sent / n)) * n == sent;
        bool const small = std::fabs(next[i]) <= 0x1.0p-8f * std::fabs(acc);
        violations += representable && small ? 0 : 1;
      }
      residual = next;
    }
    INFO("seed " << seed << ", rank " << comm.rank());
    CHECK(violations == 0);
  });
}

// One rank: the output is exactly what the rank sent, so over any number of
// steps output_t + e_{t+1} == g_t + e_t, bit for bit: nothing is lost.
TEST_CASE_TEMPLATE_DEFINE("error feedback conserves every step's mass", Space, residual_conserves) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 2048;
    auto check = [&](auto compressor, std::string const& name) {
      allreducer<decltype(compressor), error_feedback::residual, local_group::communicator, allreduce_aggregator, Space>
          reducer(compressor, comm, bucket_layout(d), space);
      std::vector<float> residual(d, 0.0f);
      std::size_t violations = 0;
      for (int step = 0; step < 50; ++step) {
        auto const g = random_gradient(seed + step, 0, d);
        auto device = upload(space, g);
        reducer(device.view());
        auto const out = download(space, device.data(), d);
        auto const next = download(space, reducer.residual().data(), d);
        for (std::size_t i = 0; i < d; ++i) violations += out[i] + next[i] == g[i] + residual[i] ? 0 : 1;
        residual = next;
      }
      INFO(name << ", seed " << seed);
      CHECK(violations == 0);
    };
    check(bf16{}, "bf16");
    check(fp16{}, "fp16");
    check(fp32{}, "fp32");
  });
}

// A NaN on one rank, or a value past fp16's range, makes every rank throw
// from the same step (on the CUDA space: at the next call or synchronize()),
// with its gradient and residual untouched; the next, clean step then works.
TEST_CASE_TEMPLATE_DEFINE("non-finite gradients raise on every rank and change nothing", Setup, nonfinite_raise) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 1000;
    int const culprit = comm.size() - 1;
    auto scenario = [&](auto compressor, float poison, char const* expected) {
      allreducer<decltype(compressor), error_feedback::residual, std::remove_cvref_t<decltype(comm)>,
                 allreduce_aggregator, typename Setup::space>
          reducer(compressor, comm, bucket_layout(d), space);
      auto device = upload(space, random_gradient(seed, comm.rank(), d));
      reducer(device.view());  // a clean step leaves a non-zero residual
      auto const residual_before = download(space, reducer.residual().data(), d);

      auto g = random_gradient(seed + 1, comm.rank(), d);
      if (comm.rank() == culprit) g[d / 2] = poison;
      auto poisoned = upload(space, g);
      CHECK_THROWS_WITH_AS(settled_step(reducer, poisoned.view()), doctest::Contains(expected), nonfinite_error);
      auto const g_after = download(space, poisoned.data(), d);
      auto const residual_after = download(space, reducer.residual().data(), d);
      std::size_t changed = 0;
      for (std::size_t i = 0; i < d; ++i)
        changed += (same_bits(g_after[i], g[i]) && same_bits(residual_after[i], residual_before[i])) ? 0 : 1;
      INFO(std::string(compressor.name) << ", rank " << comm.rank());
      CHECK(changed == 0);
      CHECK(reducer.steps() == 1);

      auto clean = upload(space, random_gradient(seed + 2, comm.rank(), d));
      CHECK_NOTHROW(settled_step(reducer, clean.view()));
      CHECK(reducer.steps() == 2);
    };
    scenario(fp32{}, std::numeric_limits<float>::quiet_NaN(), "fp32 lane");
    scenario(bf16{}, std::numeric_limits<float>::infinity(), "bf16 lane");
    scenario(fp16{}, 1.0e5f, "fp16 lane");
  });
}

// Under nonfinite_policy::propagate nothing throws: a NaN on one rank makes
// every rank's output for the bucket NaN (so a loss scaler sees it and skips
// the step), the step commits nothing (the residual is bitwise as it was), and
// the next clean step works.
TEST_CASE_TEMPLATE_DEFINE("propagate poisons the bucket's output and keeps the state", Setup, nonfinite_propagate) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 512, bad = 77;
    allreducer<bf16, error_feedback::residual, std::remove_cvref_t<decltype(comm)>, allreduce_aggregator,
               typename Setup::space>
        reducer(bf16{}, comm, bucket_layout(d), space, {.nonfinite = nonfinite_policy::propagate});
    auto first = upload(space, random_gradient(seed, comm.rank(), d));
    settled_step(reducer, first.view());
    auto const residual_before = download(space, reducer.residual().data(), d);
    auto g = random_gradient(seed + 1, comm.rank(), d);
    if (comm.rank() == 0) g[bad] = std::numeric_limits<float>::quiet_NaN();
    auto poisoned = upload(space, g);
    CHECK_NOTHROW(settled_step(reducer, poisoned.view()));
    auto const out = download(space, poisoned.data(), d);
    auto const residual = download(space, reducer.residual().data(), d);
    CHECK(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }));
    CHECK(std::memcmp(residual.data(), residual_before.data(), d * sizeof(float)) == 0);
    CHECK(reducer.steps() == 1);
    auto clean = upload(space, random_gradient(seed + 2, comm.rank(), d));
    settled_step(reducer, clean.view());
    auto const after = download(space, clean.data(), d);
    CHECK(std::all_of(after.begin(), after.end(), [](float v) { return std::isfinite(v); }));
    CHECK(reducer.steps() == 2);
  });
}

// Ranks that set up different buckets, or different compressors, all get the
// same clear error at construction instead of a hang or garbage.
TEST_CASE_TEMPLATE_DEFINE("ranks that disagree on the configuration are rejected", Setup, config_mismatch) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    using space_t = typename Setup::space;
    auto const space = Setup::make_space();
    int const odd = comm.size() - 1;
    std::size_t const d = comm.rank() == odd ? 999 : 1000;
    CHECK_THROWS_WITH_AS((allreducer<bf16, error_feedback::none, collective_t, allreduce_aggregator, space_t>(
                             bf16{}, comm, bucket_layout(d), space)),
                         doctest::Contains(("rank " + std::to_string(odd) + " has 999").c_str()), invalid_argument);
    auto make = [&](auto compressor) {
      allreducer<decltype(compressor), error_feedback::none, collective_t, allreduce_aggregator, space_t> reducer(
          compressor, comm, bucket_layout(1000), space);
    };
    auto const different = [&] { comm.rank() == odd ? make(fp16{}) : make(bf16{}); };
    CHECK_THROWS_WITH_AS(different(), doctest::Contains("configuration differs"), invalid_argument);
    auto const shapes = [&] {
      bucket_layout layout;
      layout.add(comm.rank() == odd ? std::vector<std::size_t>{100, 10} : std::vector<std::size_t>{10, 100});
      allreducer<bf16, error_feedback::none, collective_t, allreduce_aggregator, space_t>(bf16{}, comm, layout, space);
    };
    CHECK_THROWS_WITH_AS(shapes(), doctest::Contains("configuration differs"), invalid_argument);
  });
}

// A gradient of the wrong length is refused before anything is touched; an
// empty bucket is valid and a step over it communicates nothing.
TEST_CASE_TEMPLATE_DEFINE("wrong lengths are refused and empty buckets are no-ops", Setup, lengths) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    using space_t = typename Setup::space;
    auto const space = Setup::make_space();
    allreducer<bf16, error_feedback::residual, collective_t, allreduce_aggregator, space_t> reducer(
        bf16{}, comm, bucket_layout(100), space);
    auto wrong = upload(space, std::vector<float>(99, 1.0f));
    CHECK_THROWS_WITH_AS(reducer(wrong.view()), doctest::Contains("99 elements but the bucket was set up for 100"),
                         invalid_argument);
    CHECK(reducer.steps() == 0);

    allreducer<bf16, error_feedback::residual, collective_t, allreduce_aggregator, space_t> empty(
        bf16{}, comm, bucket_layout(0), space);
    empty(span<float, typename space_t::memory>{});
    CHECK(empty.wire_bytes() == 0);
    CHECK(empty.steps() == 1);
  });
}

// Wire bytes are counted as the collectives are called, and match what the
// compressor predicts: bf16 is half of fp32, all-gather n times all-reduce,
// plus the agreement on bad values (under either policy): 8 bytes, or on a
// host space, where it rides in an all-reduced payload, two more elements.
TEST_CASE_TEMPLATE_DEFINE("wire bytes are counted and match the prediction", Setup, wire_bytes) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    using space_t = typename Setup::space;
    auto const space = Setup::make_space();
    std::size_t const d = 1234;
    int const n = comm.size();
    auto agreement = [](auto aggregator, std::size_t lane_bytes) -> std::size_t {
      bool const in_payload = std::is_same_v<typename space_t::memory, host_memory> &&
                              std::is_same_v<decltype(aggregator), allreduce_aggregator>;
      return in_payload ? agreement_lanes * lane_bytes : 8;
    };
    auto measure = [&](auto compressor, auto aggregator, nonfinite_policy policy, std::size_t lane_bytes) {
      allreducer<decltype(compressor), error_feedback::none, collective_t, decltype(aggregator), space_t> reducer(
          compressor, comm, bucket_layout(d), space, {.nonfinite = policy});
      auto g = upload(space, std::vector<float>(d, 1.0f));
      reducer(g.view());
      CHECK(reducer.wire_bytes() == compressor.template wire_bytes<decltype(aggregator)>(reducer.layout(), n) +
                                        agreement(aggregator, lane_bytes));
      return reducer.wire_bytes() - agreement(aggregator, lane_bytes);
    };
    CHECK(measure(fp32{}, allreduce_aggregator{}, nonfinite_policy::propagate, 4) == d * 4);
    CHECK(measure(bf16{}, allreduce_aggregator{}, nonfinite_policy::propagate, 2) == d * 2);
    CHECK(measure(fp16{}, allreduce_aggregator{}, nonfinite_policy::raise, 2) == d * 2);
    CHECK(measure(bf16{}, allgather_aggregator{}, nonfinite_policy::propagate, 2) == d * 2 * n);
  });
}
