// Compressors chosen at run time: a compressor_spec's text round-trips and
// names what is wrong with it; any_allreducer gives bitwise the typed
// allreducer's results for every compressor; the lane policy picks the
// narrowest lane that n ranks cannot overflow; a spec one rank rejects fails
// every rank without a hang.
#include "common/compressors.hpp"
#include "common/harness.hpp"
#include "common/mpi_like.hpp"

#include <cstring>
#include <string>
#include <type_traits>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

// The typed compressor a spec should become on 3 ranks, with its error feedback.
template <class F>
void for_each_spec(F&& f) {
  using none = error_feedback::none;
  using residual = error_feedback::residual;
  f("fp32", fp32{}, none{}, "fp32");
  f("bf16", bf16{}, none{}, "bf16");
  f("bf16:ef=on", bf16{}, residual{}, "bf16");
  f("fp16", fp16{}, none{}, "fp16");
  f("topkc:fraction=0.2,chunk_size=16", topkc<>{.chunk_size = 16, .fraction = 0.2}, residual{}, "topkc<bf16>");
  f("topk:fraction=0.1,ef=off", topk<bfloat16>{.fraction = 0.1}, none{}, "topk<bf16>");
  f("powersgd:matrix_rank=2", powersgd<>{.matrix_rank = 2}, residual{}, "powersgd<fp32>");
  f("thc:bits=4,block=64", thc<std::uint8_t>{.block = 64, .bits = 4}, residual{}, "thc<uint8>");
  f("thc:bits=7,block=64,stages=3", thc<std::int32_t>{.block = 64, .stages = 3, .bits = 7}, residual{},
    "thc<int32>");  // 3 x 127 > 255
  f("qsgd:bits=4", qsgd<std::int8_t>{.bits = 4}, none{}, "qsgd<int8>");
  f("qsgd:bits=6", qsgd<std::int32_t>{.bits = 6}, none{}, "qsgd<int32>");  // 3 x 63 > 127
  f("qsgd_multiscale", qsgd_multiscale{}, residual{}, "qsgd_multiscale");
  f("global_randk:bits=4,k=40", global_randk<std::int8_t>{.k = 40, .bits = 4}, none{}, "global_randk<int8>");
  f("global_randk:k=40,ef=on", global_randk<std::int8_t>{.k = 40}, residual{}, "global_randk<int8>");
  f("intsgd", intsgd<std::int8_t>{}, residual{}, "intsgd<int8>");
  f("intsgd:lane=int32", intsgd<std::int32_t>{}, residual{}, "intsgd<int32>");
}

}  // namespace

TEST_CASE("any_allreducer gives bitwise the typed allreducer's results, for every compressor") {
  int const ranks = 3;
  for_each_spec([&](char const* text, auto c, auto ef, char const* description) {
    using C = decltype(c);
    using EF = decltype(ef);
    local_group::run(ranks, [&](local_group::communicator& comm) {
      bucket_layout const layout = odd_layout(1);
      std::size_t const d = layout.size();
      any_allreducer<local_group::communicator, host_space> chosen(compressor_spec::parse(text), comm, layout,
                                                                   host_space{});
      host_reducer<C, EF, local_group::communicator> typed(c, comm, layout, host_space{});
      INFO(text);
      CHECK(chosen.description() == description);
      CHECK(chosen.fingerprint() == typed.fingerprint());
      for (int step = 0; step < 3; ++step) {
        auto a = random_gradient(40 + step, comm.rank(), d), b = a;
        chosen({a.data(), d});
        typed({b.data(), d});
        CHECK(std::memcmp(a.data(), b.data(), d * sizeof(float)) == 0);
        CHECK(chosen.wire_bytes() == typed.wire_bytes());
      }
      CHECK(chosen.save() == typed.save());  // the same state, the same checkpoint
    });
  });
}

TEST_CASE("the lane policy picks the narrowest lane n ranks cannot overflow") {
  auto picks_narrow = [](std::string const& text, int ranks) {
    return visit_compressor(compressor_spec::parse(text), ranks, [](auto c, auto) {
      using C = decltype(c);
      return std::is_same_v<C, thc<std::uint8_t>> || std::is_same_v<C, qsgd<std::int8_t>> ||
             std::is_same_v<C, global_randk<std::int8_t>> || std::is_same_v<C, intsgd<std::int8_t>>;
    });
  };
  CHECK(picks_narrow("thc:bits=4", 17));  // 17 x 15 = 255
  CHECK_FALSE(picks_narrow("thc:bits=4", 18));
  CHECK(picks_narrow("thc:bits=2", 85));  // 85 x 3 = 255
  CHECK_FALSE(picks_narrow("thc:bits=2", 86));
  CHECK(picks_narrow("qsgd:bits=4", 8));  // 8 x 15 = 120
  CHECK_FALSE(picks_narrow("qsgd:bits=4", 9));
  CHECK_FALSE(picks_narrow("qsgd:bits=8", 1));     // 255 levels never fit int8
  CHECK(picks_narrow("global_randk:bits=3", 18));  // 18 x 7 = 126
  CHECK_FALSE(picks_narrow("global_randk:bits=3", 19));
  CHECK(picks_narrow("intsgd", 18));
  CHECK_FALSE(picks_narrow("intsgd", 19));
  CHECK(picks_narrow("thc:bits=4,lane=int8", 40));  // named: taken as named (and refused if it overflows)
  CHECK_FALSE(picks_narrow("qsgd:bits=2,lane=int32", 2));

  // A lane named narrow that the ranks overflow is refused on every rank, naming the lane.
  auto const errors = mpi_like_group::run(3, [](mpi_like_group::communicator& comm) {
    any_allreducer<mpi_like_group::communicator, host_space> r(compressor_spec::parse("qsgd:bits=6,lane=int8"), comm,
                                                               bucket_layout(100), host_space{});
  });
  for (auto const& e : errors) {
    INFO(message_of(e));
    CHECK(message_of(e).find("int8") != std::string::npos);
    CHECK_FALSE(is_hang(e));
  }
}

TEST_CASE("a compressor_spec reads what it writes and names what is wrong") {
  for_each_spec([](char const* text, auto, auto, char const*) {
    compressor_spec const s = compressor_spec::parse(text);
    INFO(text);
    CHECK(compressor_spec::parse(s.str()).str() == s.str());
    CHECK(s.str() == text);
  });
  CHECK(compressor_spec::parse("topkc").uses_error_feedback());
  CHECK_FALSE(compressor_spec::parse("bf16").uses_error_feedback());  // the baseline as PyTorch's hook has it
  CHECK(error_of("zstd").find("unknown compressor 'zstd'") != std::string::npos);
  CHECK(error_of("thc:blocks=64").find("unknown key 'blocks'") != std::string::npos);
  CHECK(error_of("topkc:bits=4").find("topkc takes no 'bits'") != std::string::npos);
  CHECK(error_of("thc:block=big").find("block=big is not a number") != std::string::npos);
  CHECK(error_of("thc:block=-4").find("block=-4 is not a number") != std::string::npos);
  CHECK(error_of("bf16:ef=maybe").find("ef=maybe") != std::string::npos);
  CHECK(error_of("qsgd:lane=int16").find("lane=int16") != std::string::npos);
  CHECK(error_of("thc:block").find("not key=value") != std::string::npos);
}

TEST_CASE("a spec one rank rejects fails every rank, and nobody hangs") {
  auto const errors = mpi_like_group::run(3, [](mpi_like_group::communicator& comm) {
    compressor_spec spec = compressor_spec::parse("thc");
    if (comm.rank() == 1) spec.name = "thc2";  // (parse would refuse it; a program might build it by hand)
    any_allreducer<mpi_like_group::communicator, host_space> r(spec, comm, bucket_layout(1000), host_space{});
  });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << message_of(errors[r]));
    CHECK(errors[r] != nullptr);
    CHECK_FALSE(is_hang(errors[r]));
  }
  for (std::size_t r = 0; r < errors.size(); ++r) {  // every rank names the rank at fault, and why
    INFO("rank " << r << ": " << message_of(errors[r]));
    CHECK(message_of(errors[r]).find("rank 1 cannot use this compressor_spec") != std::string::npos);
    CHECK(message_of(errors[r]).find("unknown compressor 'thc2'") != std::string::npos);
  }
}

// A refusal carries its bound and its remedy at the end: the other ranks'
// copy must keep them (a 232-byte copy once cut one mid-number).
TEST_CASE("a rank's refusal reaches the other ranks whole; one beyond the room says where it was cut") {
  std::string const reason = "thc: 64 ranks x levels 0..15 (bits=4) sum to 960, beyond the uint8 lane (max 255)" +
                             std::string(600, '.') + "; use a wider lane or fewer levels";
  std::string const too_long(1500, 'y');
  for (std::string const& why : {reason, too_long}) {
    auto const errors = mpi_like_group::run(3, [&](mpi_like_group::communicator& comm) {
      std::string const mine = comm.rank() == 1 ? why : std::string{};
      expect_none_failed(agreement(comm, host_space{}, 0, 0, mine), mine, "test", "this configuration");
    });
    std::string const prefix = "test: rank 1 cannot use this configuration: ";
    for (std::size_t r = 0; r < errors.size(); ++r) {
      INFO("rank " << r);
      REQUIRE(errors[r]);
      std::string const got = message_of(errors[r]);
      if (r == 1 || why.size() < 1000) {
        CHECK(got == prefix + why);  // its own whole, and the others' whole where it fits
      } else {
        CHECK(got.size() == prefix.size() + 999);
        CHECK(got.rfind(prefix + why.substr(0, 993), 0) == 0);
        CHECK(got.substr(got.size() - 6) == " [...]");
      }
    }
  }
}

// Parameters out of range are refused before any arithmetic uses them: the
// lane a spec picks once shifted by a negative bit count (undefined behaviour,
// which the sanitizer build turns into a failure), so the error named a lane
// that depended on the world size. Now every rank names the same value and
// the same lane on 2, 3 and 4 ranks.
TEST_CASE("out-of-range bits are refused by name, on every rank, before any shift by them") {
  for (char const* text : {"thc:bits=-1", "thc:bits=40", "qsgd:bits=-1", "qsgd:bits=63", "global_randk:k=50,bits=-1",
                           "global_randk:k=50,bits=63"}) {
    std::string first;
    for (int n : {2, 3, 4}) {
      auto const errors = mpi_like_group::run(n, [&](mpi_like_group::communicator& comm) {
        any_allreducer<mpi_like_group::communicator, host_space> r(compressor_spec::parse(text), comm,
                                                                   bucket_layout(1000), host_space{});
      });
      for (auto const& e : errors) {
        INFO(std::string(text), " on ", n, " ranks: ", message_of(e));
        REQUIRE(e);
        CHECK_FALSE(is_hang(e));
        std::string const bits = std::string(text).substr(std::string(text).rfind('=') + 1);
        CHECK(message_of(e).find("bits=" + bits) != std::string::npos);
        if (first.empty()) first = message_of(e);
        CHECK(message_of(e) == first);
      }
    }
  }
}

// Error feedback on a compressor that is no contraction on the bucket would
// amplify its error: refused at construction, by name, on every rank; the
// same compressor without feedback, or within its bound, is accepted.
TEST_CASE("error feedback is refused where the compressor is no contraction") {
  struct expectation {
    char const* spec;
    std::size_t d;
    bool refused;
  };
  for (auto const& x : {expectation{"global_randk:ef=on", 20000, true}, expectation{"global_randk", 20000, false},
                        expectation{"global_randk:k=224,ef=on", 20000, false},  // 224 / 225 < 1
                        expectation{"global_randk:k=225,ef=on", 20000, true}, expectation{"qsgd:ef=on", 1000, true},
                        expectation{"qsgd", 1000, false}, expectation{"qsgd:bits=10,ef=on", 1000, false}}) {
    auto const errors = mpi_like_group::run(3, [&](mpi_like_group::communicator& comm) {
      any_allreducer<mpi_like_group::communicator, host_space> r(compressor_spec::parse(x.spec), comm,
                                                                 bucket_layout(x.d), host_space{});
    });
    for (auto const& e : errors) {
      INFO(x.spec << ": " << message_of(e));
      CHECK(static_cast<bool>(e) == x.refused);
      if (x.refused) CHECK(message_of(e).find("needs a contraction") != std::string::npos);
    }
  }
}
