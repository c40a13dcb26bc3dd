// The model-level reducer: buckets packed as documented; results bitwise
// those of reducing each bucket after the backward pass, whatever order the
// ranks mark their gradients ready in; a bucket's reduction runs while the
// caller is still marking (shown by a collective that waits for the caller);
// checkpoints of the whole model; misuse named.
#include "common/harness.hpp"
#include "common/model_reducer_suite.hpp"
#include "common/mpi_like.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <random>
#include <string>

using namespace gradcomp;
using namespace gradcomp::testing;

TEST_CASE("the model is packed into buckets by cap, in backward order, vectors apart") {
  local_group::run(2, [](local_group::communicator& comm) {
    model_reducer<local_group::communicator, host_space> reducer(mlp_shapes(), comm, small_buckets());
    std::vector<int> seen(mlp_shapes().size(), 0);
    std::size_t last = 0;
    for (std::size_t b = 0; b < reducer.buckets(); ++b) {
      auto const& params = reducer.parameters_of(b);
      bool const vectors = mlp_shapes()[params.front()].size() == 1;
      std::size_t elements = 0;
      for (std::size_t p : params) {
        ++seen[p];
        CHECK((mlp_shapes()[p].size() == 1) == vectors);  // never mixed
        elements += reducer.gradient(p).size();
      }
      CHECK(params.back() >= last);  // reduced in the order their last gradients come
      last = params.back();
      CHECK(reducer.bucket(b).layout().size() == elements);
      bool const compressed = !vectors && elements >= 1000;
      CHECK(reducer.bucket(b).description() == (compressed ? "topkc<bf16>" : "bf16"));
    }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    // Matrices: 640 elements (past the first cap of 600), then 8192 + 38400 (past 40000), then 15000;
    // vectors: 10 + 64 + 128 + 300 (under the first cap).
    CHECK(reducer.buckets() == 4);
  });
}

// Each large bucket its own compressor (the planner's choices), in bucket
// order; a list of another length fails every rank at construction.
TEST_CASE("large buckets take the compressors given one each, and a list of the wrong length is refused") {
  local_group::run(2, [](local_group::communicator& comm) {
    model_reducer_options options = small_buckets();
    options.compressors = {compressor_spec::parse("thc"), compressor_spec::parse("powersgd")};
    model_reducer<local_group::communicator, host_space> reducer(mlp_shapes(), comm, options);
    std::vector<std::string> compressed;
    for (std::size_t b = 0; b < reducer.buckets(); ++b)
      if (reducer.bucket(b).description() != "bf16") compressed.push_back(reducer.bucket(b).description());
    CHECK(compressed == std::vector<std::string>{"thc<uint8>", "powersgd<fp32>"});
    options.compressors.pop_back();
    CHECK_THROWS_WITH_AS((model_reducer<local_group::communicator, host_space>(mlp_shapes(), comm, options)),
                         doctest::Contains("1 compressors given for 2 compressed buckets"), invalid_argument);
  });
}

TEST_CASE_TEMPLATE_INVOKE(model_any_order, setup<host_space, local_world>);

namespace {

// A local_group communicator whose first all_reduce in a step blocks until
// the test releases it (or 10 s pass): a reduction that overlaps the caller
// lets the caller go on meanwhile; one that does not would never return.
struct gated_collective {
  local_group::communicator* inner;
  struct gate_state {
    std::mutex m;
    std::condition_variable cv;
    int entered = 0;
    bool released = false;
  };
  gate_state* gate;

  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  bool accepts(memory_kind k) const { return inner->accepts(k); }
  template <class T>
  void all_reduce(T const* send, T* recv, std::size_t n, reduce_op op) {
    {
      std::unique_lock lock(gate->m);
      ++gate->entered;
      gate->cv.notify_all();
      if (!gate->cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate->released; }))
        throw collective_error("gated_collective: never released (the reduction did not overlap the caller)");
    }
    inner->all_reduce(send, recv, n, op);
  }
  template <class T>
  void all_gather(T const* send, T* recv, std::size_t n) {
    inner->all_gather(send, recv, n);
  }
  template <class T>
  void broadcast(T* data, std::size_t n, int root) {
    inner->broadcast(data, n, root);
  }
};

}  // namespace

TEST_CASE("a bucket is reduced while the caller is still marking gradients ready") {
  int const ranks = 2;
  shapes_t const shapes = {{100, 100}, {100, 100}, {100, 100}};
  std::vector<std::vector<bucket_event>> timelines(ranks);
  std::vector<int> overlapped(ranks, 0);
  local_group::run(ranks, [&](local_group::communicator& comm) {
    gated_collective::gate_state gate;
    gate.released = true;  // construction's agreements pass
    gated_collective collective{&comm, &gate};
    model_reducer_options options;
    options.compressor = compressor_spec::parse("bf16");
    options.first_bucket_cap_bytes = options.bucket_cap_bytes = 10000 * sizeof(float);  // a bucket per matrix
    model_reducer<gated_collective, host_space> reducer(shapes, collective, options);
    REQUIRE(reducer.buckets() == 3);
    {
      std::lock_guard lock(gate.m);
      gate.released = false;
      gate.entered = 0;
    }
    reducer.mark_ready(0);  // bucket 0 is whole: its reduction starts and blocks in the collective
    {
      std::unique_lock lock(gate.m);
      overlapped[comm.rank()] = gate.cv.wait_for(lock, std::chrono::seconds(10), [&] { return gate.entered > 0; });
    }
    reducer.mark_ready(1);  // the "backward pass" goes on meanwhile
    reducer.mark_ready(2);
    {
      std::lock_guard lock(gate.m);
      gate.released = true;
    }
    gate.cv.notify_all();
    reducer.finish();
    reducer.mark_ready(2);  // a second step, to publish the first one's timeline
    reducer.mark_ready(1);
    reducer.mark_ready(0);
    reducer.finish();
    timelines[comm.rank()] = reducer.timeline();
  });
  for (int r = 0; r < ranks; ++r) {
    CHECK(overlapped[r] == 1);
    REQUIRE(timelines[r].size() == 3);
    for (std::size_t b = 0; b < 3; ++b) {
      CHECK(timelines[r][b].bucket == b);  // strictly in bucket order
      CHECK(timelines[r][b].launched <= timelines[r][b].started);
      CHECK(timelines[r][b].started <= timelines[r][b].finished);
    }
  }
}

TEST_CASE("a model checkpoint continues bitwise and a bad one changes nothing") {
  int const ranks = 3;
  shapes_t const shapes = mlp_shapes();
  auto step = [&](auto& reducer, int s, int rank) {
    return reduced_step(reducer, shapes, 300 + static_cast<std::uint64_t>(s) * 10, rank);
  };
  std::vector<std::string> messages(ranks);
  local_group::run(ranks, [&](local_group::communicator& comm) {
    using reducer_t = model_reducer<local_group::communicator, host_space>;
    reducer_t whole(shapes, comm, small_buckets());
    reducer_t first(shapes, comm, small_buckets());
    for (int s = 0; s < 2; ++s) {
      (void)step(whole, s, comm.rank());
      (void)step(first, s, comm.rank());
    }
    auto const saved = first.save();
    reducer_t resumed(shapes, comm, small_buckets());
    resumed.restore({saved.data(), saved.size()});
    for (int s = 2; s < 4; ++s) CHECK(step(resumed, s, comm.rank()) == step(whole, s, comm.rank()));

    // One rank's checkpoint corrupted: every rank refuses, none changes.
    auto bad = saved;
    if (comm.rank() == 2) bad[bad.size() / 2] ^= std::byte{1};
    auto const before = resumed.save();
    std::string message;
    try {
      resumed.restore({bad.data(), bad.size()});
    } catch (checkpoint_error const& e) {
      message = e.what();
    }
    INFO("rank " << comm.rank() << ": " << message);
    CHECK(message.find("rank 2 cannot restore its checkpoint") != std::string::npos);
    CHECK(message.find("no rank restored anything") != std::string::npos);
    CHECK(resumed.save() == before);
    messages[static_cast<std::size_t>(comm.rank())] = message;
  });
  for (int r = 1; r < ranks; ++r) CHECK(messages[r] == messages[0]);  // rank 2's reason, on every rank
}

TEST_CASE("misuse of a step is named") {
  local_group::run(2, [](local_group::communicator& comm) {
    model_reducer<local_group::communicator, host_space> reducer(mlp_shapes(), comm, small_buckets());
    CHECK_THROWS_WITH_AS(reducer.gradient(8), doctest::Contains("parameter 8 of 8"), invalid_argument);
    for (std::size_t p = 0; p < 8; ++p)
      if (p != 3 && p != 5) reducer.mark_ready(p);
    CHECK_THROWS_WITH_AS(reducer.mark_ready(0), doctest::Contains("marked ready twice"), invalid_argument);
    CHECK_THROWS_WITH_AS(reducer.finish(), doctest::Contains("parameters 3, 5 were marked ready"), invalid_argument);
  });
}

// A rank whose model has one tensor more (so one bucket more) must not leave
// its peers returning from the constructor while it waits in a bucket's set-up
// that they never start: the whole plan is agreed before any bucket's own. The
// MPI-like collective's watchdog turns such a wait into a `hang`.
TEST_CASE("ranks whose models differ in tensors or bucket rules all throw from the constructor") {
  for (int n : {2, 3, 4, 7}) {
    for (int variant = 0; variant < 2; ++variant) {
      auto const errors = mpi_like_group::run(n, [&](mpi_like_group::communicator& comm) {
        std::vector<std::vector<std::size_t>> shapes = mlp_shapes();
        model_reducer_options options = small_buckets();
        bool const odd = comm.rank() == comm.size() - 1;
        if (odd && variant == 0) shapes.push_back({3, 5});
        if (odd && variant == 1) options.bucket_cap_bytes *= 2;
        model_reducer<mpi_like_group::communicator, host_space> reducer(shapes, comm, options);
      });
      for (auto const& e : errors) {
        INFO(n, " ranks, variant ", variant, ": ", message_of(e));
        REQUIRE(e);
        CHECK_FALSE(is_hang(e));
        std::string const last = "rank " + std::to_string(n - 1);
        CHECK(message_of(e).find(last) != std::string::npos);
        CHECK(message_of(e).find(variant == 0 ? "tensors" : "differs") != std::string::npos);
      }
    }
  }
}
