// The algorithm layer on the host space.
#include "common/algorithm_suite.hpp"
#include "common/topk_suite.hpp"

TEST_CASE_TEMPLATE_INVOKE(transform_matches, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(transform_gate, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(reduce_matches, gradcomp::host_space);
TEST_CASE_TEMPLATE_INVOKE(select_matches, gradcomp::host_space);

// A discarded output (error_feedback::none's next residual) must give each
// element of a host chunk a slot of its own: one shared sink is a store that
// every lane makes to one address, which kept the element loop of the
// no-feedback casts from vectorizing (bf16 without error feedback ran 4x
// slower than with it).
TEST_CASE("a discarded output gives each element of a host chunk its own slot") {
  using namespace gradcomp;
  float staging[1];
  detail::stream_chunk<discard<float>> none;
  auto cursor = detail::host_output(discard<float>{}, 0, staging, none, false);
  for (std::size_t k = 1; k < detail::host_chunk; k += 511) CHECK(&cursor[k] != &cursor[k - 1]);
  CHECK(&cursor[detail::host_chunk - 1] - &cursor[0] == static_cast<std::ptrdiff_t>(detail::host_chunk - 1));
}

// An output of more than host_space::streamed_bytes is written with
// streaming stores where its memory is 16-byte aligned (through 64-byte
// stores where it is 64-byte aligned), and as usual where it is not aligned
// or overwrites an input in place: every way, each element gets the value an
// ordinary store gives it, over whole chunks and a partial last one, on one
// thread and several; a 16-bit output narrows first. By default only
// outputs beyond tuning::host_streamed_bytes stream.
TEST_CASE("outputs larger than the cache stream around it, with the values ordinary stores give") {
  using namespace gradcomp;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::size_t const n = 3 * detail::host_chunk + 1001;
  std::size_t const big = detail::tuning::host_streamed_bytes / sizeof(float) + 1;
  bool const streams = GRADCOMP_HOST_STREAMING_STORES != 0;
  for (int threads : {1, 3}) {
    INFO("threads " << threads);
    host_space const space{.threads = threads, .streamed_bytes = 0};
    std::vector<float> a(n), b(n);
    for (auto& x : a) x = uniform(rng);
    for (auto& x : b) x = uniform(rng);
    buffer<float, host_space> in_place(n, space), lines(n, space), quarter(n + 4, space), unaligned(n + 1, space);
    std::memcpy(in_place.data(), a.data(), n * sizeof(float));
    for (auto* out : {&lines, &quarter, &unaligned})
      std::fill(out->data(), out->data() + out->size(), std::numeric_limits<float>::quiet_NaN());
    float* const quarter_out = quarter.data() + 4;  // 16-byte aligned, not 64
    float* const unaligned_out = unaligned.data() + 1;
    float const* const reads = in_place.data();
    CHECK(detail::host_streams(0, lines.data(), 0, n, reads, b.data()) == streams);
    CHECK(detail::host_streams(0, quarter_out, 0, n, reads, b.data()) == streams);
    CHECK_FALSE(detail::host_streams(0, unaligned_out, 0, n, reads, b.data()));
    CHECK_FALSE(detail::host_streams(0, in_place.data(), 0, n, reads, b.data()));
    // the default: only beyond tuning::host_streamed_bytes
    CHECK(host_space{}.streamed_bytes == detail::tuning::host_streamed_bytes);
    CHECK_FALSE(detail::host_streams(host_space{}.streamed_bytes, lines.data(), 0, big - 1, reads));
    CHECK(detail::host_streams(host_space{}.streamed_bytes, lines.data(), 0, big, reads) == streams);
    transform(space, n, inputs(reads, b.data()), outputs(lines.data(), quarter_out, unaligned_out, in_place.data()),
              [](std::size_t i, float x, float y, float& product, float& sum, float& difference, float& replaced) {
                product = x * y + static_cast<float>(i % 5);
                sum = x + y;
                difference = x - y;
                replaced = x * 0.5f;
              });
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      float const x = a[i], y = b[i];
      wrong += lines.data()[i] == x * y + static_cast<float>(i % 5) && quarter_out[i] == x + y &&
                       unaligned_out[i] == x - y && in_place.data()[i] == x * 0.5f
                   ? 0
                   : 1;
    }
    CHECK(wrong == 0);
    CHECK(std::isnan(quarter.data()[3]));  // nothing before the outputs
    CHECK(std::isnan(unaligned.data()[0]));

    buffer<bfloat16, host_space> narrow(n, space);
    CHECK(detail::host_streams(0, widened<bfloat16>{narrow.data()}, 0, n, b.data()) == streams);
    transform(space, n, inputs(b.data()), outputs(widened<bfloat16>{narrow.data()}),
              [](std::size_t, float x, float& out) { out = x * 3.0f; });
    wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += narrow.data()[i].bits == bfloat16(b[i] * 3.0f).bits ? 0 : 1;
    CHECK(wrong == 0);
  }
}

// host_space::fill_zero memsets large fills in runs over the space's
// threads: every byte asked for is zero, and none beside it, whatever the
// length (within one run, whole runs, a partial last run) and thread count.
TEST_CASE("host_space::fill_zero zeroes exactly the bytes asked for") {
  using namespace gradcomp;
  constexpr std::size_t run = std::size_t{1} << 18, pad = 64;
  for (int threads : {0, 1, 3}) {
    host_space const space{.threads = threads};
    for (std::size_t bytes : {std::size_t{0}, std::size_t{5}, run, 3 * run, 3 * run + 13}) {
      INFO("threads " << threads << ", bytes " << bytes);
      std::vector<unsigned char> memory(bytes + 2 * pad, 0xab);
      space.fill_zero(memory.data() + pad, bytes);
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < memory.size(); ++i) wrong += memory[i] != (i >= pad && i < pad + bytes ? 0x00 : 0xab);
      CHECK(wrong == 0);
    }
  }
}

// The host top_k's selections on inputs large enough for the sampled one:
// each path equal to a brute-force sort wherever it answers, over one to four
// slots (threads' shares), and the sampled one declining, having written
// nothing, where its sample misleads it (the large keys hidden between its
// runs; a quarter of the keys equal, more than a slot's share of the room).
TEST_CASE("the host top_k's sampled and two-pass selections equal a brute-force sort") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::mt19937 rng(std::random_device{}());
  std::size_t const n = (std::size_t{1} << 20) + 4099;
  enum class kind { magnitudes, few_values, hidden_from_sample, quarter_equal };
  for (kind shape : {kind::magnitudes, kind::few_values, kind::hidden_from_sample, kind::quarter_equal}) {
    std::vector<std::uint32_t> keys(n);
    std::normal_distribution<float> normal;
    for (auto& k : keys)
      k = shape == kind::magnitudes ? detail::float_bits(std::fabs(normal(rng))) : rng() % 5000u * 65599u;
    if (shape == kind::magnitudes)
      for (std::size_t i = 7; i < n; i += 11) keys[i] = keys[i - 7];
    if (shape == kind::hidden_from_sample) {  // the sample's keys large, and a key in 97 elsewhere larger still
      for (std::size_t i = 0; i < n; ++i) keys[i] = i % 97 == 0 ? (1u << 31) + rng() % (1u << 30) : rng() % (1u << 20);
      for (std::size_t r = 0; r < detail::sample_runs; ++r) {
        std::size_t const start = (n - detail::sample_run) * r / (detail::sample_runs - 1);
        for (std::size_t j = 0; j < detail::sample_run; ++j) keys[start + j] = (1u << 30) + rng() % (1u << 30);
      }
    }
    if (shape == kind::quarter_equal)
      for (std::size_t i = 0; i < n; i += 4) keys[i] = 0x7f000000u;
    bool const sample_holds = shape == kind::magnitudes || shape == kind::few_values;
    bool declined = false;
    for (std::size_t count : {std::size_t{1}, n / 1000, n / 100, n / 40}) {
      auto const reference = reference_top(keys, count);
      for (int slots : {1, 2, 3, 4}) {
        INFO("shape " << static_cast<int>(shape) << ", count " << count << ", slots " << slots);
        std::size_t const words = detail::pass_select_stride * 4 + 4 * detail::pass_select_room(n) + 12;
        std::vector<std::uint32_t> scratch(words, 0xdeadbeefu), out(count, 0xdeadbeefu);
        auto const by_sample = detail::sampled_select(slots, n, count, key_array{keys.data()},
                                                      record_selection{out.data()}, scratch.data());
        if (sample_holds) CHECK(by_sample);
        declined = declined || !by_sample;
        if (by_sample)
          CHECK(out == reference);
        else
          CHECK(std::count(out.begin(), out.end(), 0xdeadbeefu) == static_cast<std::ptrdiff_t>(count));
        std::fill(out.begin(), out.end(), 0xdeadbeefu);
        if (detail::two_pass_select(slots, n, count, key_array{keys.data()}, record_selection{out.data()},
                                    scratch.data()))
          CHECK(out == reference);
        else
          CHECK(shape == kind::quarter_equal);
      }
      for (int threads : {1, 3}) {
        INFO("shape " << static_cast<int>(shape) << ", count " << count << ", threads " << threads);
        CHECK(select_in(host_space{.threads = threads}, keys, count) == reference);
      }
    }
    INFO("shape " << static_cast<int>(shape));
    CHECK(declined != sample_holds);  // (the misleading shapes: at the largest count, if not before)
  }
}
