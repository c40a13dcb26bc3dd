// Warm-up and checkpoints, for every compressor over in-process ranks:
// warm-up steps are the fp32 mean and the compressor then starts as if new;
// a run saved and restored into fresh allreducers continues bitwise as if
// never interrupted; every bad checkpoint (truncated, corrupted, of another
// version, kind, rank, world size, configuration or step) is refused with an
// error that names the problem, on every rank, and changes nothing.
#include "common/compressors.hpp"
#include "common/harness.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

using bytes = std::vector<std::byte>;

span<std::byte const> view(bytes const& b) { return {b.data(), b.size()}; }

bool same(std::vector<float> const& a, std::vector<float> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Rewrites a header field and reseals the checkpoint, as a well-formed
// checkpoint of that other identity would be.
bytes with_field(bytes b, std::size_t at, std::uint32_t value) {
  std::memcpy(b.data() + at, &value, sizeof value);
  std::size_t const sealed = b.size() - 8;
  std::uint64_t const sum = detail::checksum(b.data(), sealed);
  std::memcpy(b.data() + sealed, &sum, 8);
  return b;
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (checkpoint_error const& e) {
    return e.what();
  }
  return "(no checkpoint_error)";
}

}  // namespace

TEST_CASE("warm-up steps send the fp32 mean; the compressor then starts as if new") {
  int const ranks = 3;
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    local_group::run(ranks, [&](local_group::communicator& comm) {
      bucket_layout const layout = odd_layout(1);
      std::size_t const d = layout.size();
      host_reducer<C, error_feedback::residual, local_group::communicator> warm(c, comm, layout, host_space{},
                                                                                {.warmup_steps = 2});
      host_reducer<fp32, error_feedback::none, local_group::communicator> plain(fp32{}, comm, layout, host_space{});
      host_reducer<C, error_feedback::residual, local_group::communicator> fresh(c, comm, layout, host_space{});
      for (int step = 0; step < 5; ++step) {
        INFO(C::name << ", step " << step);
        auto g = random_gradient(300 + step, comm.rank(), d);
        auto expected = g;
        CHECK(warm.warming_up() == (step < 2));
        warm({g.data(), d});
        if (step < 2) {
          plain({expected.data(), d});
          CHECK(same(g, expected));
          auto const r = warm.residual();
          CHECK(std::all_of(r.begin(), r.end(), [](float x) { return detail::float_bits(x) == 0; }));
        } else {
          fresh({expected.data(), d});
          CHECK(same(g, expected));
          auto const a = warm.residual(), b = fresh.residual();
          CHECK(std::memcmp(a.data(), b.data(), d * sizeof(float)) == 0);
        }
      }
      CHECK(warm.steps() == 5);
    });
  });
}

TEST_CASE("a run saved and restored into new allreducers continues bitwise") {
  int const ranks = 3;
  int const total = 6;
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    auto run = [&](auto ef, std::uint64_t warmup, int stop_at) {
      using EF = decltype(ef);
      std::vector<std::vector<float>> outputs(ranks);
      local_group::run(ranks, [&](local_group::communicator& comm) {
        bucket_layout const layout = odd_layout(1);
        std::size_t const d = layout.size();
        allreducer_options const options{.warmup_steps = warmup};
        auto first =
            std::make_unique<host_reducer<C, EF, local_group::communicator>>(c, comm, layout, host_space{}, options);
        auto* reduce = first.get();
        std::unique_ptr<host_reducer<C, EF, local_group::communicator>> second;
        for (int step = 0; step < total; ++step) {
          if (step == stop_at) {
            bytes const saved = first->save();
            first.reset();  // nothing survives but the bytes
            second = std::make_unique<host_reducer<C, EF, local_group::communicator>>(c, comm, layout, host_space{},
                                                                                      options);
            second->restore(view(saved));
            CHECK(second->steps() == static_cast<std::uint64_t>(stop_at));
            reduce = second.get();
          }
          auto g = random_gradient(500 + step, comm.rank(), d);
          (*reduce)({g.data(), d});
          outputs[comm.rank()].insert(outputs[comm.rank()].end(), g.begin(), g.end());
        }
      });
      return outputs;
    };
    for (std::uint64_t warmup : {0, 2}) {
      auto const whole = run(error_feedback::residual{}, warmup, -1);
      for (int stop_at : {0, 1, 2, 4}) {
        INFO(C::name << ", warm-up " << warmup << ", restored before step " << stop_at);
        auto const resumed = run(error_feedback::residual{}, warmup, stop_at);
        for (int r = 0; r < ranks; ++r) CHECK(same(resumed[r], whole[r]));
      }
    }
    auto const whole = run(error_feedback::none{}, 1, -1), resumed = run(error_feedback::none{}, 1, 3);
    INFO(C::name << " without error feedback");
    for (int r = 0; r < ranks; ++r) CHECK(same(resumed[r], whole[r]));
  });
}

// One rank's checkpoint is bad in one way while the others' are good: every
// rank throws checkpoint_error naming the bad rank and the problem, and every
// rank's state is what it was (its next save is byte for byte the same, and
// its next step is the uninterrupted run's).
TEST_CASE("a bad checkpoint on any rank is refused by every rank and changes nothing") {
  int const ranks = 3;
  using C = powersgd<>;  // state in its workspace (Q) as well as a residual
  using reducer = host_reducer<C, error_feedback::residual, local_group::communicator>;
  C const c{.matrix_rank = 2, .min_compression_rate = 1};
  bucket_layout const layout = odd_layout(1);
  std::size_t const d = layout.size();

  // The checkpoints of a 3-rank run at steps 2 and 3, of a 2-rank run, and
  // of another configuration.
  std::vector<bytes> at2(ranks), at3(ranks), two_ranks(2), other_config(ranks);
  local_group::run(ranks, [&](local_group::communicator& comm) {
    reducer reduce(c, comm, layout, host_space{}, {.warmup_steps = 1});
    reducer other(C{.matrix_rank = 3, .min_compression_rate = 1}, comm, layout, host_space{});
    for (int step = 0; step < 3; ++step) {
      auto g = random_gradient(700 + step, comm.rank(), d);
      if (step == 2) at2[comm.rank()] = reduce.save();
      reduce({g.data(), d});
    }
    at3[comm.rank()] = reduce.save();
    other_config[comm.rank()] = other.save();
  });
  local_group::run(2, [&](local_group::communicator& comm) {
    reducer reduce(c, comm, layout, host_space{}, {.warmup_steps = 1});
    two_ranks[comm.rank()] = reduce.save();
  });

  struct bad_case {
    char const* name;
    bytes checkpoint;  // what rank `culprit` restores
    std::string says;  // part of the message
  };
  int const culprit = 1;
  bytes const good = at3[culprit];
  bytes flipped = good;
  flipped[good.size() / 2] ^= std::byte{0x10};
  std::vector<bad_case> cases = {
      {"truncated", bytes(good.begin(), good.end() - 9), "truncated"},
      {"empty", bytes{}, "truncated"},
      {"one bit flipped", flipped, "corrupted"},
      {"not a checkpoint", bytes(64, std::byte{'x'}), "not a gradcomp checkpoint"},
      {"another format version", with_field(good, 8, checkpoint_format + 1), "format version 2"},
      {"another kind", with_field(good, 12, static_cast<std::uint32_t>(checkpoint_kind::reducer)),
       "saved by a reducer"},
      {"another rank's", at3[0], "saved by rank 0, restored on rank 1"},
      {"another world size", two_ranks[culprit], "saved on 2 ranks, restored on 3"},
      {"another configuration", other_config[culprit], "different configuration"},
      {"another step", at2[culprit], "different steps"},
  };
  for (auto const& bad : cases) {
    local_group::run(ranks, [&](local_group::communicator& comm) {
      reducer reduce(c, comm, layout, host_space{}, {.warmup_steps = 1});
      reduce.restore(view(at3[comm.rank()]));
      bytes const before = reduce.save();
      bytes const& mine = comm.rank() == culprit ? bad.checkpoint : at3[comm.rank()];
      std::string const message = message_of([&] { reduce.restore(view(mine)); });
      INFO(bad.name << " on rank " << culprit << ", seen by rank " << comm.rank() << ": " << message);
      CHECK(message.find(bad.says) != std::string::npos);
      if (std::string(bad.name) != "another step") CHECK(message.find("rank 1") != std::string::npos);
      CHECK(message.find("no rank restored anything") != std::string::npos);
      CHECK(reduce.save() == before);
      CHECK(reduce.steps() == 3);
      auto g = random_gradient(703, comm.rank(), d);
      reduce({g.data(), d});  // every rank still steps together
    });
  }
}

TEST_CASE("every truncation and every corrupted byte of a checkpoint is refused") {
  int const ranks = 2;
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    local_group::run(ranks, [&](local_group::communicator& comm) {
      host_reducer<C, error_feedback::residual, local_group::communicator> reduce(c, comm, odd_layout(1), host_space{});
      std::size_t const d = reduce.layout().size();
      auto g = random_gradient(900, comm.rank(), d);
      reduce({g.data(), d});
      bytes const good = reduce.save();
      CHECK_NOTHROW((void)reduce.parse_checkpoint(view(good)));
      std::size_t refused = 0, tried = 0;
      for (std::size_t n = 0; n < good.size(); n += 1 + n / 64, ++tried) {
        bytes const cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
        refused += message_of([&] { (void)reduce.parse_checkpoint(view(cut)); }) != "(no checkpoint_error)";
      }
      std::mt19937_64 rng(shared_seed(comm) + static_cast<std::uint64_t>(comm.rank()));
      for (int i = 0; i < 200; ++i, ++tried) {
        bytes bad = good;
        std::size_t const at = rng() % bad.size();
        bad[at] ^= static_cast<std::byte>(1u + rng() % 255u);
        refused += message_of([&] { (void)reduce.parse_checkpoint(view(bad)); }) != "(no checkpoint_error)";
      }
      INFO(C::name << ", rank " << comm.rank());
      CHECK(refused == tried);
    });
  });
}

TEST_CASE("a restored residual must be finite") {
  local_group::run(2, [&](local_group::communicator& comm) {
    host_reducer<bf16, error_feedback::residual, local_group::communicator> reduce(bf16{}, comm, odd_layout(1),
                                                                                   host_space{});
    std::size_t const d = reduce.layout().size();
    auto g = random_gradient(40, comm.rank(), d);
    reduce({g.data(), d});
    bytes saved = reduce.save();
    if (comm.rank() == 0) {  // a NaN in the residual, resealed: only the value check can tell
      float const nan = std::numeric_limits<float>::quiet_NaN();
      std::size_t const residual_at = detail::checkpoint_header_bytes + 8 + 8;
      std::memcpy(saved.data() + residual_at + 4 * (d / 2), &nan, 4);
      std::size_t const sealed = saved.size() - 8;
      std::uint64_t const sum = detail::checksum(saved.data(), sealed);
      std::memcpy(saved.data() + sealed, &sum, 8);
    }
    std::string const message = message_of([&] { reduce.restore(view(saved)); });
    CHECK(message.find("rank 0") != std::string::npos);
    CHECK(message.find("NaN or infinite") != std::string::npos);
  });
}

// The compressor's kept state is checked as the residual is: a PowerSGD Q
// with a NaN, an IntSGD norm below zero, resealed so that only the value
// check can tell, are refused on every rank.
TEST_CASE("a restored compressor state must be one the compressor can hold") {
  auto check = [](auto c, auto poison, char const* says) {
    using C = decltype(c);
    local_group::run(2, [&](local_group::communicator& comm) {
      host_reducer<C, error_feedback::residual, local_group::communicator> reduce(c, comm, odd_layout(1), host_space{});
      std::size_t const d = reduce.layout().size();
      for (int step = 0; step < 2; ++step) {
        auto g = random_gradient(50 + step, comm.rank(), d);
        reduce({g.data(), d});
      }
      bytes saved = reduce.save();
      bytes const before = saved;
      if (comm.rank() == 1) {  // the state's last value, just before the checksum
        std::memcpy(saved.data() + saved.size() - 8 - sizeof poison, &poison, sizeof poison);
        std::size_t const sealed = saved.size() - 8;
        std::uint64_t const sum = detail::checksum(saved.data(), sealed);
        std::memcpy(saved.data() + sealed, &sum, 8);
      }
      std::string const message = message_of([&] { reduce.restore(view(saved)); });
      INFO(C::name << ", rank " << comm.rank() << ": " << message);
      CHECK(message.find("rank 1") != std::string::npos);
      if (comm.rank() == 1) CHECK(message.find(says) != std::string::npos);  // (the others name rank 1 only)
      CHECK(reduce.save() == before);
    });
  };
  check(powersgd<>{.matrix_rank = 2, .min_compression_rate = 1}, std::numeric_limits<float>::quiet_NaN(),
        "PowerSGD's Q");
  check(intsgd<>{}, -1.0, "IntSGD's running norm");
}

TEST_CASE("state of one's own restores through the reducers' agreement: every rank gives the same verdict") {
  // Each rank states its checkpoint's step, or why it cannot restore; every
  // rank sees every statement in rank order and throws the same error.
  std::mt19937_64 draw(std::random_device{}());
  int const n = 2 + static_cast<int>(draw() % 4);
  int const odd = static_cast<int>(draw() % static_cast<std::uint64_t>(n));  // the rank at fault
  std::uint64_t const step = 1 + draw() % 1000;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  auto verdict = [&](local_group::communicator& comm, std::uint64_t mine, std::string const& failure) {
    try {
      expect_restorable(agreement(comm, host_space{.threads = 1}, mine, 0, failure), failure);
    } catch (checkpoint_error const& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  };
  INFO(n << " ranks, rank " << odd << " at fault, step " << step);

  local_group::run(n, [&](local_group::communicator& comm) {  // one step behind
    verdict(comm, comm.rank() == odd ? step - 1 : step, "");
  });
  std::string const steps =
      odd == 0 ? "(rank 0: " + std::to_string(step - 1) + ", rank 1: " + std::to_string(step)
               : "(rank 0: " + std::to_string(step) + ", rank " + std::to_string(odd) + ": " + std::to_string(step - 1);
  for (auto const& e : errors) CHECK(e.find("of different steps " + steps) != std::string::npos);

  std::fill(errors.begin(), errors.end(), "");
  local_group::run(n, [&](local_group::communicator& comm) {  // one cannot restore
    verdict(comm, step, comm.rank() == odd ? "a torn file" : "");
  });
  for (auto const& e : errors)
    CHECK(e ==
          "rank " + std::to_string(odd) + " cannot restore its checkpoint (a torn file); no rank restored anything");

  // Two ranks fail: every rank names the first, with its reason, after a
  // restore and after a set-up.
  int const other = (odd + 1) % n;
  std::vector<std::string> set_up(static_cast<std::size_t>(n));
  local_group::run(n, [&](local_group::communicator& comm) {
    int const r = comm.rank();
    std::string const failure = r == odd || r == other ? "rank " + std::to_string(r) + "'s torn file" : "";
    verdict(comm, step, failure);
    try {
      expect_none_failed(agreement(comm, host_space{.threads = 1}, 0, 0, failure), failure, "loader", "its file");
    } catch (invalid_argument const& e) {
      set_up[static_cast<std::size_t>(r)] = e.what();
    }
  });
  std::string const first = std::to_string(std::min(odd, other));
  for (auto const& e : errors)
    CHECK(e == "rank " + first + " cannot restore its checkpoint (rank " + first +
                   "'s torn file); no rank restored anything");
  for (auto const& e : set_up)
    CHECK(e == "loader: rank " + first + " cannot use its file: rank " + first + "'s torn file");

  local_group::run(n, [&](local_group::communicator& comm) {  // all agree: nobody throws, every statement arrives
    agreement const all(comm, host_space{.threads = 1}, step, static_cast<std::uint64_t>(comm.rank()), "");
    CHECK_NOTHROW(expect_restorable(all, ""));
    REQUIRE(all.ranks() == n);
    CHECK(all.self() == comm.rank());
    for (int r = 0; r < n; ++r) CHECK(all.of(r).b == static_cast<std::uint64_t>(r));
  });
}
