// The host code paths that exist only for a vector instruction set, built
// for x86-64-v3 (AVX2, F16C) and again for x86-64-v4 (AVX-512; the unit tests
// are built for the baseline ISA), against the portable paths, bit for bit:
// the runs of 16-bit conversions (detail/convert.hpp) over every half and
// floats around every rounding boundary, NaN and infinity included; THC's
// rotation in registers over every block size and stage count; Philox in
// vector lanes (detail/philox_lanes.hpp); two-scale QSGD's units in float
// (with a fused multiply-add) against its units in double. Skipped (77) on a
// CPU without the build's instruction set: isa_launcher checks the CPU before
// this binary starts.
#define DOCTEST_CONFIG_IMPLEMENT
#include <gradcomp/compressors/qsgd_multiscale/qsgd_multiscale.hpp>
#include <gradcomp/compressors/thc/blocks.hpp>
#include <gradcomp/detail/convert.hpp>
#include <gradcomp/random.hpp>

#include <doctest/doctest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

using gradcomp::bfloat16;
using gradcomp::half;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Floats whose low 13 bits sit at, beside and between the rounding points of
// both 16-bit types, for every sign, exponent and top 10 mantissa bits, plus
// random ones: the runs start at odd offsets, so the vector loops' tails run.
std::vector<float> probe_floats() {
  std::vector<float> out;
  std::mt19937 rng(7);
  for (std::uint32_t high = 0; high < (1u << 19); ++high)
    for (std::uint32_t low :
         {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, static_cast<std::uint32_t>(rng() & 0x1fffu)}) {
      std::uint32_t const u = (high << 13) | low;
      float f;
      std::memcpy(&f, &u, 4);
      out.push_back(f);
    }
  return out;
}

template <class T>
void check_narrow(std::vector<float> const& in) {
  std::vector<T> fast(in.size() + 3), portable(in.size() + 3);
  for (std::size_t offset : {0u, 3u}) {
    gradcomp::detail::narrow_run(in.data() + offset, fast.data(), in.size() - offset);
    for (std::size_t k = 0; k + offset < in.size(); ++k) portable[k] = T(in[k + offset]);
    REQUIRE(std::memcmp(fast.data(), portable.data(), (in.size() - offset) * sizeof(T)) == 0);
  }
}

}  // namespace

TEST_CASE("16-bit runs convert bit for bit as the portable conversions") {
  auto const floats = probe_floats();
  check_narrow<half>(floats);
  check_narrow<bfloat16>(floats);
  std::vector<half> halves(1u << 16);
  for (std::uint32_t h = 0; h < halves.size(); ++h) halves[h].bits = static_cast<std::uint16_t>(h);
  std::vector<float> fast(halves.size());
  gradcomp::detail::widen_run(halves.data() + 1, fast.data(), halves.size() - 1);  // (an odd start)
  for (std::uint32_t h = 1; h < halves.size(); ++h)
    REQUIRE(bits_of(fast[h - 1]) == bits_of(static_cast<float>(halves[h])));
  std::vector<bfloat16> brains(1u << 16);
  for (std::uint32_t h = 0; h < brains.size(); ++h) brains[h].bits = static_cast<std::uint16_t>(h);
  gradcomp::detail::widen_run(brains.data(), fast.data(), brains.size());
  for (std::uint32_t h = 0; h < brains.size(); ++h) REQUIRE(bits_of(fast[h]) == bits_of(static_cast<float>(brains[h])));
}

TEST_CASE("THC's rotation in registers gives the bits of the butterflies pair by pair") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (std::size_t block = 64; block <= 4096; block *= 2) {
    int const log2 = std::countr_zero(block);
    for (int stages = 0; stages <= log2; ++stages) {
      INFO("block " << block << ", stages " << stages);
      std::vector<float> x(block);
      for (auto& v : x) v = normal(rng);
      std::vector<float> fast = x, pairs = x, pairwise = x;
      gradcomp::detail::host_rotate(fast.data(), block, stages);
      gradcomp::detail::host_rotate_pairs(pairs.data(), block, stages);
      for (int s = 0; s < stages; ++s)
        for (std::size_t q = 0; q < block / 2; ++q) gradcomp::detail::thc_butterfly(pairwise.data(), q, s);
      CHECK(std::memcmp(fast.data(), pairwise.data(), block * sizeof(float)) == 0);
      CHECK(std::memcmp(pairs.data(), pairwise.data(), block * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("Philox in vector lanes gives the scalar function's words") {
  static_assert(GRADCOMP_HOST_PHILOX_LANES > 0, "built for AVX2 or AVX-512");
  std::mt19937_64 rng(5);
  // Runs that start anywhere, end in a partial group, and cross 2^32 (where
  // the counter's high word changes inside a group).
  for (std::uint64_t first : {std::uint64_t{0}, std::uint64_t{3}, (std::uint64_t{1} << 32) - 5,
                              (std::uint64_t{1} << 32) - 64, std::uint64_t{0x0123456789ab}, rng()}) {
    gradcomp::random_stream const stream(rng(), static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng()));
    for (std::size_t count : {std::size_t{1}, std::size_t{31}, std::size_t{32}, std::size_t{33}, std::size_t{200}}) {
      INFO("first " << first << ", count " << count);
      std::vector<gradcomp::uint4x32> lanes(count + 1), scalar(count + 1);
      lanes[count].v[0] = scalar[count].v[0] = 0xdeadbeef;  // (nothing written past the run)
      stream.blocks(first, count, lanes.data());
      for (std::size_t k = 0; k < count; ++k) scalar[k] = stream(first + k);
      CHECK(std::memcmp(lanes.data(), scalar.data(), (count + 1) * sizeof(gradcomp::uint4x32)) == 0);
    }
  }
}

// Over norms across float's range (and below it, where the units are not
// floats and the step keeps them in double), scale sets and rank counts, and
// values from far below a unit to beyond the largest code (clamped), random
// bit patterns among them: the encode pass gives the same codes and
// residuals, the decode pass the same values, whichever type holds the units.
TEST_CASE("two-scale QSGD's units in float give the bits of its units in double") {
  using namespace gradcomp;
  static_assert(detail::host_fused_multiply_add, "built for a target with FMA");
  std::mt19937_64 rng(13);
  std::size_t const n = 4096 + 3;  // whole chunks and a tail
  int in_float = 0, in_double = 0;
  for (int trial = 0; trial < 300; ++trial) {
    int const ranks = 1 + trial % 8;
    qsgd_multiscale const c{.bits = trial % 2 == 0 ? std::array{6, 10, 0, 0} : std::array{2, 5, 7, 12}};
    detail::multiscale_scales const m = c.scales_for(ranks);
    double const norm = std::exp(std::uniform_real_distribution<double>(-105.0, 88.0)(rng));  // 2.5e-46 to 1.7e38
    detail::multiscale_factors const f = detail::multiscale_factors::of(m, norm * norm);
    bool const floats = f.float_units;
    for (int j = 0; j < m.count; ++j)
      CHECK(floats <= (static_cast<double>(static_cast<float>(f.unit[j])) == f.unit[j]));
    if (!floats) {
      ++in_double;
      continue;
    }
    ++in_float;
    std::vector<float> g(n), e(n), u(n);
    std::vector<std::uint8_t> index(n);
    std::vector<std::int8_t> sums(n);
    for (std::size_t k = 0; k < n; ++k) {
      double const relative = std::exp(std::uniform_real_distribution<double>(-80.0, 1.0)(rng));
      g[k] = static_cast<float>((rng() & 1 ? norm : -norm) * relative);
      e[k] = k % 3 == 0 ? 0.0f : g[k] * std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
      if (k % 11 == 0) g[k] = std::bit_cast<float>(static_cast<std::uint32_t>(rng()) & 0xf7ffffffu);  // finite
      if (!std::isfinite(g[k] + e[k])) g[k] = e[k] = 0.0f;
      u[k] = static_cast<float>(rng() >> 40) * 0x1p-24f;
      index[k] = static_cast<std::uint8_t>(rng() % static_cast<unsigned>(m.count));
      sums[k] = static_cast<std::int8_t>(static_cast<int>(rng() % 255) - 127);
    }
    auto encode = [&](auto op) {
      std::vector<std::int8_t> codes(n, 99);
      std::vector<float> next(n, -7.0f);
      transform(host_space{}, n, inputs(g.data(), e.data(), index.data(), u.data()), outputs(codes.data(), next.data()),
                op);
      return std::pair{codes, next};
    };
    auto decode = [&](auto op) {
      std::vector<float> out(n, -7.0f);
      transform(host_space{}, n, inputs(sums.data(), index.data()), outputs(out.data()), op);
      return out;
    };
    auto const [codes_f, next_f] = encode(detail::multiscale_encode<true>{&f, m.share});
    auto const [codes_d, next_d] = encode(detail::multiscale_encode<false>{&f, m.share});
    auto const out_f = decode(detail::multiscale_decode<true>{&f});
    auto const out_d = decode(detail::multiscale_decode<false>{&f});
    INFO("trial " << trial << ", norm " << norm << ", " << ranks << " ranks");
    CHECK(codes_f == codes_d);
    CHECK(std::memcmp(next_f.data(), next_d.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(out_f.data(), out_d.data(), n * sizeof(float)) == 0);
  }
  CHECK(in_float > 200);  // most norms are in float's range
  CHECK(in_double > 0);   // the tiniest are not
}

// The CPU check is isa_launcher's (a baseline binary): by the time main runs
// here, static initializers built for this ISA have run already.
static_assert(GRADCOMP_HOST_F16C, "built for x86-64-v3 or above");

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  return context.run();
}
