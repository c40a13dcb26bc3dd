// The model-level core (reducers/model/) behind every entry point: lanes
// reduce bitwise alike for any number, and a checkpoint saved on one number
// loads on another; model_reducer, model_reduce_scatterer and buckets handed
// over from outside (the DDP hook's path) take one bucket rule; a handed-over
// bucket is built at its first step, built again when its parameters change,
// and joins the warm-up where the model is.
#include "common/harness.hpp"
#include "common/model_reducer_suite.hpp"

#include <cstring>
#include <set>
#include <string>
#include <vector>

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

std::vector<float> model_step(auto& reducer, shapes_t const& shapes, int step, int rank) {
  return reduced_step(reducer, shapes, 900 + static_cast<std::uint64_t>(step) * 31, rank);
}

}  // namespace

TEST_CASE("1, 2 and 3 lanes reduce bitwise alike, overlapped or not; a checkpoint saved on 2 lanes loads on 3") {
  int const ranks = 3;
  shapes_t const shapes = mlp_shapes();
  for (bool overlap : {true, false}) {
    // [lanes][rank]: four steps' outputs, concatenated
    std::vector<std::vector<std::vector<float>>> results(4, std::vector<std::vector<float>>(ranks));
    std::vector<std::vector<float>> resumed(ranks);
    local_group::run(ranks, [&](local_group::communicator& comm) {
      auto options = [&](int lanes) {
        model_reducer_options o = small_buckets();  // four buckets: lanes hold one, two or more each
        o.overlap = overlap;
        o.lanes = lanes;
        return o;
      };
      auto const rank = static_cast<std::size_t>(comm.rank());
      for (int lanes = 1; lanes <= 3; ++lanes) {
        model_reducer<local_group::communicator, host_space> reducer(shapes, comm, options(lanes));
        std::vector<float> all;
        for (int s = 0; s < 4; ++s) {
          auto const out = model_step(reducer, shapes, s, comm.rank());
          all.insert(all.end(), out.begin(), out.end());
        }
        results[static_cast<std::size_t>(lanes)][rank] = all;
      }
      model_reducer<local_group::communicator, host_space> two(shapes, comm, options(2));
      for (int s = 0; s < 2; ++s) (void)model_step(two, shapes, s, comm.rank());
      auto const saved = two.save();
      model_reducer<local_group::communicator, host_space> three(shapes, comm, options(3));
      three.restore({saved.data(), saved.size()});
      std::vector<float> all;
      for (int s = 2; s < 4; ++s) {
        auto const out = model_step(three, shapes, s, comm.rank());
        all.insert(all.end(), out.begin(), out.end());
      }
      resumed[rank] = all;
    });
    INFO("overlap " << overlap);
    for (int r = 0; r < ranks; ++r) {
      auto const& one = results[1][static_cast<std::size_t>(r)];
      REQUIRE(!one.empty());
      CHECK(std::memcmp(one.data(), results[2][static_cast<std::size_t>(r)].data(), one.size() * 4) == 0);
      CHECK(std::memcmp(one.data(), results[3][static_cast<std::size_t>(r)].data(), one.size() * 4) == 0);
      CHECK(std::memcmp(one.data(), results[1][0].data(), one.size() * 4) == 0);  // every rank the same bits
      std::size_t const half = one.size() / 2;                                    // steps 2 and 3
      REQUIRE(resumed[static_cast<std::size_t>(r)].size() == one.size() - half);
      CHECK(std::memcmp(one.data() + half, resumed[static_cast<std::size_t>(r)].data(), half * 4) == 0);
    }
  }
}

TEST_CASE("model_reducer, model_reduce_scatterer and handed-over buckets take one bucket rule") {
  // Matrices large and small, vectors large and small, a 4-D tensor, in backward order.
  shapes_t const shapes = {{64, 3, 3, 3}, {64}, {300, 200}, {300}, {10, 10}, {6000}, {4, 4}, {50, 200}};
  for (bool vectors_uncompressed : {true, false}) {
    INFO("vectors_uncompressed " << vectors_uncompressed);
    local_group::run(2, [&](local_group::communicator& comm) {
      model_reducer_options o;
      o.compressor = compressor_spec::parse("thc");
      o.min_compression_elements = 1000;
      o.vectors_uncompressed = vectors_uncompressed;
      o.first_bucket_cap_bytes = o.bucket_cap_bytes = 3000 * sizeof(float);
      model_reducer<local_group::communicator, host_space> all(shapes, comm, o);
      model_reduce_scatterer<local_group::communicator, host_space> sharded(shapes, comm, o);
      // The DDP hook's path: the same buckets handed over one by one, by index and parameters.
      model_buckets<all_reduce_delivery, local_group::communicator, host_space, float> handed(
          "handed", comm, o, host_space{},
          &make_bucket<any_allreducer<local_group::communicator, host_space, float>, local_group::communicator,
                       host_space>);
      std::set<std::size_t> by_plan, by_scatter, by_hand;
      REQUIRE(sharded.buckets() == all.buckets());
      for (std::size_t b = 0; b < all.buckets(); ++b) {
        auto const& params = all.parameters_of(b);
        CHECK(sharded.parameters_of(b) == params);
        bool const compressed = all.bucket(b).spec().name == "thc";
        if (compressed) by_plan.insert(params.begin(), params.end());
        if (sharded.bucket(b).spec().name == "thc") by_scatter.insert(params.begin(), params.end());
        std::vector<std::vector<std::size_t>> held;
        std::size_t n = 0;
        for (std::size_t p : params) held.push_back(shapes[p]), n += all.gradient(p).size();
        std::vector<float> values(n, 0.5f);
        handed.submit_handed(b, span<float>(values.data(), n), params, held, nullptr);
        handed.finish();
        if (handed.bucket(b)->spec().name == "thc") by_hand.insert(params.begin(), params.end());
        CHECK(compressed == takes_compressor(held, n, o));
      }
      CHECK(!by_plan.empty());
      CHECK(by_scatter == by_plan);
      CHECK(by_hand == by_plan);
      // The 6000-element vector is compressed exactly where vectors are not kept apart.
      CHECK(by_plan.count(5) == (vectors_uncompressed ? 0u : 1u));
    });
  }
}

TEST_CASE(
    "a handed-over bucket is built at its first step, again when its parameters change, its compressor after "
    "the warm-up") {
  local_group::run(2, [](local_group::communicator& comm) {
    model_reducer_options o;
    o.compressor = compressor_spec::parse("topkc:fraction=0.5,chunk_size=16");
    o.min_compression_elements = 100;
    o.reduce.warmup_steps = 2;
    model_buckets<all_reduce_delivery, local_group::communicator, host_space, float> core(
        "handed", comm, o, host_space{},
        &make_bucket<any_allreducer<local_group::communicator, host_space, float>, local_group::communicator,
                     host_space>);
    std::vector<float> first(300, 1.0f), second(500, 1.0f);
    CHECK(core.bucket(0) == nullptr);
    core.submit_handed(0, span<float>(first.data(), first.size()), {0, 1}, {{10, 20}, {100}}, nullptr);
    core.finish();  // iteration 0: the warm-up's fp32 mean, no compressor built (or planned) yet
    REQUIRE(core.bucket(0) != nullptr);
    CHECK(core.bucket(0)->description() == "fp32");
    CHECK(core.spec_of(0) == nullptr);
    CHECK(core.bucket(0)->wire_bytes() == 300 * sizeof(float) + sizeof(std::uint64_t));  // the mean and its agreement
    // Iteration 1: bucket 0 now holds other parameters (DDP rebuilt its buckets): still warming up.
    core.submit_handed(0, span<float>(second.data(), second.size()), {0, 2}, {{10, 20}, {300}}, nullptr);
    core.finish();
    CHECK(core.bucket(0)->layout().size() == 500);
    CHECK(core.bucket(0)->description() == "fp32");
    // Iteration 2: the warm-up is over: the compressor is built, starting where the model is.
    core.submit_handed(0, span<float>(second.data(), second.size()), {0, 2}, {{10, 20}, {300}}, nullptr);
    core.finish();
    CHECK(core.bucket(0)->description() == "topkc<bf16>");
    REQUIRE(core.spec_of(0) != nullptr);
    CHECK(core.spec_of(0)->name == "topkc");
    CHECK(core.bucket(0)->steps() == 3);  // two warm-up steps counted, one compressed
    CHECK_FALSE(core.bucket(0)->warming_up());
    CHECK(core.bucket(0)->wire_bytes() < 500 * sizeof(float));  // compressed now
    CHECK(core.steps() == 3);
  });
}

// A state loaded where the framework hands over exactly the saved buckets
// (one DDP bucket, or DDP's final buckets in the same process) continues as
// if never saved; positions known or not.
TEST_CASE("a loaded handed-over bucket handed over again as saved resumes bitwise") {
  for (bool with_positions : {true, false}) {
    INFO("positions " << with_positions);
    local_group::run(3, [&](local_group::communicator& comm) {
      model_reducer_options o;
      o.compressor = compressor_spec::parse("topkc:fraction=0.25,chunk_size=16");
      o.min_compression_elements = 100;
      auto core = [&] {
        return std::make_unique<model_buckets<all_reduce_delivery, local_group::communicator, host_space, float>>(
            "handed", comm, o, host_space{},
            &make_bucket<any_allreducer<local_group::communicator, host_space, float>, local_group::communicator,
                         host_space>);
      };
      std::vector<std::size_t> const positions =
          with_positions ? std::vector<std::size_t>{0, 1} : std::vector<std::size_t>{};
      shapes_t const shapes = {{20, 30}, {30}};
      auto step = [&](auto& c, int s) {
        auto g = random_gradient(700 + static_cast<std::uint64_t>(s), comm.rank(), 630);
        c.submit_handed(0, span<float>(g.data(), g.size()), positions, shapes, nullptr);
        c.finish();
        return g;
      };
      auto whole = core(), first = core();
      for (int s = 0; s < 3; ++s) (void)step(*whole, s), (void)step(*first, s);
      auto const saved = first->save();
      auto resumed = core();
      resumed->load({saved.data(), saved.size()});
      for (int s = 3; s < 6; ++s) {
        auto const a = step(*whole, s), b = step(*resumed, s);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      }
    });
  }
}
