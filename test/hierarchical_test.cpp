// Two-level aggregation over in-process ranks: splitting communicators,
// reduce-scatter, and the hierarchical allreducer against the flat one, for
// 2 nodes x 2 ranks, 2 x 3 and 3 x 2.
#include "common/compressors.hpp"
#include "common/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

// The compressors a node's ranks can shard (summable, shape-free).
template <class F>
void for_each_shardable(F&& f) {
  for_each_compressor([&](auto c, double unit) {
    if constexpr (detail::shards_by_elements<decltype(c)>) f(c, unit);
  });
}

double relative_error(std::vector<float> const& out, std::vector<double> const& exact) {
  double err = 0, norm = 0;
  for (std::size_t i = 0; i < out.size(); ++i) {
    err += (out[i] - exact[i]) * (out[i] - exact[i]);
    norm += exact[i] * exact[i];
  }
  return std::sqrt(err / norm);
}

struct shape {
  int nodes, per_node;
};
constexpr shape shapes[] = {{2, 2}, {2, 3}, {3, 2}};

}  // namespace

TEST_CASE("local_group splits as MPI_Comm_split does, and reduce-scatters bitwise like all_reduce") {
  local_group::run(6, [](local_group::communicator& world) {
    int const rank = world.rank();
    auto half = world.split(rank % 2, -rank);  // evens and odds, ranked in reverse
    CHECK(half.size() == 3);
    CHECK(half.rank() == 2 - rank / 2);
    std::int32_t sum[1] = {rank};
    half.all_reduce(sum, sum, 1, reduce_op::sum);
    CHECK(sum[0] == (rank % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5));
    auto pair = half.split(half.rank() / 2, 0);  // a split of a split
    CHECK(pair.size() == (half.rank() < 2 ? 2 : 1));

    std::uint64_t const seed = shared_seed(world);
    std::size_t const count = 1001;
    auto const mine = random_gradient(seed, rank, count * 6);
    std::vector<float> all = mine, block(count);
    world.all_reduce(all.data(), all.data(), all.size(), reduce_op::sum);
    world.reduce_scatter(mine.data(), block.data(), count, reduce_op::sum);
    CHECK(std::memcmp(block.data(), all.data() + count * rank, count * sizeof(float)) == 0);
    std::vector<float> in_place = mine;  // recv inside send
    world.reduce_scatter(in_place.data(), in_place.data() + count * rank, count, reduce_op::sum);
    CHECK(std::memcmp(in_place.data() + count * rank, block.data(), count * sizeof(float)) == 0);
    std::vector<bfloat16> narrow(count * 6), narrow_all(count * 6), narrow_block(count);
    for (std::size_t i = 0; i < narrow.size(); ++i) narrow[i] = bfloat16(mine[i]);
    world.all_reduce(narrow.data(), narrow_all.data(), narrow.size(), reduce_op::sum);
    world.reduce_scatter(narrow.data(), narrow_block.data(), count, reduce_op::sum);
    CHECK(std::memcmp(narrow_block.data(), narrow_all.data() + count * rank, count * sizeof(bfloat16)) == 0);
  });
}

TEST_CASE("split_nodes makes nodes and rails, and refuses a world it cannot divide") {
  for (auto [nodes, per_node] : shapes) {
    local_group::run(nodes * per_node, [&, nodes = nodes, per_node = per_node](local_group::communicator& world) {
      auto groups = split_nodes(world, per_node);
      CHECK(groups.nodes() == nodes);
      CHECK(groups.ranks_per_node() == per_node);
      CHECK(groups.local.rank() == world.rank() % per_node);
      CHECK(groups.cross.rank() == world.rank() / per_node);
      std::int32_t node_sum[1] = {world.rank()};
      groups.local.all_reduce(node_sum, node_sum, 1, reduce_op::sum);
      int const first = world.rank() / per_node * per_node;
      CHECK(node_sum[0] == per_node * first + per_node * (per_node - 1) / 2);
    });
  }
  CHECK_THROWS_WITH(local_group::run(6, [](local_group::communicator& world) { split_nodes(world, 4); }),
                    doctest::Contains("6 ranks do not make nodes of 4"));
  CHECK_THROWS_WITH(local_group::run(2, [](local_group::communicator& world) { split_nodes(world); }),
                    doctest::Contains("give ranks_per_node"));
}

TEST_CASE("hierarchical equals flat within the compressor's error, bitwise the same on every rank") {
  for (auto [nodes, per_node] : shapes) {
    for_each_shardable([&, nodes = nodes, per_node = per_node](auto c, double) {
      using C = decltype(c);
      int const world_size = nodes * per_node;
      std::size_t const d = odd_layout(4).size();
      std::vector<std::vector<float>> hier(world_size), flat(world_size);
      std::uint64_t seed = 0;
      local_group::run(world_size, [&](local_group::communicator& world) {
        std::uint64_t const shared = shared_seed(world);
        if (world.rank() == 0) seed = shared;  // (one writer: the ranks are threads)
        auto groups = split_nodes(world, per_node);
        hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> h(
            c, groups, odd_layout(4), host_space{});
        host_reducer<C, error_feedback::residual, local_group::communicator> f(c, world, odd_layout(4), host_space{});
        auto g = random_gradient(shared, world.rank(), d), g2 = g;
        h({g.data(), d});
        f({g2.data(), d});
        hier[world.rank()] = g;
        flat[world.rank()] = g2;
      });
      std::vector<double> exact(d, 0.0);
      for (int r = 0; r < world_size; ++r) {
        auto const g = random_gradient(seed, r, d);
        for (std::size_t i = 0; i < d; ++i) exact[i] += static_cast<double>(g[i]) / world_size;
      }
      INFO(C::name << ", " << nodes << " nodes x " << per_node << ", seed " << seed);
      for (int r = 1; r < world_size; ++r) CHECK(std::memcmp(hier[r].data(), hier[0].data(), d * sizeof(float)) == 0);
      double const e_hier = relative_error(hier[0], exact), e_flat = relative_error(flat[0], exact);
      INFO("relative error: hierarchical " << e_hier << ", flat " << e_flat);
      // fp32 differs only by the order of its sums; the others by their own error.
      CHECK(e_hier <= (std::is_same_v<C, fp32> ? 1e-6 : 3.0 * e_flat + 1e-6));
    });
  }
}

// sum_t out_t + (the world's residual, shard by shard, averaged over nodes)
// = sum_t mean_t: hierarchical error feedback loses nothing.
TEST_CASE("hierarchical error feedback loses nothing over many steps") {
  for_each_shardable([&](auto c, double unit) {
    using C = decltype(c);
    int const nodes = 2, per_node = 3, world_size = 6, steps = 60;
    std::size_t const d = 2000;
    std::vector<double> sent(d, 0.0), had(d, 0.0);
    std::vector<std::vector<float>> node_residual(nodes);
    local_group::run(world_size, [&](local_group::communicator& world) {
      auto groups = split_nodes(world, per_node);
      hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> h(
          c, groups, bucket_layout(d), host_space{});
      std::size_t const shard = h.shard_size();
      for (int t = 0; t < steps; ++t) {
        auto g = random_gradient(500 + t, world.rank(), d);
        h({g.data(), d});
        if (world.rank() == 0)
          for (std::size_t i = 0; i < d; ++i) sent[i] += g[i];
      }
      auto const residual = h.residual();
      std::vector<float> all(shard * per_node);
      groups.local.all_gather(residual.data(), all.data(), shard);
      if (world.rank() % per_node == 0) node_residual[world.rank() / per_node] = all;  // one rank per node
    });
    for (int t = 0; t < steps; ++t)
      for (int r = 0; r < world_size; ++r) {
        auto const g = random_gradient(500 + t, r, d);
        for (std::size_t i = 0; i < d; ++i) had[i] += static_cast<double>(g[i]) / world_size;
      }
    double worst = 0, scale = 0;
    for (std::size_t i = 0; i < d; ++i) {
      double kept = 0;
      for (auto const& r : node_residual) kept += r[i];
      worst = std::max(worst, std::fabs(sent[i] + kept / nodes - had[i]));
      scale = std::max(scale, std::fabs(had[i]));
    }
    INFO(C::name << ": worst " << worst << " of " << scale);
    CHECK(worst <= 64 * steps * unit * (scale + 1) + 1e-5);
  });
}

TEST_CASE("lanes are sized by the number of nodes: accepted for 2 nodes, refused flat over 8 ranks") {
  qsgd<std::int8_t> q{.bits = 5};  // codes up to +-31: 2 x 31 fits an int8 sum, 8 x 31 does not
  local_group::run(8, [&](local_group::communicator& world) {
    auto groups = split_nodes(world, 4);
    CHECK_NOTHROW(hierarchical_allreducer<decltype(q), error_feedback::none, local_group::communicator, host_space>(
        q, groups, bucket_layout(1000), host_space{}));
    CHECK_THROWS_WITH((host_reducer<decltype(q), error_feedback::none, local_group::communicator>(
                          q, world, bucket_layout(1000), host_space{})),
                      doctest::Contains("8 ranks"));
    auto singles = split_nodes(world, 1);  // 8 nodes of one rank: the lanes sum 8 values again
    CHECK_THROWS_WITH(
        (hierarchical_allreducer<decltype(q), error_feedback::none, local_group::communicator, host_space>(
            q, singles, bucket_layout(1000), host_space{})),
        doctest::Contains("across 8 nodes"));
  });
}

TEST_CASE("ranks agree over two levels in world order, and a disagreement names the rank on every rank") {
  for (auto const [nodes, per_node] : shapes) {
    int const n = nodes * per_node;
    local_group::run(n, [&, n = n, per_node = per_node](local_group::communicator& world) {
      auto groups = split_nodes(world, per_node);
      int const rank = world.rank();
      host_space const space{.threads = 1};
      agreement const all(groups.local, groups.cross, space, 100 + static_cast<std::uint64_t>(rank), 7,
                          rank == n - 2 ? "rank " + std::to_string(rank) + "'s own reason" : "");
      REQUIRE(all.ranks() == n);
      CHECK(all.self() == rank);
      for (int r = 0; r < n; ++r) CHECK(all.of(r).a == 100 + static_cast<std::uint64_t>(r));
      CHECK(all.first_failed() == n - 2);
      CHECK(all.why(n - 2) == "rank " + std::to_string(n - 2) + "'s own reason");
      CHECK(all.first_other_a() == 1);
      CHECK(all.first_other_b() == -1);

      using reducer = hierarchical_allreducer<topkc<>, error_feedback::residual, local_group::communicator, host_space>;
      topkc<> const c{.chunk_size = 16, .fraction = 0.25};
      std::size_t const d = rank == n - 1 ? 999 : 1000;
      std::string const sizes = "rank 0 has 1000 elements, rank " + std::to_string(n - 1) + " has 999";
      CHECK_THROWS_WITH_AS(reducer(c, groups, bucket_layout(d), space), doctest::Contains(sizes.c_str()),
                           invalid_argument);
      topkc<> const other{.chunk_size = 16, .fraction = rank == 1 ? 0.5 : 0.25};
      CHECK_THROWS_WITH_AS(reducer(other, groups, bucket_layout(1000), space),
                           doctest::Contains("rank 1's compressor, its parameters"), invalid_argument);
      CHECK_NOTHROW(reducer(c, groups, bucket_layout(1000), space));  // (nobody was left waiting)
    });
  }
}

TEST_CASE("ranks agree in one order where rails order the nodes differently (nodes not of consecutive ranks)") {
  local_group::run(4, [](local_group::communicator& world) {
    int const rank = world.rank();
    // Node A holds ranks 0 and 3, node B ranks 1 and 2: the rail of local
    // ranks 0 is (A, B), the rail of local ranks 1 is (B, A).
    auto local = world.split(rank == 0 || rank == 3 ? 0 : 1, rank);
    auto cross = world.split(local.rank(), rank);
    agreement const all(local, cross, host_space{.threads = 1}, static_cast<std::uint64_t>(rank), 0,
                        rank == 2 ? "rank 2's reason" : "");
    std::uint64_t order = 0;  // the order this rank sees, as one number
    for (int r = 0; r < 4; ++r) order = order * 10 + all.of(r).a;
    CHECK(order == 312);  // A's ranks 0 and 3, then B's 1 and 2 (in node order of rail 0: A first)
    CHECK(all.of(all.self()).a == static_cast<std::uint64_t>(rank));
    CHECK(all.why(all.first_failed()) == "rank 2's reason");
  });
}

TEST_CASE("a bad value on one rank fails the step on every rank of every node, and no residual moves") {
  using C = thc<>;
  local_group::run(4, [](local_group::communicator& world) {
    auto groups = split_nodes(world, 2);
    hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> h(
        C{.block = 64}, groups, bucket_layout(1000), host_space{});
    auto g = random_gradient(3, world.rank(), 1000);
    h({g.data(), g.size()});
    std::vector<float> const before(h.residual().begin(), h.residual().end());
    auto bad = random_gradient(4, world.rank(), 1000);
    if (world.rank() == 3) bad[17] = std::nanf("");  // one element of one shard of one node
    auto const kept = bad;
    CHECK_THROWS_AS(h({bad.data(), bad.size()}), nonfinite_error);
    CHECK(h.steps() == 1);
    CHECK(std::memcmp(before.data(), h.residual().data(), before.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(bad.data(), kept.data(), bad.size() * sizeof(float)) == 0);  // the gradient stays as it was
    std::vector<float> wrong(999);
    if (world.rank() == 1)
      CHECK_THROWS_WITH(h({wrong.data(), wrong.size()}), doctest::Contains("999 elements"));
    else
      CHECK_THROWS(h({g.data(), g.size()}));  // the others fail the step too, and nobody hangs
    CHECK(h.steps() == 1);
  });
}

TEST_CASE("a hierarchical run saved and restored continues bitwise") {
  using C = topkc<>;
  std::vector<std::vector<float>> whole(4), resumed(4);
  local_group::run(4, [&](local_group::communicator& world) {
    auto groups = split_nodes(world, 2);
    C const c{.chunk_size = 16, .fraction = 0.2};
    using reducer = hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space>;
    reducer a(c, groups, bucket_layout(3000), host_space{}, {.reduce = {.warmup_steps = 1}});
    auto b = std::make_unique<reducer>(c, groups, bucket_layout(3000), host_space{},
                                       hierarchical_options{.reduce = {.warmup_steps = 1}});
    std::vector<float> x, y;
    for (int step = 0; step < 5; ++step) {
      if (step == 3) {
        auto const saved = b->save();
        b = std::make_unique<reducer>(c, groups, bucket_layout(3000), host_space{},
                                      hierarchical_options{.reduce = {.warmup_steps = 1}});
        b->restore(span<std::byte const>(saved.data(), saved.size()));
      }
      x = random_gradient(80 + step, world.rank(), 3000);
      y = x;
      a({x.data(), x.size()});
      (*b)({y.data(), y.size()});
    }
    whole[world.rank()] = x;
    resumed[world.rank()] = y;
    auto const other = b->save();  // another rank's checkpoint is refused on every rank
    std::vector<std::byte> mine(other.size());
    std::vector<std::byte> all(other.size() * 4);
    world.all_gather(reinterpret_cast<std::uint8_t const*>(other.data()), reinterpret_cast<std::uint8_t*>(all.data()),
                     other.size());
    std::memcpy(mine.data(), all.data() + other.size() * ((world.rank() + 1) % 4), other.size());
    CHECK_THROWS_AS(b->restore(span<std::byte const>(mine.data(), mine.size())), checkpoint_error);
  });
  for (int r = 0; r < 4; ++r) CHECK(std::memcmp(whole[r].data(), resumed[r].data(), 3000 * sizeof(float)) == 0);
}

TEST_CASE("bf16 inside the node stays within bf16's rounding of fp32 inside the node") {
  local_group::run(4, [](local_group::communicator& world) {
    auto groups = split_nodes(world, 2);
    using reducer = hierarchical_allreducer<fp32, error_feedback::none, local_group::communicator, host_space>;
    reducer wide(fp32{}, groups, bucket_layout(5000), host_space{});
    reducer narrow(fp32{}, groups, bucket_layout(5000), host_space{}, {.bf16_within_node = true});
    auto a = random_gradient(9, world.rank(), 5000), b = a;
    wide({a.data(), a.size()});
    narrow({b.data(), b.size()});
    std::vector<double> magnitude(a.size(), 0.0);  // each rank's value rounds to bf16, and the node's sum once
    for (int r = 0; r < 4; ++r) {
      auto const g = random_gradient(9, r, 5000);
      for (std::size_t i = 0; i < g.size(); ++i) magnitude[i] += std::fabs(g[i]) / 4;
    }
    std::size_t far = 0;
    for (std::size_t i = 0; i < a.size(); ++i) far += std::fabs(a[i] - b[i]) <= 0x1.0p-7 * magnitude[i] ? 0 : 1;
    CHECK(far == 0);
    CHECK(narrow.node_bytes() < wide.node_bytes());
  });
}

TEST_CASE("a model reducer reduces every bucket in two levels") {
  std::vector<std::vector<std::size_t>> const layers = {{10, 64}, {10}, {64, 300}, {64}};
  model_reducer_options options;
  options.compressor = compressor_spec::parse("thc:block=256");
  options.min_compression_elements = 1000;
  options.bucket_cap_bytes = 4096;
  options.first_bucket_cap_bytes = 2048;  // the first matrix alone (small: bf16), then the second (THC), the biases
  std::vector<std::vector<float>> out(4);
  local_group::run(4, [&](local_group::communicator& world) {
    auto groups = split_nodes(world, 2);
    model_reducer<local_group::communicator, host_space> reducer(layers, groups, options);
    CHECK(reducer.buckets() == 3);
    for (std::size_t p = 0; p < layers.size(); ++p) {
      auto g = reducer.gradient(p);
      auto const drawn = random_gradient(11 + p, world.rank(), g.size());
      std::copy(drawn.begin(), drawn.end(), g.begin());
      reducer.mark_ready(p);
    }
    reducer.finish();
    for (std::size_t p = 0; p < layers.size(); ++p) {
      auto const g = reducer.gradient(p);
      out[world.rank()].insert(out[world.rank()].end(), g.begin(), g.end());
    }
    model_reducer_options pairs = options;                           // (each rank its own copy: the ranks are threads)
    pairs.compressor = compressor_spec::parse("topk:fraction=0.1");  // classic TopK's pairs do not sum
    using reducer_t = model_reducer<local_group::communicator, host_space>;
    CHECK_THROWS_WITH(reducer_t(layers, groups, pairs), doctest::Contains("cannot be sharded"));
  });
  for (int r = 1; r < 4; ++r) CHECK(out[r] == out[0]);
  // The biases (bf16, exact for these sums to bf16's rounding) are the mean.
  std::size_t const bias = 10 * 64;  // parameter 1 follows parameter 0 in this flat copy
  for (std::size_t i = 0; i < 10; ++i) {
    double mean = 0;
    for (int r = 0; r < 4; ++r) mean += random_gradient(12, r, 10)[i] / 4.0;
    CHECK(out[0][bias + i] == doctest::Approx(mean).epsilon(0.01).scale(1e-3));
  }
}

namespace {

// Two hierarchical allreducers, one on G buckets and one on fp32 buckets
// holding the same (widened) values, over three steps with warm-up and error
// feedback: G's result is the fp32 result rounded once to G, and the
// residuals are the same bits.
template <class G, class C>
void check_16bit_hierarchical(C const& c, int nodes, int per_node, bool bf16_within_node) {
  std::size_t const d = odd_layout(4).size();
  local_group::run(nodes * per_node, [&](local_group::communicator& world) {
    std::uint64_t const seed = shared_seed(world);
    auto groups = split_nodes(world, per_node);
    hierarchical_options const options{.reduce = {.warmup_steps = 1}, .bf16_within_node = bf16_within_node};
    hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space, G> narrow(
        c, groups, odd_layout(4), host_space{}, options);
    hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> wide(
        c, groups, odd_layout(4), host_space{}, options);
    CHECK(narrow.fingerprint() != wide.fingerprint());
    CHECK(narrow.node_bytes() < wide.node_bytes());  // the all-gather moves G
    for (int step = 0; step < 3; ++step) {
      auto const drawn = random_gradient(seed + step, world.rank(), d);
      std::vector<G> g(d);
      std::vector<float> f(d);
      for (std::size_t i = 0; i < d; ++i) {
        g[i] = G(drawn[i]);
        f[i] = static_cast<float>(g[i]);
      }
      narrow({g.data(), d});
      wide({f.data(), d});
      std::size_t differ = 0;
      for (std::size_t i = 0; i < d; ++i) {
        G const rounded(f[i]);
        differ += std::memcmp(&rounded, &g[i], sizeof(G)) == 0 ? 0 : 1;
      }
      INFO(C::name << ", " << nodes << " x " << per_node << (bf16_within_node ? ", bf16" : ", fp32")
                   << " inside the node, step " << step << ", seed " << seed);
      CHECK(differ == 0);
      CHECK(std::memcmp(narrow.residual().data(), wide.residual().data(), narrow.shard_size() * sizeof(float)) == 0);
    }
  });
}

}  // namespace

TEST_CASE("16-bit buckets reduce hierarchically to the fp32 path's mean, rounded once") {
  for (auto [nodes, per_node] : {shape{2, 2}, shape{3, 2}}) {
    for (bool bf16_within_node : {false, true}) {
      for_each_shardable([&, nodes = nodes, per_node = per_node](auto c, double) {
        check_16bit_hierarchical<bfloat16>(c, nodes, per_node, bf16_within_node);
      });
      check_16bit_hierarchical<half>(thc<>{.block = 64}, nodes, per_node, bf16_within_node);
      check_16bit_hierarchical<half>(topkc<>{.chunk_size = 32, .fraction = 0.25}, nodes, per_node, bf16_within_node);
    }
  }
}

namespace {

// Each rank's matrices are a_r u v^T + b_r w z^T (u, v, w, z shared, a_r and
// b_r its own), so the mean of every matrix has rank 2 and PowerSGD of rank 2
// recovers it up to rounding; vectors are any values (PowerSGD sends them
// whole). Deterministic in (seed, rank).
std::vector<float> rank2_gradient(bucket_layout const& layout, std::uint64_t seed, int rank) {
  std::vector<float> g(layout.size());
  auto const own = random_gradient(seed, rank, 2 + layout.size());
  for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
    auto const& info = layout.tensors()[t];
    if (info.shape.size() < 2) {
      std::copy_n(own.begin() + 2 + info.offset, info.elements, g.begin() + info.offset);
      continue;
    }
    std::size_t const rows = info.shape[0], cols = info.elements / rows;
    auto const f = random_gradient(seed ^ 0x5eedULL, static_cast<int>(t), 2 * (rows + cols));  // shared factors
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t j = 0; j < cols; ++j)
        g[info.offset + i * cols + j] =
            own[0] * f[i] * f[rows + j] + own[1] * f[rows + cols + i] * f[2 * rows + cols + j];
  }
  return g;
}

}  // namespace

TEST_CASE("PowerSGD reduces in two levels by whole tensors: the mean of rank-2 matrices, bitwise on every rank") {
  using C = powersgd<>;
  C const c{.matrix_rank = 2, .min_compression_rate = 1};
  bucket_layout many;  // more tensors than a node has ranks
  many.add({40, 30}).add({30}).add({64, 20}).add({20}).add({25, 25}).add({7, 9});
  bucket_layout const one({{48, 36}});  // one matrix: the other ranks of the node have no tensor
  for (shape const& s : shapes) {
    int const nodes = s.nodes, per_node = s.per_node;
    for (bucket_layout const* layout : std::vector<bucket_layout const*>{&many, &one}) {
      for (std::uint64_t bucket : {0, 1}) {  // which local rank takes the first run
        int const world_size = nodes * per_node;
        std::size_t const d = layout->size();
        std::vector<std::vector<float>> out(world_size);
        std::uint64_t seed = 0;
        local_group::run(world_size, [&](local_group::communicator& world) {
          std::uint64_t const shared = shared_seed(world);
          if (world.rank() == 0) seed = shared;
          auto groups = split_nodes(world, per_node);
          hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> h(
              c, groups, *layout, host_space{}, {.reduce = {.bucket = bucket}});
          auto g = rank2_gradient(*layout, shared, world.rank());
          h({g.data(), d});
          out[world.rank()] = g;
        });
        std::vector<double> exact(d, 0.0);
        for (int r = 0; r < world_size; ++r) {
          auto const g = rank2_gradient(*layout, seed, r);
          for (std::size_t i = 0; i < d; ++i) exact[i] += static_cast<double>(g[i]) / world_size;
        }
        INFO(nodes << " nodes x " << per_node << ", " << layout->tensors().size() << " tensors, bucket " << bucket
                   << ", seed " << seed);
        for (int r = 1; r < world_size; ++r) CHECK(std::memcmp(out[r].data(), out[0].data(), d * sizeof(float)) == 0);
        // (a first step's random Q is near-degenerate now and then: 1.3e-4 was
        // seen; a wrong step is off by O(1), see powersgd_suite.hpp)
        CHECK(relative_error(out[0], exact) < 1e-2);
      }
    }
  }
}

// sum_t out_t + (the nodes' residuals, each rank's at its rail_elements(),
// averaged over nodes) = sum_t mean_t: nothing is lost when shards are runs
// of whole tensors, some ranks with none.
TEST_CASE("PowerSGD in two levels: error feedback loses nothing over many steps") {
  using C = powersgd<>;
  C const c{.matrix_rank = 2, .min_compression_rate = 1};
  bucket_layout few;  // three tensors on nodes of up to three ranks
  few.add({30, 20}).add({20}).add({12, 9});
  for (shape const& s : shapes) {
    int const nodes = s.nodes, per_node = s.per_node;
    int const world_size = nodes * per_node, steps = 20;
    std::size_t const d = few.size();
    std::vector<double> sent(d, 0.0), had(d, 0.0), kept(d, 0.0);
    local_group::run(world_size, [&](local_group::communicator& world) {
      auto groups = split_nodes(world, per_node);
      hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> h(c, groups, few,
                                                                                                    host_space{});
      for (int t = 0; t < steps; ++t) {
        auto g = random_gradient(700 + t, world.rank(), d);
        h({g.data(), d});
        if (world.rank() == 0)
          for (std::size_t i = 0; i < d; ++i) sent[i] += g[i];
      }
      std::vector<float> placed(d, 0.0f), all(d * world_size);  // this rank's residual where its elements are
      auto const [first, count] = h.rail_elements();
      std::copy_n(h.residual().data(), count, placed.begin() + first);
      world.all_gather(placed.data(), all.data(), d);
      if (world.rank() == 0)
        for (int r = 0; r < world_size; ++r)
          for (std::size_t i = 0; i < d; ++i) kept[i] += all[r * d + i] / static_cast<double>(nodes);
    });
    for (int t = 0; t < steps; ++t)
      for (int r = 0; r < world_size; ++r) {
        auto const g = random_gradient(700 + t, r, d);
        for (std::size_t i = 0; i < d; ++i) had[i] += static_cast<double>(g[i]) / world_size;
      }
    double worst = 0, scale = 0, residual = 0;
    for (std::size_t i = 0; i < d; ++i) {
      worst = std::max(worst, std::fabs(sent[i] + kept[i] - had[i]));
      scale = std::max(scale, std::fabs(had[i]));
      residual = std::max(residual, std::fabs(kept[i]));
    }
    INFO(nodes << " nodes x " << per_node << ": worst " << worst << " of " << scale << ", residual up to " << residual);
    CHECK(residual > 0.01 * scale);  // rank 2 leaves a residual: the check below has something to add
    CHECK(worst <= 64 * steps * 0x1.0p-18 * (scale + 1));
  }
}

// An empty bucket (a frozen layer, tensors of size zero) is valid flat, so it
// is valid in two levels too: its steps commit and its checkpoint restores.
// (It was refused at construction.)
TEST_CASE("an empty bucket is valid in two levels: steps commit, checkpoints restore") {
  for_each_compressor([](auto c, double) {
    using C = decltype(c);
    if constexpr (detail::shards_in_two_levels<C>) {
      for (bucket_layout const& empty : {bucket_layout(0), [] {
                                           bucket_layout l;
                                           l.add({0});
                                           l.add({4, 0});
                                           return l;
                                         }()}) {
        local_group::run(4, [&](local_group::communicator& world) {
          auto groups = split_nodes(world, 2);
          INFO(C::name);
          hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> h(
              c, groups, empty, host_space{});
          for (int step = 0; step < 3; ++step) h(span<float>{});
          CHECK(h.steps() == 3);
          auto const saved = h.save();
          h(span<float>{});
          h.restore(span<std::byte const>(saved.data(), saved.size()));
          CHECK(h.steps() == 3);
          if constexpr (detail::shards_by_elements<C>) {
            hierarchical_reduce_scatterer<C, error_feedback::none, local_group::communicator, host_space> s(
                c, groups, empty, host_space{});
            CHECK(s.shard_size() == 0);
            for (int step = 0; step < 2; ++step) s(span<float>{}, span<float>{});
            CHECK(s.steps() == 2);
          }
        });
      }
    }
  });
}

TEST_CASE("a model with a tensor of size zero (a bucket of its own) reduces over node groups") {
  std::vector<std::vector<std::size_t>> const shapes = {{10, 64}, {0}, {64, 128}};
  local_group::run(4, [&](local_group::communicator& world) {
    auto groups = split_nodes(world, 2);
    model_reducer_options options;
    options.compressor = compressor_spec::parse("fp32");
    model_reducer<local_group::communicator, host_space> reducer(shapes, groups, options);
    for (int step = 0; step < 2; ++step) {
      for (std::size_t p = 0; p < shapes.size(); ++p) {
        auto g = reducer.gradient(p);
        for (std::size_t i = 0; i < g.size(); ++i) g.data()[i] = static_cast<float>(world.rank() + 1);
        reducer.mark_ready(p);
      }
      reducer.finish();
      for (std::size_t p : {0, 2}) {
        auto const g = reducer.gradient(p);
        CHECK(std::all_of(g.data(), g.data() + g.size(), [](float x) { return x == 2.5f; }));  // the mean of 1..4
      }
    }
  });
}
