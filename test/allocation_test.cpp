// The steady-state step allocates nothing, in every reducer: a global
// operator new that counts, armed around many steps after a few warm-up
// ones (the first steps may size what the collectives keep), for every
// registered compressor in allreducer, reduce_scatterer (those that shard by
// elements), the two-level reducers, and the model-level reducers (with and
// without overlap, flat and in two levels, on one lane or two, buckets from
// a plan or handed over as the DDP hook hands them, 16-bit ones too).
#include "common/compressors.hpp"
#include "common/harness.hpp"

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <type_traits>
#include <vector>

namespace {
std::atomic<bool> armed{false};
std::atomic<std::size_t> allocations{0};

void* counted(std::size_t n) {
  if (armed.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* counted_aligned(std::size_t n, std::align_val_t a) {
  if (armed.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  std::size_t const align = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t n) { return counted(n); }
void* operator new[](std::size_t n) { return counted(n); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace gradcomp;
using namespace gradcomp::testing;

namespace {

constexpr int warmup_steps = 3, counted_steps = 40;

// Runs `step` warm-up times, then counts the allocations of `counted_steps`
// more on every rank of `comm` together (a barrier before and after).
template <class Collective, class Step>
std::size_t allocations_of(Collective& comm, Step&& step) {
  for (int s = 0; s < warmup_steps; ++s) step();
  std::uint64_t word[1] = {0};
  comm.all_reduce(word, word, 1, reduce_op::sum);
  if (comm.rank() == 0) allocations = 0, armed = true;
  comm.all_reduce(word, word, 1, reduce_op::sum);
  for (int s = 0; s < counted_steps; ++s) step();
  comm.all_reduce(word, word, 1, reduce_op::sum);
  if (comm.rank() == 0) armed = false;
  comm.all_reduce(word, word, 1, reduce_op::sum);
  return allocations.load();
}

}  // namespace

TEST_CASE("allreducer and reduce_scatterer steps allocate nothing, for every compressor") {
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    INFO(std::string(C::name));
    std::size_t reduced = 0, scattered = 0;
    local_group::run(3, [&](local_group::communicator& comm) {
      bucket_layout const layout = odd_layout(4);
      std::size_t const d = layout.size();
      auto const g = random_gradient(5, comm.rank(), d);
      std::vector<float> gradient(d);
      host_reducer<C, error_feedback::residual, local_group::communicator> reduce(c, comm, layout, host_space{});
      std::size_t const n = allocations_of(comm, [&] {
        std::copy(g.begin(), g.end(), gradient.begin());
        reduce({gradient.data(), d});
      });
      if (comm.rank() == 0) reduced = n;
      if constexpr (detail::shards_by_elements<C>) {
        reduce_scatterer<C, error_feedback::residual, local_group::communicator, host_space> scatter(c, comm, layout,
                                                                                                     host_space{});
        std::vector<float> shard(scatter.shard_size());
        std::size_t const m = allocations_of(comm, [&] {
          std::copy(g.begin(), g.end(), gradient.begin());
          scatter({gradient.data(), d}, {shard.data(), shard.size()});
        });
        if (comm.rank() == 0) scattered = m;
      }
    });
    CHECK(reduced == 0);
    CHECK(scattered == 0);
  });
}

TEST_CASE("two-level steps allocate nothing, all-reduce and reduce-scatter") {
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    if constexpr (detail::shards_in_two_levels<C>) {
      INFO(std::string(C::name));
      std::size_t reduced = 0, scattered = 0;
      local_group::run(4, [&](local_group::communicator& world) {
        auto groups = split_nodes(world, 2);
        bucket_layout const layout = odd_layout(4);
        std::size_t const d = layout.size();
        auto const g = random_gradient(6, world.rank(), d);
        std::vector<float> gradient(d);
        hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space> reduce(
            c, groups, layout, host_space{});
        std::size_t const n = allocations_of(world, [&] {
          std::copy(g.begin(), g.end(), gradient.begin());
          reduce({gradient.data(), d});
        });
        if (world.rank() == 0) reduced = n;
        if constexpr (detail::shards_by_elements<C>) {
          hierarchical_reduce_scatterer<C, error_feedback::residual, local_group::communicator, host_space> scatter(
              c, groups, layout, host_space{});
          std::vector<float> shard(scatter.shard_size());
          std::size_t const m = allocations_of(world, [&] {
            std::copy(g.begin(), g.end(), gradient.begin());
            scatter({gradient.data(), d}, {shard.data(), shard.size()});
          });
          if (world.rank() == 0) scattered = m;
        }
      });
      CHECK(reduced == 0);
      CHECK(scattered == 0);
    }
  });
}

TEST_CASE(
    "model_reducer and model_reduce_scatterer steps allocate nothing: overlap or not, flat or two levels, "
    "one lane or two") {
  std::vector<std::vector<std::size_t>> const shapes = {{10, 256}, {10}, {256, 300}, {256}, {64, 64}};
  for (bool overlap : {true, false})
    for (bool two_levels : {false, true})
      for (int lanes : {1, 2})
        for (bool scatter : {false, true}) {
          std::string const what = std::string(overlap ? "overlap" : "no overlap") +
                                   (two_levels ? ", two levels" : ", flat") + ", " + std::to_string(lanes) + " lanes" +
                                   (scatter ? ", reduce-scatter" : "");
          INFO(what);
          model_reducer_options options;
          options.compressor = compressor_spec::parse("topkc:fraction=0.25,chunk_size=64");
          options.min_compression_elements = 1000;
          options.bucket_cap_bytes = options.first_bucket_cap_bytes = 8192;
          options.overlap = overlap;
          options.lanes = lanes;
          std::size_t counted = 0;
          local_group::run(4, [&](local_group::communicator& world) {
            auto step_of = [&](auto& reducer) {
              return [&] {
                for (std::size_t p = shapes.size(); p-- > 0;) {  // the backward pass: last layer first
                  auto g = reducer.gradient(p);
                  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 1e-3f * static_cast<float>((i + p) % 7);
                  reducer.mark_ready(p);
                }
                reducer.finish();
              };
            };
            auto count = [&](auto& world_or_groups) {
              if (scatter) {
                model_reduce_scatterer<local_group::communicator, host_space> reducer(shapes, world_or_groups, options);
                return allocations_of(world, step_of(reducer));
              }
              model_reducer<local_group::communicator, host_space> reducer(shapes, world_or_groups, options);
              return allocations_of(world, step_of(reducer));
            };
            std::size_t n = 0;
            if (two_levels) {
              auto groups = split_nodes(world, 2);
              n = count(groups);
            } else {
              n = count(world);
            }
            if (world.rank() == 0) counted = n;
          });
          CHECK(counted == 0);
        }
}

// The DDP hook's path: buckets handed over by index as DDP stores them, 16-bit
// ones reduced as they are (no fp32 copy of a bucket, which would allocate),
// on two lanes.
TEST_CASE("handed-over buckets, 16-bit ones too, step without allocating") {
  auto run = [&]<class G>(std::type_identity<G>) {
    model_reducer_options options;
    options.compressor = compressor_spec::parse("thc:bits=4,block=64");
    options.min_compression_elements = 1000;
    options.lanes = 2;
    std::vector<std::vector<std::size_t>> const first = {{64, 40}, {64}}, second = {{30, 100}};
    std::size_t counted = 0;
    local_group::run(4, [&](local_group::communicator& world) {
      model_buckets<all_reduce_delivery, local_group::communicator, host_space, G> core(
          "handed", world, options, host_space{.threads = 1},
          &make_bucket<any_allreducer<local_group::communicator, host_space, G>, local_group::communicator,
                       host_space>);
      std::vector<G> a(64 * 40 + 64, G(0.25f)), b(3000, G(-0.5f));
      std::vector<std::size_t> const pa = {0, 1}, pb = {2};
      std::size_t const n = allocations_of(world, [&] {
        core.submit_handed(0, span<G>(a.data(), a.size()), pa, first, nullptr);
        core.submit_handed(1, span<G>(b.data(), b.size()), pb, second, nullptr);
        core.finish();
      });
      if (world.rank() == 0) counted = n;
    });
    CHECK(counted == 0);
  };
  run(std::type_identity<bfloat16>{});
  run(std::type_identity<half>{});
  run(std::type_identity<float>{});
}
