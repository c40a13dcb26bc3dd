// Test bodies for TopK-Chunked and classic TopK, instantiated per setup.
#pragma once

#include "baseline_suite.hpp"

#include <algorithm>
#include <numeric>

namespace gradcomp::testing {

/// Host copy of top_k's contract: the `count` largest keys, ties to
/// the lower index, in index order. Brute force: a full sort.
inline std::vector<std::uint32_t> reference_top(std::vector<std::uint32_t> const& keys, std::size_t count) {
  std::vector<std::uint32_t> order(keys.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return keys[a] > keys[b]; });
  order.resize(std::min(count, keys.size()));
  std::sort(order.begin(), order.end());
  return order;
}

struct key_array {
  std::uint32_t const* keys;
  GRADCOMP_HOST_DEVICE std::uint32_t operator()(std::size_t i) const { return keys[i]; }
};
struct record_selection {
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i, std::size_t r) const { out[r] = static_cast<std::uint32_t>(i); }
};

/// Runs top_k in `space` on host keys (poisoned output: every slot must be written).
template <class Space>
std::vector<std::uint32_t> select_in(Space const& space, std::vector<std::uint32_t> const& keys, std::size_t count) {
  using memory = typename Space::memory;
  buffer<std::byte, Space> scratch(top_k_scratch_bytes<memory>(keys.size()), space);
  auto const device_keys = upload(space, keys);
  std::size_t const selected = std::min(count, keys.size());
  auto out = upload(space, std::vector<std::uint32_t>(std::max<std::size_t>(selected, 1), 0xdeadbeefu));
  top_k(space, keys.size(), count, key_array{device_keys.data()}, record_selection{out.data()}, scratch.view());
  return download(space, out.data(), selected);
}

/// Gradients whose chunk norms are well apart (so float and double agree on
/// the order), with some chunks exact copies of others (exact score ties).
inline std::vector<std::vector<float>> chunky_gradients(std::uint64_t seed, int ranks, std::size_t d,
                                                        std::size_t chunk) {
  std::size_t const m = (d + chunk - 1) / chunk;
  std::mt19937_64 rng(seed);
  std::vector<double> scale(m);
  for (std::size_t j = 0; j < m; ++j) scale[j] = std::pow(1.05, static_cast<double>(j % 97)) * (1 + j / 97);
  std::shuffle(scale.begin(), scale.end(), rng);
  auto grads = random_gradients(seed, ranks, d);
  for (auto& g : grads) {
    for (std::size_t i = 0; i < d; ++i) g[i] = static_cast<float>(scale[i / chunk]) * (g[i] < 0 ? -1.0f : 1.0f);
    for (std::size_t j = 1; j + 2 < m; j += 5)  // chunk j + 1 copies chunk j: a tie the lower index must win
      std::copy_n(g.begin() + j * chunk, chunk, g.begin() + (j + 1) * chunk);
  }
  return grads;
}

/// The chunks TopK-Chunked must pick, from scores summed in double.
inline std::vector<std::uint32_t> reference_chunks(std::vector<std::vector<float>> const& grads, std::size_t chunk,
                                                   std::size_t kept) {
  std::size_t const d = grads[0].size(), m = (d + chunk - 1) / chunk;
  std::vector<double> score(m, 0.0);
  for (auto const& g : grads)
    for (std::size_t i = 0; i < d; ++i) score[i / chunk] += static_cast<double>(g[i]) * g[i];
  std::vector<std::uint32_t> keys(m);
  for (std::size_t j = 0; j < m; ++j) keys[j] = detail::float_bits(static_cast<float>(score[j]));
  return reference_top(keys, kept);
}

}  // namespace gradcomp::testing

TEST_CASE_TEMPLATE_DEFINE("top_k equals a brute-force sort, ties to the lower index", Space, select_matches) {
  using namespace gradcomp::testing;
  std::mt19937 rng(std::random_device{}());
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{5000}, std::size_t{300001}}) {
    // Few distinct keys (many ties), any keys, and gradient magnitudes (the
    // float bits of |normal| values, some repeated: ties near the threshold).
    for (std::uint32_t range : {4u, 1000u, 0xffffffffu, 0u}) {
      std::vector<std::uint32_t> keys(n);
      std::normal_distribution<float> normal;
      for (auto& k : keys)
        k = range == 0xffffffffu ? rng()
            : range == 0         ? gradcomp::detail::float_bits(std::fabs(normal(rng)))
                                 : rng() % range * 65599u;
      if (range == 0)
        for (std::size_t i = 7; i < n; i += 11) keys[i] = keys[i - 7];
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, n / 100, n / 20, n / 3, n - n / 100, n}) {
        INFO("n " << n << ", range " << range << ", count " << count);
        CHECK(select_in(Space{}, keys, count) == reference_top(keys, count));
      }
    }
  }
}

// Four ranks; every rank must pick the reference chunks, return bitwise the
// same vector, the mean (float values pre-scaled by 1/n, summed in rank
// order) in those chunks and zeros elsewhere; across sizes that leave a short
// tail chunk, K = 0 and K = all.
TEST_CASE_TEMPLATE_DEFINE("TopK-Chunked picks the reference chunks and returns their mean", Setup, topkc_mean) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    int const n = comm.size();
    for (std::size_t d : {std::size_t{64 * 50}, std::size_t{64 * 50 + 17}, std::size_t{5}}) {
      std::size_t const m = (d + 63) / 64;
      for (std::size_t kept : {std::size_t{0}, std::size_t{1}, m / 4, m}) {
        topkc<float, float> const compressor{.chunk_size = 64, .chunks = kept};
        auto const grads = chunky_gradients(seed + d, n, d, 64);
        allreducer<topkc<float, float>, error_feedback::residual, collective_t, allreduce_aggregator,
                   typename Setup::space>
            reduce(compressor, comm, bucket_layout(d), space);
        auto g = upload(space, grads[comm.rank()]);
        reduce(g.view());
        auto const out = download(space, g.data(), d);

        auto const chosen = reference_chunks(grads, 64, kept);
        std::vector<char> in_chosen(m, 0);
        for (auto j : chosen) in_chosen[j] = 1;
        std::size_t wrong = 0;
        float const inverse = 1.0f / static_cast<float>(n);
        for (std::size_t i = 0; i < d; ++i) {
          float sum = grads[0][i] * inverse;
          for (int r = 1; r < n; ++r) sum += grads[r][i] * inverse;
          float const expected = in_chosen[i / 64] ? sum : 0.0f;
          bool const local = std::is_same_v<typename Setup::world, local_world>;
          wrong += (local ? same_bits(out[i], expected) : std::fabs(out[i] - expected) <= 1e-6f * std::fabs(expected))
                       ? 0
                       : 1;
        }
        bool const identical = same_as_rank0(comm, out);
        INFO("seed " << seed << ", d " << d << ", K " << kept << ", rank " << comm.rank());
        CHECK(wrong == 0);
        CHECK(identical);
        CHECK(reduce.wire_bytes() == m * 4 + kept * 64 * 4 + 8);
      }
    }
  });
}

// Classic TopK: each rank's k largest |g + e| (ties to the lower index),
// all-gathered as W(value x fl(1/n)), added rank by rank.
TEST_CASE_TEMPLATE_DEFINE("TopK returns the reference sparse mean", Setup, topk_mean) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    int const n = comm.size();
    // (150001: several runs of the host's zero-and-add pass, and threads)
    for (std::size_t d : {std::size_t{20000}, std::size_t{150001}}) {
      auto grads = random_gradients(seed, n, d);
      for (auto& g : grads)
        for (std::size_t i = 0; i < d; i += 7) g[i] = std::round(g[i] * 4) / 4;  // ties in magnitude
      for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{200}, d / 100, d}) {
        allreducer<topk<bfloat16>, error_feedback::residual, collective_t, allgather_aggregator, typename Setup::space>
            reduce(topk<bfloat16>{.k = k}, comm, bucket_layout(d), space);
        auto g = upload(space, grads[comm.rank()]);
        reduce(g.view());
        auto const out = download(space, g.data(), d);
        auto const residual = download(space, reduce.residual().data(), d);

        std::vector<float> expected(d, 0.0f);
        std::vector<std::uint32_t> mine;
        float const inverse = 1.0f / static_cast<float>(n);
        for (int r = 0; r < n; ++r) {
          std::vector<std::uint32_t> keys(d);
          for (std::size_t i = 0; i < d; ++i) keys[i] = gradcomp::detail::float_bits(grads[r][i]) & 0x7fffffffu;
          auto const top = reference_top(keys, k);
          for (auto i : top) expected[i] += static_cast<float>(bfloat16(grads[r][i] * inverse));
          if (r == comm.rank()) mine = top;
        }
        std::vector<char> sent(d, 0);
        for (auto i : mine) sent[i] = 1;
        std::size_t wrong_out = 0, wrong_residual = 0;
        for (std::size_t i = 0; i < d; ++i) {
          float const acc = grads[comm.rank()][i] + 0.0f;  // g + e with e = 0 (turns -0 into +0)
          wrong_out += same_bits(out[i], expected[i]) ? 0 : 1;
          float const kept = static_cast<float>(static_cast<double>(acc) -
                                                static_cast<double>(static_cast<float>(bfloat16(acc * inverse))) * n);
          wrong_residual += same_bits(residual[i], sent[i] ? kept : acc) ? 0 : 1;
        }
        INFO("seed " << seed << ", d " << d << ", k " << k << ", rank " << comm.rank());
        CHECK(wrong_out == 0);
        CHECK(wrong_residual == 0);
        CHECK(reduce.wire_bytes() == k * 6 * n + 8);  // grows with n: the all-gather
      }
    }
  });
}

// One rank, many steps: whatever is sent plus what is kept equals what there
// was, bit for bit: output_t + e_{t+1} == g_t + e_t.
TEST_CASE_TEMPLATE_DEFINE("sparsifiers conserve every step's mass", Space, sparse_conserves) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = 4096 + 33;
    auto check = [&](auto compressor, std::string const& name) {
      allreducer<decltype(compressor), error_feedback::residual, local_group::communicator,
                 default_aggregator_t<decltype(compressor)>, Space>
          reduce(compressor, comm, bucket_layout(d), space);
      std::vector<float> residual(d, 0.0f);
      std::size_t violations = 0, sent_total = 0;
      for (int step = 0; step < 30; ++step) {
        auto const g = random_gradient(seed + step, 0, d);
        auto device = upload(space, g);
        reduce(device.view());
        auto const out = download(space, device.data(), d);
        auto const next = download(space, reduce.residual().data(), d);
        for (std::size_t i = 0; i < d; ++i) {
          violations += out[i] + next[i] == g[i] + residual[i] ? 0 : 1;
          sent_total += out[i] != 0.0f;
        }
        residual = next;
      }
      INFO(name << ", seed " << seed);
      CHECK(violations == 0);
      CHECK(sent_total > 0);
    };
    check(topkc<>{.chunk_size = 32, .fraction = 0.05}, "topkc bf16");
    check(topkc<float, float>{.chunk_size = 64, .fraction = 0.1}, "topkc fp32");
    check(topk<bfloat16>{.fraction = 0.02}, "topk bf16");
    check(topk<float>{.fraction = 0.02}, "topk fp32");
  });
}

// Bad parameters and bad values: clear errors, on every rank.
TEST_CASE_TEMPLATE_DEFINE("sparsifiers reject bad parameters and non-finite gradients", Setup, sparse_bad_input) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    using space_t = typename Setup::space;
    auto const space = Setup::make_space();
    auto make_topkc = [&](topkc<> c, std::size_t d) {
      allreducer<topkc<>, error_feedback::residual, collective_t, allreduce_aggregator, space_t> r(
          c, comm, bucket_layout(d), space);
    };
    CHECK_THROWS_WITH_AS(make_topkc({.chunk_size = 48}, 1000), doctest::Contains("not a power of two"),
                         invalid_argument);
    CHECK_THROWS_WITH_AS(make_topkc({.fraction = 0.0}, 1000), doctest::Contains("(0, 1]"), invalid_argument);
    CHECK_THROWS_WITH_AS(make_topkc({.fraction = 1.5}, 1000), doctest::Contains("(0, 1]"), invalid_argument);
    CHECK_THROWS_WITH_AS(make_topkc({.chunk_size = 256, .chunks = 5}, 1000), doctest::Contains("has only 4 chunks"),
                         invalid_argument);
    auto make_topk = [&](topk<> c, std::size_t d) {
      allreducer<topk<>, error_feedback::residual, collective_t, allgather_aggregator, space_t> r(
          c, comm, bucket_layout(d), space);
    };
    CHECK_THROWS_WITH_AS(make_topk({.k = 1001}, 1000), doctest::Contains("larger than the bucket"), invalid_argument);
    CHECK_THROWS_WITH_AS(make_topk({.fraction = -0.1}, 1000), doctest::Contains("(0, 1]"), invalid_argument);
    CHECK_THROWS_WITH_AS(make_topkc({}, comm.rank() == 1 ? 1000 : 1024), doctest::Contains("bucket size"),
                         invalid_argument);

    std::size_t const d = 2048;
    allreducer<topkc<>, error_feedback::residual, collective_t, allreduce_aggregator, space_t> chunked(
        topkc<>{.chunk_size = 64}, comm, bucket_layout(d), space);
    allreducer<topk<>, error_feedback::residual, collective_t, allgather_aggregator, space_t> classic(
        topk<>{}, comm, bucket_layout(d), space);
    auto g = random_gradient(7, comm.rank(), d);
    if (comm.rank() == comm.size() - 1) g[100] = std::numeric_limits<float>::infinity();
    auto a = upload(space, g);
    auto b = upload(space, g);
    CHECK_THROWS_AS(settled_step(chunked, a.view()), nonfinite_error);
    CHECK_THROWS_AS(settled_step(classic, b.view()), nonfinite_error);
    auto const unchanged = download(space, a.data(), d);
    CHECK(std::memcmp(unchanged.data(), g.data(), d * sizeof(float)) == 0);
    auto const residual = download(space, chunked.residual().data(), d);
    CHECK(std::all_of(residual.begin(), residual.end(), [](float e) { return e == 0.0f; }));
  });
}
