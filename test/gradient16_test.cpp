// 16-bit gradients: every compressor reads a bfloat16 or half bucket as it is
// stored and writes the mean back in that type, with an fp32 residual. Fed
// the same values, a 16-bit bucket must end as the fp32 bucket's result
// rounded once to 16 bits, with bitwise the same residual, on every rank.
#include "common/compressors.hpp"
#include "common/harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

// x's distance from y in units of G's last place at `magnitude` (y's unless
// given).
template <class G>
double ulps(float x, float y, float magnitude = 0) {
  if (magnitude == 0) magnitude = y;
  int exponent = 0;
  (void)std::frexp(std::fabs(magnitude) > 0 ? magnitude : 1.0f, &exponent);
  double const place = std::ldexp(1.0, exponent - (std::is_same_v<G, bfloat16> ? 8 : 11));
  return std::fabs(static_cast<double>(x) - y) / place;
}

template <class G, class C>
void check_against_fp32(C const& c, int ranks) {
  using reducer = host_reducer<C, error_feedback::residual, local_group::communicator>;
  local_group::run(ranks, [&](local_group::communicator& comm) {
    std::uint64_t const seed = shared_seed(comm);
    reducer wide(c, comm, odd_layout(3), host_space{});
    reducer narrow(c, comm, odd_layout(3), host_space{});
    std::size_t const d = wide.layout().size();
    int const n = comm.size();
    for (int step = 0; step < 3; ++step) {
      auto const drawn = random_gradient(seed + step, comm.rank(), d);
      std::vector<G> g16(d);
      std::vector<float> g32(d);
      for (std::size_t i = 0; i < d; ++i) {
        g16[i] = G(drawn[i]);
        g32[i] = static_cast<float>(g16[i]);  // the same values in both buckets
      }
      // What each rank sends (gradient and residual) bounds the partial sums
      // classic TopK rounds to 16 bits: sum over ranks of |acc| / n.
      std::vector<float> acc(d), every(d * static_cast<std::size_t>(n)), partial(d, 0.0f);
      auto const before = narrow.residual();
      for (std::size_t i = 0; i < d; ++i) acc[i] = std::fabs(g32[i] + before[i]) / static_cast<float>(n);
      comm.all_gather(acc.data(), every.data(), d);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < d; ++i) partial[i] += every[r * d + i];
      wide(span<float>(g32.data(), d));
      narrow(span<G>(g16.data(), d));
      INFO(C::name << " in " << (std::is_same_v<G, bfloat16> ? "bf16" : "fp16") << ", step " << step << ", seed "
                   << seed);
      // Classic TopK adds the ranks' pairs into the gradient one by one, so a
      // 16-bit bucket rounds once per rank that chose an element, each at its
      // partial sum's magnitude (which cancellation can leave above the mean's).
      bool const exact = !std::is_same_v<C, topk<bfloat16>>;
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < d; ++i) {
        float const magnitude = std::max(std::fabs(g32[i]), partial[i]);
        bool const ok = exact ? G(g32[i]).bits == g16[i].bits
                              : ulps<G>(static_cast<float>(g16[i]), g32[i], magnitude) <= 0.5 * ranks + 1e-9;
        wrong += ok ? 0 : 1;
      }
      CHECK(wrong == 0);
      auto const r32 = wide.residual(), r16 = narrow.residual();
      CHECK(std::memcmp(r32.data(), r16.data(), d * sizeof(float)) == 0);
      CHECK(narrow.steps() == wide.steps());
    }
  });
}

}  // namespace

TEST_CASE("16-bit gradients: every compressor, bf16 and fp16 storage against fp32 storage of the same values") {
  for_each_compressor([&](auto c, double) {
    check_against_fp32<bfloat16>(c, 4);
    check_against_fp32<half>(c, 3);
  });
}

TEST_CASE("16-bit gradients: ranks end bitwise identical, and warm-up writes the 16-bit mean") {
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    int const ranks = 4;
    std::vector<std::vector<std::uint16_t>> bits(ranks);
    local_group::run(ranks, [&](local_group::communicator& comm) {
      std::uint64_t const seed = shared_seed(comm);
      host_reducer<C, error_feedback::residual, local_group::communicator> reduce(c, comm, odd_layout(2), host_space{},
                                                                                  {.warmup_steps = 1});
      std::size_t const d = reduce.layout().size();
      for (int step = 0; step < 3; ++step) {
        auto const drawn = random_gradient(seed + step, comm.rank(), d);
        std::vector<bfloat16> g(d);
        for (std::size_t i = 0; i < d; ++i) g[i] = bfloat16(drawn[i]);
        if (step == 0) {  // warm-up: the plain fp32 mean of the stored values, rounded once
          std::vector<float> mean(d, 0.0f);
          for (int r = 0; r < ranks; ++r) {
            auto const other = random_gradient(seed + step, r, d);
            for (std::size_t i = 0; i < d; ++i) mean[i] += static_cast<float>(bfloat16(other[i])) / ranks;
          }
          reduce(span<bfloat16>(g.data(), d));
          std::size_t far = 0;
          for (std::size_t i = 0; i < d; ++i) far += ulps<bfloat16>(static_cast<float>(g[i]), mean[i]) <= 1.0 ? 0 : 1;
          INFO(C::name << ": warm-up step, seed " << seed);
          CHECK(far == 0);
          continue;
        }
        reduce(span<bfloat16>(g.data(), d));
        bits[comm.rank()].resize(d);
        for (std::size_t i = 0; i < d; ++i) bits[comm.rank()][i] = g[i].bits;
      }
    });
    INFO(C::name);
    for (int r = 1; r < ranks; ++r) CHECK(bits[r] == bits[0]);
  });
}
