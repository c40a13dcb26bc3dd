// Compressed reduce-scatter over in-process ranks: each rank's shard against
// the all-reduce path's slice, uneven and empty shards, bad input on one
// rank, 16-bit buckets, checkpoints.
#include "common/compressors.hpp"
#include "common/harness.hpp"
#include "common/reduce_scatter_checks.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

template <class C, class G = float>
using host_scatterer = reduce_scatterer<C, error_feedback::residual, local_group::communicator, host_space, G>;

// `g` followed by zeros up to `size` elements.
template <class T>
std::vector<T> padded_to(std::vector<T> g, std::size_t size) {
  g.resize(size, T(0.0f));
  return g;
}

template <class T>
bool same_bytes(T const* a, T const* b, std::size_t count) {
  return std::memcmp(a, b, count * sizeof(T)) == 0;
}

}  // namespace

TEST_CASE("each rank's shard is bitwise the all-reduce path's slice, step after step, for every shardable compressor") {
  for (int ranks : {2, 3, 4}) {
    for_each_compressor([&](auto c, double) {
      using C = decltype(c);
      if constexpr (detail::shards_by_elements<C>) {
        local_group::run(ranks, [&](local_group::communicator& world) {
          std::uint64_t const seed = shared_seed(world);
          INFO(C::name << ", " << ranks << " ranks, seed " << seed);
          host_scatterer<C> rs(c, world, odd_layout(4), host_space{}, {.warmup_steps = 1});
          host_reducer<C, error_feedback::residual, local_group::communicator> ar(c, world, rs.padded_layout(),
                                                                                  host_space{}, {.warmup_steps = 1});
          std::size_t const d = rs.layout().size(), padded = rs.padded_layout().size();
          CHECK(padded % static_cast<std::size_t>(ranks) == 0);
          std::size_t covered = 0;  // the shards tile the bucket, in rank order
          for (int r = 0; r < ranks; ++r) {
            CHECK(rs.shard_offset(r) == covered);
            covered += rs.shard_size(r);
          }
          CHECK(covered == d);
          for (int step = 0; step < 4; ++step) {  // warm-up, then three compressed steps with error feedback
            auto g = random_gradient(seed + step, world.rank(), d);
            auto reference = padded_to(g, padded);
            ar({reference.data(), padded});
            std::vector<float> shard(rs.shard_size(), std::numeric_limits<float>::quiet_NaN());
            rs({g.data(), d}, {shard.data(), shard.size()});
            CHECK(same_bytes(shard.data(), reference.data() + rs.shard_offset(), shard.size()));
            if (step > 0) CHECK(rs.wire_bytes() <= ar.wire_bytes());
          }
          CHECK(rs.steps() == 4);
          auto const mine = rs.residual(), theirs = ar.residual();
          REQUIRE(mine.size() == theirs.size());
          CHECK(same_bytes(mine.data(), theirs.data(), mine.size()));
        });
      }
    });
  }
}

TEST_CASE("element-aligned payloads travel by one reduce-scatter: half the bytes of the all-reduce") {
  local_group::run(4, [](local_group::communicator& world) {
    std::size_t const d = 4096;
    host_scatterer<bf16> rs(bf16{}, world, bucket_layout(d), host_space{});
    host_reducer<bf16, error_feedback::residual, local_group::communicator> ar(bf16{}, world, bucket_layout(d),
                                                                               host_space{});
    auto g = random_gradient(1, world.rank(), d), h = g;
    std::vector<float> shard(rs.shard_size());
    rs({g.data(), d}, {shard.data(), shard.size()});
    ar({h.data(), d});
    // The payload and the step's agreement (in the all-reduce's payload, two bf16 lanes).
    CHECK(ar.wire_bytes() == (d + agreement_lanes) * sizeof(bfloat16));
    CHECK(rs.wire_bytes() == d * sizeof(bfloat16) / 2 + 8);
  });
}

TEST_CASE("uneven shards: short and empty ones hold the exact mean of their elements") {
  struct shape {
    int ranks;
    std::size_t d;
  };
  for (auto [ranks, d] : {shape{4, 100}, shape{3, 130}, shape{5, 1000}}) {
    local_group::run(ranks, [&, ranks = ranks, d = d](local_group::communicator& world) {
      std::uint64_t const seed = shared_seed(world);
      INFO(ranks << " ranks, " << d << " elements, seed " << seed);
      host_scatterer<fp32> rs(fp32{}, world, bucket_layout(d), host_space{});
      std::size_t const shard = detail::shard_elements(d, ranks, 64);
      std::size_t const offset = std::min(d, shard * world.rank());
      CHECK(rs.shard_offset() == offset);
      CHECK(rs.shard_size() == std::min(d, offset + shard) - offset);
      std::vector<float> out(rs.shard_size(), std::numeric_limits<float>::quiet_NaN());
      auto g = random_gradient(seed, world.rank(), d);
      rs({g.data(), d}, {out.data(), out.size()});
      for (std::size_t i = 0; i < out.size(); ++i) {
        double exact = 0, scale = 0;  // (fp32: each value rounds once, scaled by 1 / ranks)
        for (int r = 0; r < ranks; ++r) {
          float const x = random_gradient(seed, r, d)[offset + i];
          exact += x;
          scale += std::abs(x);
        }
        CHECK(std::abs(out[i] - exact / ranks) <= 1e-6 * scale / ranks);
      }
    });
  }
}

TEST_CASE("16-bit buckets: the shard is bitwise the all-reduce path's slice") {
  auto check = [](auto c) {
    using C = decltype(c);
    local_group::run(3, [&](local_group::communicator& world) {
      std::uint64_t const seed = shared_seed(world);
      INFO(C::name << ", seed " << seed);
      host_scatterer<C, bfloat16> rs(c, world, bucket_layout(5000), host_space{});
      host_reducer<C, error_feedback::residual, local_group::communicator> ar(c, world, rs.padded_layout(),
                                                                              host_space{});
      for (int step = 0; step < 2; ++step) {
        auto const wide = random_gradient(seed + step, world.rank(), 5000);
        std::vector<bfloat16> g(wide.size());
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = bfloat16(wide[i]);
        auto reference = padded_to(g, rs.padded_layout().size());
        ar(span<bfloat16>(reference.data(), reference.size()));
        std::vector<bfloat16> shard(rs.shard_size());
        rs({g.data(), g.size()}, {shard.data(), shard.size()});
        CHECK(same_bytes(shard.data(), reference.data() + rs.shard_offset(), shard.size()));
      }
    });
  };
  check(qsgd<std::int32_t>{.bits = 8});
  check(thc<>{.block = 256});
  check(topkc<>{.chunk_size = 64, .fraction = 0.1});
}

TEST_CASE("bad input on one rank fails the step on every rank, and nothing moves") {
  local_group::run(3, [](local_group::communicator& world) {
    host_scatterer<thc<>> rs(thc<>{.block = 64}, world, bucket_layout(1000), host_space{});
    check_bad_steps_fail_everywhere(rs, world.rank(), 2, 1);
  });
}

TEST_CASE("ranks that disagree on the bucket fail together at construction") {
  local_group::run(3, [](local_group::communicator& world) {
    std::size_t const d = world.rank() == 1 ? 999 : 1000;
    CHECK_THROWS_WITH(host_scatterer<bf16>(bf16{}, world, bucket_layout(d), host_space{}),
                      doctest::Contains("rank 1's configuration differs"));
  });
}

TEST_CASE("a reduce-scatter run saved and restored continues bitwise; an all-reduce checkpoint is refused") {
  using C = qsgd_multiscale;
  std::vector<std::vector<float>> whole(4), resumed(4);
  local_group::run(4, [&](local_group::communicator& world) {
    using scatterer = host_scatterer<C>;
    std::size_t const d = 3001;
    scatterer a(C{}, world, bucket_layout(d), host_space{});
    auto b = std::make_unique<scatterer>(C{}, world, bucket_layout(d), host_space{});
    std::vector<float> x(a.shard_size()), y(b->shard_size());
    for (int step = 0; step < 5; ++step) {
      if (step == 3) {
        auto const saved = b->save();
        b = std::make_unique<scatterer>(C{}, world, bucket_layout(d), host_space{});
        b->restore(span<std::byte const>(saved.data(), saved.size()));
      }
      auto g = random_gradient(90 + step, world.rank(), d), h = g;
      a({g.data(), d}, {x.data(), x.size()});
      (*b)({h.data(), d}, {y.data(), y.size()});
    }
    whole[world.rank()] = x;
    resumed[world.rank()] = y;
    host_reducer<C, error_feedback::residual, local_group::communicator> flat(C{}, world, b->padded_layout(),
                                                                              host_space{});
    auto const other = flat.save();
    CHECK_THROWS_AS(b->restore(span<std::byte const>(other.data(), other.size())), checkpoint_error);
  });
  for (int r = 0; r < 4; ++r) {
    REQUIRE(whole[r].size() == resumed[r].size());
    CHECK(same_bytes(whole[r].data(), resumed[r].data(), whole[r].size()));
  }
}

TEST_CASE("any_reduce_scatterer gives bitwise the typed reduce_scatterer's shards, and refuses on every rank") {
  for (char const* text : {"bf16", "fp16:ef=on", "thc:bits=4,block=256", "topkc:fraction=0.1,chunk_size=64", "qsgd"}) {
    local_group::run(3, [&](local_group::communicator& world) {
      compressor_spec const spec = compressor_spec::parse(text);
      std::uint64_t const seed = shared_seed(world);
      INFO(text << ", seed " << seed);
      any_reduce_scatterer<local_group::communicator, host_space> chosen(spec, world, odd_layout(4), host_space{});
      visit_compressor(spec, world.size(), [&](auto c, auto ef) {
        using C = decltype(c);
        if constexpr (detail::shards_by_elements<C>) {
          reduce_scatterer<C, decltype(ef), local_group::communicator, host_space> typed(c, world, odd_layout(4),
                                                                                         host_space{});
          REQUIRE(chosen.shard_size() == typed.shard_size());
          CHECK(chosen.shard_offset() == typed.shard_offset());
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
          CHECK(chosen.steps() == 3);
        }
        return 0;
      });
    });
  }
  local_group::run(3, [](local_group::communicator& world) {
    for (char const* text : {"powersgd", "topk"})  // their payloads cannot be cut into shards
      CHECK_THROWS_WITH_AS((any_reduce_scatterer<local_group::communicator, host_space>(
                               compressor_spec::parse(text), world, bucket_layout(4096), host_space{})),
                           doctest::Contains("cannot reduce-scatter"), invalid_argument);
    compressor_spec spec = compressor_spec::parse("thc");
    if (world.rank() == 1) spec.name = "thc2";  // a spec only one rank rejects
    CHECK_THROWS_WITH_AS(
        (any_reduce_scatterer<local_group::communicator, host_space>(spec, world, bucket_layout(4096), host_space{})),
        doctest::Contains("rank 1 cannot use this compressor_spec: compressor_spec: unknown compressor "
                          "'thc2'"),
        invalid_argument);
  });
}
