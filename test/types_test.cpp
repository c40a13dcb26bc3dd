// 16-bit conversions and the Philox generator against independent references.
#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/random.hpp>
#include <gradcomp/types.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <vector>

using gradcomp::bfloat16;
using gradcomp::half;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint32_t to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Round to nearest even by comparing the distances to the two bf16
// neighbours in double: a different algorithm from the library's bit trick.
// Past the largest finite bf16 the upper neighbour is 2^128, as IEEE rounding
// to infinity implies.
std::uint16_t reference_bf16(float f) {
  std::uint32_t const u = to_bits(f);
  if (std::isinf(f)) return static_cast<std::uint16_t>(u >> 16);
  std::uint32_t const down = u & 0xffff0000u;  // toward zero
  std::uint32_t const up = down + 0x10000u;    // away from zero
  double const up_value = (up & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), f) : from_bits(up);
  double const below = std::fabs(static_cast<double>(f) - from_bits(down));
  double const above = std::fabs(up_value - f);
  std::uint32_t const chosen = below < above ? down : above < below ? up : (((down >> 16) & 1u) ? up : down);
  return static_cast<std::uint16_t>(chosen >> 16);
}

std::vector<float> interesting_floats() {
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               65504.0f,
                               65519.0f,
                               65520.0f,
                               65536.0f,
                               1e-8f,
                               -1e-8f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(),
                               std::numeric_limits<float>::min(),
                               5.960464477539063e-08f,
                               2.980232238769531e-08f,
                               6.097555160522461e-05f,
                               6.103515625e-05f};
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) values.push_back(from_bits(rng()));
  return values;
}

std::uint64_t words64(gradcomp::uint4x32 w) { return (static_cast<std::uint64_t>(w.v[0]) << 32) | w.v[1]; }

}  // namespace

TEST_CASE("bf16 rounds to nearest even like an independent reference") {
  std::size_t mismatches = 0;
  for (float f : interesting_floats()) {
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(bfloat16(f))));
      continue;
    }
    mismatches += bfloat16(f).bits == reference_bf16(f) ? 0 : 1;
  }
  CHECK(mismatches == 0);
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {  // widening is exact
    bfloat16 h;
    h.bits = static_cast<std::uint16_t>(b);
    float const f = static_cast<float>(h);
    if (!std::isnan(f)) CHECK(bfloat16(f).bits == h.bits);
  }
}

#if defined(__FLT16_MANT_DIG__)  // the compiler has _Float16 (GCC on x86-64; not clang 14)
TEST_CASE("fp16 conversions match the compiler's _Float16 bit for bit") {
  std::size_t mismatches = 0;
  for (float f : interesting_floats()) {
    _Float16 const reference = static_cast<_Float16>(f);
    std::uint16_t reference_bits;
    std::memcpy(&reference_bits, &reference, 2);
    if (std::isnan(f))
      mismatches += std::isnan(static_cast<float>(half(f))) ? 0 : 1;
    else
      mismatches += half(f).bits == reference_bits ? 0 : 1;
  }
  CHECK(mismatches == 0);
  mismatches = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    std::uint16_t const bits = static_cast<std::uint16_t>(b);
    _Float16 reference;
    std::memcpy(&reference, &bits, 2);
    half h;
    h.bits = bits;
    float const mine = static_cast<float>(h), theirs = static_cast<float>(reference);
    mismatches += (std::isnan(mine) && std::isnan(theirs)) || to_bits(mine) == to_bits(theirs) ? 0 : 1;
  }
  CHECK(mismatches == 0);
}
#endif

TEST_CASE("Philox4x32-10 reproduces the Random123 known-answer vectors") {
  struct kat {
    gradcomp::uint4x32 counter;
    gradcomp::uint2x32 key;
    gradcomp::uint4x32 expected;
  };
  kat const vectors[] = {
      {{{0, 0, 0, 0}}, {{0, 0}}, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {{0xffffffffu, 0xffffffffu}},
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {{0xa4093822u, 0x299f31d0u}},
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (auto const& v : vectors) {
    auto const out = gradcomp::philox4x32_10(v.counter, v.key);
    for (int w = 0; w < 4; ++w) CHECK(out.v[w] == v.expected.v[w]);
  }
}

TEST_CASE("random streams are keyed by seed, step and stream, and counted by index") {
  gradcomp::random_stream const a(42, 7, 0), again(42, 7, 0), other_rank(42, 7, 1), other_step(42, 8, 0),
      shared(42, 7, gradcomp::random_stream::shared);
  // The stream is the Philox function with key = seed, counter = (index, step, stream).
  auto const direct = gradcomp::philox4x32_10({{5, 0, 7, 0}}, {{42, 0}});
  CHECK(a(5).v[0] == direct.v[0]);
  CHECK(a(5).v[3] == direct.v[3]);
  std::set<std::uint64_t> distinct;  // 64-bit words: no birthday collisions to expect
  double sum = 0;
  int const draws = 100000;
  for (int i = 0; i < draws; ++i) {
    CHECK(a(i).v[1] == again(i).v[1]);
    distinct.insert(words64(a(i)));
    distinct.insert(words64(other_rank(i)));
    distinct.insert(words64(other_step(i)));
    distinct.insert(words64(shared(i)));
    float const u = a.uniform(i);
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    sum += u;
  }
  CHECK(distinct.size() == 4u * draws);  // four streams that do not overlap
  CHECK(sum / draws == doctest::Approx(0.5).epsilon(0.01));
}

TEST_CASE("bucket layouts pack tensors back to back and fingerprint their shapes") {
  gradcomp::bucket_layout layout;
  layout.add({64, 3, 3, 3}).add({64}).add({}).add({10, 0});
  REQUIRE(layout.tensors().size() == 4);
  CHECK(layout.size() == 64 * 27 + 64 + 1 + 0);
  auto const& conv = layout.tensors()[0];
  CHECK(conv.offset == 0);
  CHECK(conv.rows() == 64);
  CHECK(conv.cols() == 27);  // PyTorch's view(shape[0], -1)
  CHECK_FALSE(conv.is_vector());
  CHECK(layout.tensors()[1].offset == 64 * 27);
  CHECK(layout.tensors()[1].is_vector());
  CHECK(layout.tensors()[2].numel() == 1);  // a scalar
  CHECK(layout.tensors()[2].offset == 64 * 27 + 64);
  CHECK(layout.tensors()[3].numel() == 0);

  gradcomp::bucket_layout const flat(64 * 27 + 65);
  CHECK(flat.size() == layout.size());
  CHECK(flat.fingerprint() != layout.fingerprint());
  gradcomp::bucket_layout transposed;
  transposed.add({27, 64}).add({64}).add({}).add({10, 0});
  CHECK(transposed.size() == layout.size());
  CHECK(transposed.fingerprint() != layout.fingerprint());
  gradcomp::bucket_layout same;
  same.add({64, 3, 3, 3}).add({64}).add({}).add({10, 0});
  CHECK(same.fingerprint() == layout.fingerprint());
}
