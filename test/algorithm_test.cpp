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
  auto cursor = detail::host_output(discard<float>{}, 0, staging);
  for (std::size_t k = 1; k < detail::host_chunk; k += 511) CHECK(&cursor[k] != &cursor[k - 1]);
  CHECK(&cursor[detail::host_chunk - 1] - &cursor[0] == static_cast<std::ptrdiff_t>(detail::host_chunk - 1));
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
