// What the DDP hook's `auto` does with the planner (detail/hook_planner.hpp),
// and the planner's reuse of a network measured before: a link of known
// rate measured once with the lanes drained, the step's other work and
// unknown convergence weighed against compression, every rank agreeing.
#include <gradcomp/collectives/local_group.hpp>
#include <gradcomp/planning/planner.hpp>
#include <gradcomp/torch/detail/hook_planner.hpp>

#include "common/slow_link.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace gradcomp;
using gradcomp::testing::faithful_timing;
using gradcomp::testing::optimized_build;
using gradcomp::testing::slow_link;

// Whether two networks hold the same links with bitwise the same points.
bool same_links(network_model const& a, network_model const& b) {
  if (a.ranks != b.ranks || a.links.size() != b.links.size()) return false;
  for (std::size_t i = 0; i < a.links.size(); ++i) {
    auto const &x = a.links[i], &y = b.links[i];
    if (x.op != y.op || x.type != y.type || x.points.size() != y.points.size() ||
        std::memcmp(&x.fit, &y.fit, sizeof(link_fit)) != 0 ||
        std::memcmp(x.points.data(), y.points.data(), x.points.size() * sizeof(x.points[0])) != 0)
      return false;
  }
  return true;
}

}  // namespace

TEST_CASE("a network measured before: its links priced from it, not measured again; the rest measured") {
  network_options const measuring{.sizes = {8, 16 << 10, 40 << 10}, .repeats = 2};
  local_group::run(2, [&](local_group::communicator& comm) {
    slow_link link{&comm, 1e-3, 1e-8};
    bucket_layout layout;
    layout.add({256, 256});
    planner_options options;
    options.candidates = {compressor_spec::parse("bf16")};
    options.network = measuring;
    auto const first = plan_compression(link, {layout}, host_space{}, options);
    REQUIRE(!first.network.links.empty());

    // The links, made ten times slower: the plan must price from them.
    network_model slower = first.network;
    for (auto& l : slower.links) {
      for (auto& point : l.points) point.second *= 10;
      l.fit = fit_line(l.points);
    }
    options.measured = slower;
    std::size_t const before = link.calls;
    auto const again = plan_compression(link, {layout}, host_space{}, options);
    // Only the two agreements (the links seen, the rows' prices): no call measured.
    CHECK(link.calls - before == 2);
    CHECK(same_links(again.network, slower));
    auto const& row = again.buckets[0].rows[again.buckets[0].baseline];
    auto const& old = first.buckets[0].rows[first.buckets[0].baseline];
    CHECK(row.communication == doctest::Approx(10 * old.communication).epsilon(1e-9));

    // A candidate whose links it lacks: those measured, the known kept.
    options.candidates.push_back(compressor_spec::parse("thc"));
    auto const more = plan_compression(link, {layout}, host_space{}, options);
    CHECK(more.network.links.size() > slower.links.size());
    for (auto const& l : slower.links) {
      auto const* found = more.network.find(l.op, l.type);
      REQUIRE(found != nullptr);
      CHECK(std::memcmp(found->points.data(), l.points.data(), l.points.size() * sizeof(l.points[0])) == 0);
    }

    // Measured over a group of another size: refused, by name.
    slower.ranks = 3;
    options.measured = slower;
    CHECK_THROWS_WITH_AS(plan_compression(link, {layout}, host_space{}, options),
                         doctest::Contains("the network measured before is of 3 ranks, this group of 2"),
                         invalid_argument);
  });
}

TEST_CASE("the DDP hook's auto measures the network once: a second bucket's plan prices from the first's") {
  local_group::run(2, [&](local_group::communicator& comm) {
    slow_link link{&comm, 1e-3, 1e-8};
    planner_options options;
    options.candidates = {compressor_spec::parse("bf16"), compressor_spec::parse("topkc")};
    options.network = {.sizes = {8, 16 << 10, 40 << 10}, .repeats = 2};
    detail::hook_planner planner(options);
    detail::hook_planner::shapes const first = {{256, 256}}, second = {{512, 160}, {512}};
    int drained = 0;
    planner.before_step<float>(link, 0, first, bucket_rules{}, [&] { ++drained; });
    std::size_t const before = link.calls;
    planner.before_step<float>(link, 1, second, bucket_rules{}, [&] { ++drained; });
    CHECK(drained == 2);
    CHECK(link.calls - before == 2);  // the agreements alone
    REQUIRE(planner.network(0).has_value());
    REQUIRE(planner.network(1).has_value());
    CHECK(same_links(*planner.network(1), *planner.network(0)));
    CHECK(planner.choice(1, second).has_value());
  });
}

TEST_CASE(
    "the DDP hook's auto: a link of known rate measured with the lanes drained; the step's other work and "
    "unknown convergence weigh against compression, the same on every rank") {
  double const latency = 4e-3, per_byte = 1e-7;               // 4 ms, 10 MB/s
  detail::hook_planner::shapes const extents = {{256, 256}};  // bf16's 128 KiB take ~17 ms here
  struct scenario {
    double iteration[2];  // each rank's timed iteration, seconds
    double unknown_steps_factor;
    char const* expected;
  };
  for (auto const& s : {scenario{{0, 0}, 1, "topkc"},        // nothing timed: the reductions alone
                        scenario{{0.01, 0.01}, 1, "topkc"},  // beside 10 ms of other work, it still saves ~20%
                        scenario{{0.01, 0.01}, 2, "bf16"},   // not at twice bf16's steps
                        scenario{{1.0, 0}, 1, "bf16"}}) {    // rank 0's long iteration counts on both
    INFO("iterations " << s.iteration[0] << " s and " << s.iteration[1] << " s, unknown steps factor "
                       << s.unknown_steps_factor);
    std::vector<std::string> chosen(2);
    std::vector<network_model> networks(2);
    local_group::run(2, [&](local_group::communicator& comm) {
      auto const rank = static_cast<std::size_t>(comm.rank());
      slow_link link{&comm, latency, per_byte};
      planner_options options;
      options.candidates = {compressor_spec::parse("bf16"), compressor_spec::parse("topkc")};
      options.unknown_steps_factor = s.unknown_steps_factor;
      options.network = {.sizes = {8, 16 << 10, 40 << 10}, .repeats = 3};
      detail::hook_planner planner(options);
      using clock = detail::hook_planner::clock;
      auto const start = clock::now();
      planner.handed(256 * 256, true, start);  // a warm-up iteration of one bucket, timed when the next begins
      planner.handed(
          256 * 256, true,
          start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(s.iteration[rank])));
      int drained = 0;
      for (int step = 0; step < 2; ++step)  // planned at the first; the second finds it planned
        planner.before_step<float>(link, 0, extents, bucket_rules{}, [&] { ++drained; });
      CHECK(drained == 1);
      chosen[rank] = planner.choice(0, extents).value_or(compressor_spec::parse("qsgd")).str();
      networks[rank] = planner.network(0).value();
    });
    CHECK(chosen[1] == chosen[0]);
    CHECK(std::memcmp(&networks[1].links[0].fit, &networks[0].links[0].fit, sizeof(link_fit)) == 0);
    if (!faithful_timing) continue;
    for (auto const& l : networks[0].links) {
      INFO(std::string(name_of(l.op)) << " " << name_of(l.type));
      CHECK(std::fabs(l.fit.latency - latency) <= 0.1 * latency);
      CHECK(std::fabs(l.fit.seconds_per_byte - per_byte) <= 0.1 * per_byte);
    }
    // (the choices assume TopK-Chunked's local work on 64 Ki values is far
    // under bf16's 17 ms here: an optimized build's, not -O0's)
    if (optimized_build) CHECK(chosen[0] == compressor_spec::parse(s.expected).str());
  }
}
