// Test bodies for the algorithm layer (transform, segmented_reduce), written
// once and instantiated per execution space: each against a scalar reference
// computed here, for odd sizes, unaligned spans and empty input, with outputs
// poisoned before the run so an element the pass skipped shows up.
#pragma once

#include "harness.hpp"

#include <cmath>
#include <cstring>

namespace gradcomp::testing {

// A pass with every kind of stream: two float inputs (one through a double
// buffer), noise; a bf16, an int8 and a float output (one through the double
// buffer), one discarded. Marks an element bad when its first input is NaN.
struct mixed_op {
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i, float a, float b, float u, float zero, bfloat16& h,
                                       std::int8_t& c, float& e, float& dropped) const {
    h = bfloat16(a * 2.0f + b);
    c = static_cast<std::int8_t>(static_cast<int>(u * 100.0f) - 50);
    e = a - b + zero + static_cast<float>(i % 7);
    dropped = a;
    return a != a;
  }
};

struct plain_op {  // no streams beyond one output: i itself
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i, std::uint32_t& out) const {
    out = static_cast<std::uint32_t>(i * 2654435761u);
  }
};

struct copy_op {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& y) const { y = x; }
};

struct sum_op {  // a reduction's value: a + b (bad when NaN)
  GRADCOMP_HOST_DEVICE float operator()(std::size_t, float a, float b) const { return a + b; }
};

struct store_at {
  double* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j, double total) const { out[j] = total; }
};

/// The canonical total of segmented_reduce (its header's definition),
/// written here from scratch: 128 lanes, the lane tree, tiles of 4096.
inline double canonical(std::vector<double> const& v, bool max) {
  auto combine = [&](double a, double b) { return max ? std::max(a, b) : a + b; };
  if (v.size() <= 4096) {
    double p[128] = {};
    for (std::size_t t = 0; t < v.size(); ++t) p[t % 128] = combine(p[t % 128], v[t]);
    for (int o = 64; o >= 1; o /= 2)
      for (int l = 0; l < o; ++l) p[l] = combine(p[l], p[l + o]);
    return p[0];
  }
  std::vector<double> tiles;
  for (std::size_t b = 0; b < v.size(); b += 4096)
    tiles.push_back(canonical({v.begin() + b, v.begin() + std::min(v.size(), b + 4096)}, max));
  return canonical(tiles, max);
}

}  // namespace gradcomp::testing

TEST_CASE_TEMPLATE_DEFINE("transform runs every element through every kind of stream", Space, transform_matches) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  Space const space{};
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (std::size_t n :
       {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{4099}, std::size_t{100003}}) {
    for (std::size_t skew : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {  // unaligned views
      INFO("n " << n << ", skew " << skew);
      std::vector<float> a(n + skew), b(n + skew);
      for (auto& x : a) x = normal(rng);
      for (auto& x : b) x = normal(rng);
      std::size_t const bad = n > 10 ? 3 : 0;
      for (std::size_t k = 0; k < bad; ++k) a[skew + (k * 7919) % n] = std::numeric_limits<float>::quiet_NaN();
      auto da = upload(space, a);
      auto sides = upload(space, std::vector<float>(2 * (n + skew), -1.0f));  // the double buffer
      auto db = upload(space, b);
      space.copy(sides.data(), db.data(), (n + skew) * sizeof(float));  // side 0 = b
      auto index = upload(space, std::vector<std::uint32_t>{0});
      auto h = upload(space, std::vector<bfloat16>(n + skew, bfloat16(-7.0f)));
      auto c = upload(space, std::vector<std::int8_t>(n + skew, 99));
      auto count = upload(space, std::vector<std::uint64_t>{5});
      random_stream const noise(0x5eed + n, 3, 1);
      selected<float const> side_b{{sides.data(), sides.data() + n + skew}, index.data(), 0, skew};
      selected<float> side_e{{sides.data(), sides.data() + n + skew}, index.data(), 1, skew};
      transform(space, n, inputs(da.data() + skew, side_b, rounding_noise{noise}, zeros<float>{}),
                outputs(h.data() + skew, c.data() + skew, side_e, discard<float>{}), mixed_op{},
                {.count = count.data()});
      auto const hh = download(space, h.data(), n + skew);
      auto const cc = download(space, c.data(), n + skew);
      auto const ss = download(space, sides.data(), 2 * (n + skew));
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < skew; ++k)  // before the view: untouched
        wrong += (hh[k].bits == bfloat16(-7.0f).bits && cc[k] == 99 && ss[n + skew + k] == -1.0f) ? 0 : 1;
      for (std::size_t i = 0; i < n; ++i) {
        float const x = a[skew + i], y = b[skew + i];
        float const u = rounding_noise{noise}.at(i);
        bool const codes = cc[skew + i] == static_cast<std::int8_t>(static_cast<int>(u * 100.0f) - 50);
        bool const ok = std::isnan(x)  // (a NaN's payload is the hardware's business)
                            ? codes && std::isnan(static_cast<float>(hh[skew + i])) && std::isnan(ss[n + 2 * skew + i])
                            : codes && hh[skew + i].bits == bfloat16(x * 2.0f + y).bits &&
                                  same_bits(ss[n + 2 * skew + i], x - y + 0.0f + static_cast<float>(i % 7));
        wrong += ok ? 0 : 1;
      }
      CHECK(wrong == 0);
      CHECK(download(space, count.data(), 1)[0] == 5 + bad);
    }
  }
  // No input streams: the index alone; and the empty pass writes nothing.
  std::size_t const n = 70001;
  auto out = upload(space, std::vector<std::uint32_t>(n, 0));
  transform(space, n, inputs(), outputs(out.view()), plain_op{});
  auto const o = download(space, out.data(), n);
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) wrong += o[i] == static_cast<std::uint32_t>(i * 2654435761u) ? 0 : 1;
  CHECK(wrong == 0);
}

TEST_CASE_TEMPLATE_DEFINE("transform obeys its gate: runs, skips, or writes NaN", Space, transform_gate) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  Space const space{};
  std::size_t const n = 5000;
  auto in = upload(space, std::vector<float>(n, 2.0f));
  for (std::uint64_t flag : {std::uint64_t{0}, std::uint64_t{1}}) {
    for (bool poison : {false, true}) {
      auto word = upload(space, std::vector<std::uint64_t>{flag});
      auto out = upload(space, std::vector<float>(n, -1.0f));
      transform(space, n, inputs(in.view()), outputs(out.view()), copy_op{}, {.when = {word.data(), poison}});
      auto const o = download(space, out.data(), n);
      float const expected = flag == 0 ? 2.0f : (poison ? std::numeric_limits<float>::quiet_NaN() : -1.0f);
      std::size_t wrong = 0;
      for (float v : o) wrong += (std::isnan(expected) ? std::isnan(v) : v == expected) ? 0 : 1;
      INFO("flag " << flag << ", poison " << poison);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE_TEMPLATE_DEFINE("segmented_reduce equals the canonical order bit for bit", Space, reduce_matches) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  Space const space{};
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-40, 40);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{129}, std::size_t{4097}, std::size_t{300001}}) {
    for (std::size_t segment : {std::size_t{1}, std::size_t{6}, std::size_t{256}, std::size_t{4096}, std::size_t{5000},
                                std::size_t{1} << 20}) {
      for (std::size_t skew : {std::size_t{0}, std::size_t{1}}) {
        INFO("n " << n << ", segment " << segment << ", skew " << skew);
        std::vector<float> a(n + skew), b(n + skew);
        for (auto& x : a) x = std::ldexp(normal(rng), exponent(rng));  // 1e-12 .. 1e12: squares need double
        for (auto& x : b) x = normal(rng);
        if (n > 50) a[skew + 40] = std::numeric_limits<float>::infinity() - std::numeric_limits<float>::infinity();
        auto da = upload(space, a);
        auto db = upload(space, b);
        std::size_t const m = (n + segment - 1) / segment;
        for (bool max : {false, true}) {
          auto out = upload(space, std::vector<double>(std::max<std::size_t>(m, 1), -1.0));
          buffer<std::byte, Space> scratch(segmented_reduce_scratch_bytes(n, segment), space);
          auto count = upload(space, std::vector<std::uint64_t>{0});
          if (max)
            segmented_reduce<reduction::max_abs>(space, n, segment, inputs(da.data() + skew, db.data() + skew),
                                                 sum_op{}, store_at{out.data()},
                                                 {.scratch = scratch.view(), .count = count.data()});
          else
            segmented_reduce<reduction::sum_of_squares>(space, n, segment, inputs(da.data() + skew, db.data() + skew),
                                                        sum_op{}, store_at{out.data()},
                                                        {.scratch = scratch.view(), .count = count.data()});
          auto const totals = download(space, out.data(), m);
          std::size_t wrong = 0;
          for (std::size_t j = 0; j < m; ++j) {
            std::size_t const begin = j * segment, end = std::min(n, begin + segment);
            std::vector<double> values;
            for (std::size_t i = begin; i < end; ++i) {
              float const v = a[skew + i] + b[skew + i];
              double const x = v != v ? 0.0 : static_cast<double>(v);
              values.push_back(max ? std::fabs(x) : x * x);
            }
            double expected;
            if (segment <= 4096) {
              expected = canonical(values, max);
            } else {  // tiles of the segment, the missing ones of a short segment as zeros
              std::vector<double> tiles((segment + 4095) / 4096, 0.0);
              for (std::size_t t = 0; t * 4096 < values.size(); ++t)
                tiles[t] = canonical(
                    {values.begin() + t * 4096, values.begin() + std::min(values.size(), (t + 1) * 4096)}, max);
              expected = canonical(tiles, max);
            }
            wrong += totals[j] == expected ? 0 : 1;
          }
          CHECK(wrong == 0);
          CHECK(download(space, count.data(), 1)[0] == (n > 50 ? 1u : 0u));
        }
      }
    }
  }
}
