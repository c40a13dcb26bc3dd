// Compressed reduce-scatter in two levels over in-process ranks: each shard
// against the hierarchical all-reduce's slice and against the exact mean, for
// 2 nodes x 2 ranks, 2 x 3 and 3 x 2; uneven and empty shards, lanes sized
// by nodes, bad input on one rank, checkpoints, and the run-time choice.
#include "common/compressors.hpp"
#include "common/harness.hpp"
#include "common/reduce_scatter_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

using world_comm = local_group::communicator;

template <class C, class G = float>
using two_level_scatterer = hierarchical_reduce_scatterer<C, error_feedback::residual, world_comm, host_space, G>;
template <class C, class G = float>
using two_level_reducer = hierarchical_allreducer<C, error_feedback::residual, world_comm, host_space, G>;

template <class T>
bool same_bytes(T const* a, T const* b, std::size_t count) {
  return count == 0 || std::memcmp(a, b, count * sizeof(T)) == 0;  // (an empty shard's data() may be null)
}

struct shape {
  int nodes, per_node;
};
constexpr shape shapes[] = {{2, 2}, {2, 3}, {3, 2}};

// Every rank's shard, read through `rs`'s accessors: they tile [0, d) once,
// and rank (node n, local rank l) has the flat reduce-scatter's shard l * N + n.
template <class Scatterer>
void check_tiling(Scatterer const& rs, int nodes, int per_node, std::size_t alignment) {
  std::size_t const d = rs.layout().size();
  auto const flat = detail::element_parts(d, nodes * per_node, alignment);
  std::vector<int> owners(d, 0);
  for (int rank = 0; rank < nodes * per_node; ++rank) {
    int const n = rank / per_node, l = rank % per_node;
    CHECK(rs.shard_offset(rank) == rs.shard_offset(n, l));
    auto const expected = flat.of_rank[static_cast<std::size_t>(l * nodes + n)];
    CHECK(rs.shard_offset(n, l) == expected.first);
    CHECK(rs.shard_size(n, l) == expected.count);
    for (std::size_t i = 0; i < rs.shard_size(rank); ++i) ++owners[rs.shard_offset(rank) + i];
  }
  CHECK(std::all_of(owners.begin(), owners.end(), [](int o) { return o == 1; }));
}

}  // namespace

TEST_CASE("two-level reduce-scatter: each shard is bitwise the hierarchical all-reduce's slice, step after step") {
  for (auto [nodes, per_node] : shapes) {
    for_each_compressor([&, nodes = nodes, per_node = per_node](auto c, double) {
      using C = decltype(c);
      if constexpr (detail::shards_by_elements<C>) {
        // Whole parts of whole sub-shards, so the all-reduce cuts the same parts.
        std::size_t const unit = detail::shard_alignment(c) * static_cast<std::size_t>(nodes * per_node);
        bucket_layout layout;
        layout.add({2 * unit - 100}).add({10, 10});
        std::size_t const d = layout.size();
        local_group::run(nodes * per_node, [&](world_comm& world) {
          std::uint64_t const seed = shared_seed(world);
          INFO(C::name << ", " << nodes << " nodes x " << per_node << ", seed " << seed);
          auto groups = split_nodes(world, per_node);
          hierarchical_options const options{.reduce = {.warmup_steps = 1}};
          two_level_scatterer<C> rs(c, groups, layout, host_space{}, options);
          two_level_reducer<C> ar(c, groups, layout, host_space{}, options);
          check_tiling(rs, nodes, per_node, detail::shard_alignment(c));
          for (int step = 0; step < 4; ++step) {  // warm-up, then three compressed steps with error feedback
            auto g = random_gradient(seed + step, world.rank(), d), reference = g;
            ar({reference.data(), d});
            std::vector<float> shard(rs.shard_size(), std::numeric_limits<float>::quiet_NaN());
            rs({g.data(), d}, {shard.data(), shard.size()});
            CHECK(same_bytes(shard.data(), reference.data() + rs.shard_offset(), shard.size()));
            if (step > 0) CHECK(rs.wire_bytes() <= ar.wire_bytes());
          }
          CHECK(rs.steps() == 4);
          CHECK(rs.rail_elements().first == ar.rail_elements().first);
          auto const mine = rs.residual(), theirs = ar.residual();
          REQUIRE(mine.size() == theirs.size());
          CHECK(same_bytes(mine.data(), theirs.data(), mine.size()));
        });
      }
    });
  }
}

TEST_CASE("two-level reduce-scatter: uneven and empty shards hold the world's mean of their elements") {
  for (auto [nodes, per_node] : shapes) {
    for (std::size_t d : {std::size_t{1}, std::size_t{100}, std::size_t{1000}, std::size_t{4097}}) {
      for (bool bf16_within_node : {false, true}) {
        int const n = nodes * per_node;
        local_group::run(n, [&, nodes = nodes, per_node = per_node](world_comm& world) {
          std::uint64_t const seed = shared_seed(world);
          INFO(nodes << " nodes x " << per_node << ", " << d << " elements, bf16 within node " << bf16_within_node
                     << ", seed " << seed);
          auto groups = split_nodes(world, per_node);
          hierarchical_reduce_scatterer<fp32, error_feedback::none, world_comm, host_space> rs(
              fp32{}, groups, bucket_layout(d), host_space{}, {.bf16_within_node = bf16_within_node});
          check_tiling(rs, nodes, per_node, detail::shard_alignment(fp32{}));
          auto g = random_gradient(seed, world.rank(), d);
          std::vector<float> shard(rs.shard_size(), std::numeric_limits<float>::quiet_NaN());
          rs({g.data(), d}, {shard.data(), shard.size()});
          auto const all = random_gradients(seed, n, d);
          // fp32 sums: a few roundings. bf16 inside the node: each value and each of
          // the node's partial sums rounded to bf16 (2^-8 each), L roundings in all.
          double const unit = bf16_within_node ? per_node * 0x1.0p-8 : 0x1.0p-21;
          for (std::size_t i = 0; i < shard.size(); ++i) {
            std::size_t const at = rs.shard_offset() + i;
            double exact = 0, size = 0;
            for (auto const& x : all) exact += x[at] / n, size += std::fabs(x[at]) / n;
            CHECK(std::fabs(shard[i] - exact) <= unit * size);
          }
        });
      }
    }
  }
}

TEST_CASE("two-level reduce-scatter of 16-bit buckets: bitwise the hierarchical all-reduce's slice") {
  for (bool bf16_within_node : {false, true}) {
    local_group::run(6, [&](world_comm& world) {
      std::uint64_t const seed = shared_seed(world);
      INFO("bf16 within node " << bf16_within_node << ", seed " << seed);
      auto groups = split_nodes(world, 3);
      thc<> const c{.block = 64};
      hierarchical_options const options{.bf16_within_node = bf16_within_node};
      std::size_t const d = 64 * 6 * 3;
      two_level_scatterer<thc<>, bfloat16> rs(c, groups, bucket_layout(d), host_space{}, options);
      two_level_reducer<thc<>, bfloat16> ar(c, groups, bucket_layout(d), host_space{}, options);
      for (int step = 0; step < 3; ++step) {
        auto const x = random_gradient(seed + step, world.rank(), d);
        std::vector<bfloat16> g(d), reference(d);
        for (std::size_t i = 0; i < d; ++i) g[i] = reference[i] = bfloat16(x[i]);
        ar({reference.data(), d});
        std::vector<bfloat16> shard(rs.shard_size(), bfloat16(std::nanf("")));
        rs({g.data(), d}, {shard.data(), shard.size()});
        CHECK(same_bytes(shard.data(), reference.data() + rs.shard_offset(), shard.size()));
      }
    });
  }
}

TEST_CASE("two-level reduce-scatter: lanes are sized by the number of nodes, not of ranks") {
  qsgd<std::int8_t> q{.bits = 5};  // codes up to +-31: 2 x 31 fits an int8 sum, 8 x 31 does not
  local_group::run(8, [&](world_comm& world) {
    auto groups = split_nodes(world, 4);
    CHECK_NOTHROW(hierarchical_reduce_scatterer<decltype(q), error_feedback::none, world_comm, host_space>(
        q, groups, bucket_layout(1000), host_space{}));
    CHECK_THROWS_WITH((reduce_scatterer<decltype(q), error_feedback::none, world_comm, host_space>(
                          q, world, bucket_layout(1000), host_space{})),
                      doctest::Contains("8 ranks"));
    auto singles = split_nodes(world, 1);  // 8 nodes of one rank: the lanes sum 8 values again
    CHECK_THROWS_WITH((hierarchical_reduce_scatterer<decltype(q), error_feedback::none, world_comm, host_space>(
                          q, singles, bucket_layout(1000), host_space{})),
                      doctest::Contains("across 8 nodes"));
  });
}

TEST_CASE("two-level reduce-scatter: bad input on one rank fails every rank of every node, and nothing moves") {
  local_group::run(4, [](world_comm& world) {
    auto groups = split_nodes(world, 2);
    two_level_scatterer<thc<>> rs(thc<>{.block = 64}, groups, bucket_layout(1000), host_space{});
    check_bad_steps_fail_everywhere(rs, world.rank(), 3, 1);  // rank 3: node 1, in another node than rank 0
    std::size_t const d = world.rank() == 2 ? 999 : 1000;     // ranks that disagree fail together ...
    CHECK_THROWS_WITH((two_level_scatterer<bf16>(bf16{}, groups, bucket_layout(d), host_space{})),
                      doctest::Contains("rank 0 has 1000 elements, rank 2 has 999"));
    // ... on the node's precision (rank 1's node would reduce-scatter two types) ...
    CHECK_THROWS_WITH((two_level_scatterer<bf16>(bf16{}, groups, bucket_layout(1000), host_space{},
                                                 {.bf16_within_node = world.rank() == 1})),
                      doctest::Contains("rank 1's compressor, its parameters, its options"));
    // ... and on the options of another rail.
    CHECK_THROWS_WITH((two_level_scatterer<bf16>(bf16{}, groups, bucket_layout(1000), host_space{},
                                                 {.reduce = {.warmup_steps = world.rank() == 3 ? 2u : 0u}})),
                      doctest::Contains("rank 3's compressor, its parameters, its options"));
    CHECK_NOTHROW(two_level_scatterer<bf16>(bf16{}, groups, bucket_layout(1000), host_space{}));
  });
}

TEST_CASE("two-level reduce-scatter: a run saved and restored continues bitwise; others' checkpoints are refused") {
  using C = topkc<>;
  C const c{.chunk_size = 16, .fraction = 0.2};
  std::vector<std::vector<float>> whole(4), resumed(4);
  local_group::run(4, [&](world_comm& world) {
    auto groups = split_nodes(world, 2);
    std::size_t const d = 3000;
    hierarchical_options const options{.reduce = {.warmup_steps = 1}};
    two_level_scatterer<C> a(c, groups, bucket_layout(d), host_space{}, options);
    auto b = std::make_unique<two_level_scatterer<C>>(c, groups, bucket_layout(d), host_space{}, options);
    std::vector<float> x(a.shard_size()), y(b->shard_size());
    for (int step = 0; step < 5; ++step) {
      if (step == 3) {
        auto const saved = b->save();
        b = std::make_unique<two_level_scatterer<C>>(c, groups, bucket_layout(d), host_space{}, options);
        b->restore(span<std::byte const>(saved.data(), saved.size()));
      }
      auto g = random_gradient(90 + step, world.rank(), d), h = g;
      a({g.data(), d}, {x.data(), x.size()});
      (*b)({h.data(), d}, {y.data(), y.size()});
    }
    whole[world.rank()] = x;
    resumed[world.rank()] = y;
    auto const all_reduce = two_level_reducer<C>(c, groups, bucket_layout(d), host_space{}, options).save();
    CHECK_THROWS_WITH_AS(b->restore(span<std::byte const>(all_reduce.data(), all_reduce.size())),
                         doctest::Contains("different configuration"), checkpoint_error);
    auto const flat =
        reduce_scatterer<C, error_feedback::residual, world_comm, host_space>(c, world, bucket_layout(d), host_space{})
            .save();
    CHECK_THROWS_WITH_AS(b->restore(span<std::byte const>(flat.data(), flat.size())),
                         doctest::Contains("saved by an allreducer, restored into a hierarchical reducer"),
                         checkpoint_error);
  });
  for (int r = 0; r < 4; ++r) {
    REQUIRE(whole[r].size() == resumed[r].size());
    CHECK(same_bytes(whole[r].data(), resumed[r].data(), whole[r].size()));
  }
}

TEST_CASE("any_reduce_scatterer over two levels gives bitwise the typed shards, and refuses on every rank") {
  for (char const* text : {"bf16", "thc:bits=4,block=256", "topkc:fraction=0.1,chunk_size=64"}) {
    local_group::run(6, [&](world_comm& world) {
      compressor_spec const spec = compressor_spec::parse(text);
      std::uint64_t const seed = shared_seed(world);
      INFO(text << ", seed " << seed);
      auto groups = split_nodes(world, 2);
      any_reduce_scatterer<world_comm, host_space> chosen(spec, groups, odd_layout(4), host_space{});
      visit_compressor(spec, groups.nodes(), [&](auto c, auto ef) {
        using C = decltype(c);
        if constexpr (detail::shards_by_elements<C>) {
          hierarchical_reduce_scatterer<C, decltype(ef), world_comm, host_space> typed(c, groups, odd_layout(4),
                                                                                       host_space{});
          REQUIRE(chosen.shard_size() == typed.shard_size());
          CHECK(chosen.shard_offset() == typed.shard_offset());
          for (int r = 0; r < world.size(); ++r) CHECK(chosen.shard_offset(r) == typed.shard_offset(r));
          CHECK(chosen.fingerprint() == typed.fingerprint());
          std::size_t const d = typed.layout().size();
          for (int step = 0; step < 3; ++step) {
            auto g = random_gradient(seed + step, world.rank(), d), h = g;
            std::vector<float> a(typed.shard_size(), std::nanf("")), b(typed.shard_size(), -1.0f);
            chosen({g.data(), d}, {a.data(), a.size()});
            typed({h.data(), d}, {b.data(), b.size()});
            CHECK(same_bytes(a.data(), b.data(), a.size()));
          }
          CHECK(chosen.wire_bytes() == typed.wire_bytes());
        }
        return 0;
      });
    });
  }
  local_group::run(4, [](world_comm& world) {
    auto groups = split_nodes(world, 2);
    for (char const* text : {"powersgd", "topk"})
      CHECK_THROWS_WITH_AS((any_reduce_scatterer<world_comm, host_space>(compressor_spec::parse(text), groups,
                                                                         bucket_layout(4096), host_space{})),
                           doctest::Contains("cannot reduce-scatter"), invalid_argument);
  });
}
