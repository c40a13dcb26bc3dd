// CUDA tests (ctest label `gpu`): the pipeline suite on the CUDA space, and
// host/device parity of the shared math. Exits 77 (skipped) without a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <gradcomp/cuda.cuh>

#include "../common/algorithm_suite.hpp"
#include "../common/compressors.hpp"
#include "../common/powersgd_suite.hpp"
#include "../common/topk_suite.hpp"

#if GRADCOMP_TEST_NCCL
#include <gradcomp/nccl.hpp>
#endif

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

namespace {

using gradcomp::cuda_space;
using gradcomp::host_space;
using cuda_local = gradcomp::testing::setup<cuda_space, gradcomp::testing::local_world>;

struct philox_fill {
  gradcomp::random_stream stream;
  std::uint32_t* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    gradcomp::uint4x32 const words = stream(i);
    for (int w = 0; w < 4; ++w) out[4 * i + w] = words.v[w];
  }
};

struct convert_fill {
  float const* in;
  std::uint16_t* bf16_bits;
  std::uint16_t* fp16_bits;
  float* widened;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    bf16_bits[i] = gradcomp::bfloat16(in[i]).bits;
    fp16_bits[i] = gradcomp::half(in[i]).bits;
    gradcomp::half h;
    h.bits = static_cast<std::uint16_t>(i & 0xffff);
    widened[i] = static_cast<float>(h);
  }
};

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(fp32_mean, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(cast_accuracy, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(aggregators_agree, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(residual_invariant, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(residual_conserves, cuda_space);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_raise, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_propagate, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(config_mismatch, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(lengths, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(wire_bytes, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(select_matches, cuda_space);
TEST_CASE_TEMPLATE_INVOKE(transform_matches, cuda_space);
TEST_CASE_TEMPLATE_INVOKE(transform_gate, cuda_space);
TEST_CASE_TEMPLATE_INVOKE(reduce_matches, cuda_space);
TEST_CASE_TEMPLATE_INVOKE(topkc_mean, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(topk_mean, cuda_local);
TEST_CASE_TEMPLATE_INVOKE(sparse_conserves, cuda_space);
TEST_CASE_TEMPLATE_INVOKE(sparse_bad_input, cuda_local);

TEST_CASE("Philox draws the same words on the device as on the host") {
  std::size_t const n = 1 << 20;
  gradcomp::random_stream const stream(0x1234567890abcdefull, 3, gradcomp::random_stream::shared);
  auto draw = [&](auto const& space) {
    gradcomp::buffer<std::uint32_t, std::remove_cvref_t<decltype(space)>> out(4 * n, space);
    parallel_for(space, n, philox_fill{stream, out.data()});
    return gradcomp::testing::download(space, out.data(), out.size());
  };
  CHECK(draw(cuda_space{}) == draw(host_space{}));
}

TEST_CASE("16-bit conversions round identically on the device and the host") {
  std::size_t const n = 1 << 20;
  std::mt19937 rng(std::random_device{}());
  std::vector<float> inputs(n);
  for (auto& x : inputs) {
    std::uint32_t bits = rng();
    std::memcpy(&x, &bits, 4);
  }
  auto convert = [&](auto const& space) {
    using S = std::remove_cvref_t<decltype(space)>;
    auto in = gradcomp::testing::upload(space, inputs);
    gradcomp::buffer<std::uint16_t, S> bf(n, space), hf(n, space);
    gradcomp::buffer<float, S> widened(n, space);
    parallel_for(space, n, convert_fill{in.data(), bf.data(), hf.data(), widened.data()});
    auto const w = gradcomp::testing::download(space, widened.data(), n);
    std::vector<std::uint32_t> widened_bits(n);
    std::memcpy(widened_bits.data(), w.data(), n * 4);
    return std::tuple(gradcomp::testing::download(space, bf.data(), n),
                      gradcomp::testing::download(space, hf.data(), n), widened_bits);
  };
  CHECK(convert(cuda_space{}) == convert(host_space{}));
}

TEST_CASE("TopK-Chunked and TopK give bitwise the host's selection, output and residual on the device") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::vector<std::vector<float>> host_out(4), device_out(4);
  local_group::run(4, [&](local_group::communicator& comm) {
    std::uint64_t const seed = shared_seed(comm);
    std::size_t const d = (1 << 18) + 77;
    auto run = [&](auto const& space) {
      using S = std::remove_cvref_t<decltype(space)>;
      allreducer<topkc<>, error_feedback::residual, local_group::communicator, allreduce_aggregator, S> a(
          topkc<>{.chunk_size = 128, .fraction = 0.02}, comm, bucket_layout(d), space);
      allreducer<topk<bfloat16>, error_feedback::residual, local_group::communicator, allgather_aggregator, S> b(
          topk<bfloat16>{.fraction = 0.01}, comm, bucket_layout(d), space);
      std::vector<float> all;
      for (int step = 0; step < 3; ++step) {
        auto ga = upload(space, random_gradient(seed + step, comm.rank(), d));
        auto gb = upload(space, random_gradient(seed + step, comm.rank(), d));
        a(ga.view());
        b(gb.view());
        for (auto* v : {ga.data(), gb.data()}) {
          auto const out = download(space, v, d);
          all.insert(all.end(), out.begin(), out.end());
        }
        auto const ra = download(space, a.residual().data(), d), rb = download(space, b.residual().data(), d);
        all.insert(all.end(), ra.begin(), ra.end());
        all.insert(all.end(), rb.begin(), rb.end());
      }
      return all;
    };
    host_out[comm.rank()] = run(host_space{});
    device_out[comm.rank()] = run(cuda_space{});
  });
  for (int r = 0; r < 4; ++r) CHECK(std::memcmp(host_out[r].data(), device_out[r].data(), host_out[r].size() * 4) == 0);
}

TEST_CASE("the bf16 pipeline gives bitwise the host's result on the device") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::vector<std::vector<float>> host_out(4), device_out(4);
  local_group::run(4, [&](local_group::communicator& comm) {
    std::uint64_t const seed = shared_seed(comm);
    std::vector<std::vector<float>> steps;
    for (int s = 0; s < 5; ++s) steps.push_back(random_gradient(seed + s, comm.rank(), 100003));
    host_out[comm.rank()] = reduce_steps<bf16, error_feedback::residual>(comm, host_space{}, steps).back();
    device_out[comm.rank()] = reduce_steps<bf16, error_feedback::residual>(comm, cuda_space{}, steps).back();
  });
  for (int r = 0; r < 4; ++r) CHECK(host_out[r] == device_out[r]);
}

namespace {
// Reduce-scatters `steps` fresh gradients of d elements through `c` (error
// feedback carried across them), on the host and on the device, and checks
// that this rank's shards agree bitwise at every step. `what` names the case.
template <class C>
void expect_device_shards_as_host(std::string const& what, C const& c, gradcomp::local_group::communicator& comm,
                                  std::size_t d, int steps) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  using ef = error_feedback::residual;
  reduce_scatterer<C, ef, local_group::communicator, host_space> on_host(c, comm, bucket_layout(d), host_space{});
  reduce_scatterer<C, ef, local_group::communicator, cuda_space> on_device(c, comm, bucket_layout(d), cuda_space{});
  std::uint64_t const seed = shared_seed(comm);
  for (int step = 0; step < steps; ++step) {
    auto const g = random_gradient(seed + step, comm.rank(), d);
    auto h = g;
    std::vector<float> host_shard(on_host.shard_size());
    on_host({h.data(), d}, {host_shard.data(), host_shard.size()});
    auto dg = upload(cuda_space{}, g);
    buffer<float, cuda_space> device_shard(on_device.shard_size(), cuda_space{});
    on_device(dg.view(), device_shard.view());
    on_device.synchronize();
    INFO(what << ", rank " << comm.rank() << ", step " << step);
    CHECK(download(cuda_space{}, device_shard.data(), device_shard.size()) == host_shard);
  }
}
}  // namespace

TEST_CASE("a bf16 reduce-scatter gives bitwise the host's shard on the device") {
  gradcomp::local_group::run(4, [](gradcomp::local_group::communicator& comm) {
    expect_device_shards_as_host("bf16", gradcomp::bf16{}, comm, 100003, 1);
  });
}

TEST_CASE("a THC reduce-scatter decodes each rank's blocks bitwise as the host does, in both kernels") {
  for (std::size_t block : {std::size_t{256}, std::size_t{64}}) {  // the register kernel, the shared-memory one
    gradcomp::local_group::run(4, [&](gradcomp::local_group::communicator& comm) {
      // 100003 is not a whole number of blocks: the last shard is short.
      expect_device_shards_as_host("thc, block " + std::to_string(block), gradcomp::thc<>{.block = block}, comm, 100003,
                                   3);
    });
  }
}

TEST_CASE("a hierarchical step on bf16 buckets gives bitwise the host's result on the device") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  using C = topkc<>;
  C const c{.chunk_size = 64, .fraction = 0.1};
  local_group::run(4, [&](local_group::communicator& world) {
    std::size_t const d = 100003;
    auto groups = split_nodes(world, 2);
    auto const drawn = random_gradient(shared_seed(world), world.rank(), d);
    std::vector<bfloat16> g(d);
    for (std::size_t i = 0; i < d; ++i) g[i] = bfloat16(drawn[i]);
    for (bool bf16_within_node : {false, true}) {
      hierarchical_options const options{.bf16_within_node = bf16_within_node};
      hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, host_space, bfloat16> on_host(
          c, groups, bucket_layout(d), host_space{}, options);
      hierarchical_allreducer<C, error_feedback::residual, local_group::communicator, cuda_space, bfloat16> on_device(
          c, groups, bucket_layout(d), cuda_space{}, options);
      auto h = g;
      on_host({h.data(), d});
      auto dg = upload(cuda_space{}, g);
      on_device(dg.view());
      on_device.synchronize();
      auto const out = download(cuda_space{}, dg.data(), d);
      INFO((bf16_within_node ? "bf16" : "fp32") << " inside the node");
      CHECK(std::memcmp(out.data(), h.data(), d * sizeof(bfloat16)) == 0);
    }
  });
}

TEST_CASE("a two-level reduce-scatter on bf16 buckets gives bitwise the host's shard on the device") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  using C = thc<>;
  local_group::run(4, [&](local_group::communicator& world) {
    std::size_t const d = 100003;  // uneven: the last parts are short
    auto groups = split_nodes(world, 2);
    std::uint64_t const seed = shared_seed(world);
    for (bool bf16_within_node : {false, true}) {
      hierarchical_options const options{.bf16_within_node = bf16_within_node};
      using host_scatterer =
          hierarchical_reduce_scatterer<C, error_feedback::residual, local_group::communicator, host_space, bfloat16>;
      using device_scatterer =
          hierarchical_reduce_scatterer<C, error_feedback::residual, local_group::communicator, cuda_space, bfloat16>;
      host_scatterer on_host(C{}, groups, bucket_layout(d), host_space{}, options);
      device_scatterer on_device(C{}, groups, bucket_layout(d), cuda_space{}, options);
      for (int step = 0; step < 3; ++step) {
        auto const drawn = random_gradient(seed + step, world.rank(), d);
        std::vector<bfloat16> g(d), shard(on_host.shard_size());
        for (std::size_t i = 0; i < d; ++i) g[i] = bfloat16(drawn[i]);
        auto dg = upload(cuda_space{}, g);
        on_host({g.data(), d}, {shard.data(), shard.size()});
        buffer<bfloat16, cuda_space> ds(on_device.shard_size(), cuda_space{});
        on_device(dg.view(), ds.view());
        on_device.synchronize();
        auto const out = download(cuda_space{}, ds.data(), ds.size());
        INFO((bf16_within_node ? "bf16" : "fp32") << " inside the node, step " << step);
        CHECK(std::memcmp(out.data(), shard.data(), shard.size() * sizeof(bfloat16)) == 0);
      }
    }
  });
}

namespace {

// Captures `step` on `stream` into a CUDA Graph and replays it once. The
// capture is in global mode, where any call that waits for the host (a stream
// or event synchronization, a blocking copy) or allocates makes the capture
// fail: that a step captures at all shows it never waits.
template <class Step>
void replay_captured(cudaStream_t stream, Step&& step) {
  cudaGraph_t graph = nullptr;
  GRADCOMP_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step();
  GRADCOMP_CUDA_TRY(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  GRADCOMP_CUDA_TRY(cudaGraphInstantiate(&exec, graph, 0));
  GRADCOMP_CUDA_TRY(cudaGraphLaunch(exec, stream));
  GRADCOMP_CUDA_TRY(cudaStreamSynchronize(stream));
  GRADCOMP_CUDA_TRY(cudaGraphExecDestroy(exec));
  GRADCOMP_CUDA_TRY(cudaGraphDestroy(graph));
}

// Runs two steps of compressor c eagerly on one allreducer, and on another
// the first step eagerly and the second captured into a CUDA Graph and
// replayed (see replay_captured); compares both second steps' outputs and
// residuals.
template <class C>
void check_captured_step(C const& c, gradcomp::bucket_layout const& layout,
                         gradcomp::allreducer_options const& options = {}) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  cudaStream_t stream = nullptr;
  GRADCOMP_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    cuda_space const space{stream};
    single_rank<cuda_space> world(space);
    std::size_t const d = layout.size();
    auto const first = random_gradient(11, 0, d), second = random_gradient(12, 0, d);
    // With error feedback, but where the compressor bounds its error (QSGD,
    // GlobalRandK): feedback on 300001 coordinates is no contraction there,
    // and refused.
    constexpr bool bounded = requires(C const& x, bucket_layout const& l) { x.error_bound(l); };
    using EF = std::conditional_t<bounded, error_feedback::none, error_feedback::residual>;
    allreducer<C, EF, single_rank<cuda_space>> eager(c, world, layout, space, options),
        captured(c, world, layout, space, options);
    auto e1 = upload(space, first), e2 = upload(space, second), c1 = upload(space, first), c2 = upload(space, second);
    eager(e1.view());
    eager(e2.view());
    eager.synchronize();
    captured(c1.view());
    captured.synchronize();
    replay_captured(stream, [&] { captured(c2.view()); });
    CHECK_NOTHROW(captured.synchronize());
    INFO(std::string(C::name));
    CHECK(download(space, e2.data(), d) == download(space, c2.data(), d));
    if constexpr (EF::enabled) {
      auto const re = download(space, eager.residual().data(), d), rc = download(space, captured.residual().data(), d);
      CHECK(std::memcmp(re.data(), rc.data(), d * sizeof(float)) == 0);
    }
  }
  GRADCOMP_CUDA_TRY(cudaStreamDestroy(stream));
}

}  // namespace

// A step of every compressor captures into a CUDA Graph (so nothing in it
// waits for the host or allocates) and replays with the eager result.
TEST_CASE("a step captures into a CUDA Graph and replays with the same result") {
  using namespace gradcomp;
  bucket_layout const flat(300001);
  bucket_layout matrices;
  matrices.add({300, 200}).add({200}).add({64, 300});
  for_each_registered([&]<class C>(std::type_identity<C>) {
    C c{};  // the defaults, a little smaller where a step would be all one chunk or coordinate set
    if constexpr (std::is_same_v<C, topkc<>>) c.chunk_size = 64;
    if constexpr (std::is_same_v<C, global_randk<>>) c.k = 1000;
    if constexpr (std::is_same_v<C, powersgd<>>) c.matrix_rank = 4;
    check_captured_step(c, C::sharding == shard_kind::tensors ? matrices : flat);  // matrices for PowerSGD
  });
  check_captured_step(thc<>{}, flat, {.warmup_steps = 3});  // a warm-up step captures too
}

// 16-bit gradients on the device: the widened streams and THC's 16-bit
// loads give the fp32 bucket's result rounded once, with the same residual.
// A reduce-scatter step, padding included (the bucket is not a whole number
// of THC blocks), captures too: its copies and the reduce-scatter are all
// enqueued on the stream.
TEST_CASE("a reduce-scatter step captures into a CUDA Graph and replays with the same shard") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  cudaStream_t stream = nullptr;
  GRADCOMP_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    cuda_space const space{stream};
    single_rank<cuda_space> world(space);
    std::size_t const d = 300001;
    using scatterer = reduce_scatterer<thc<>, error_feedback::residual, single_rank<cuda_space>>;
    scatterer eager(thc<>{}, world, bucket_layout(d), space), captured(thc<>{}, world, bucket_layout(d), space);
    REQUIRE(eager.padded_layout().size() > d);
    auto const first = random_gradient(21, 0, d), second = random_gradient(22, 0, d);
    auto e1 = upload(space, first), e2 = upload(space, second), c1 = upload(space, first), c2 = upload(space, second);
    buffer<float, cuda_space> es(eager.shard_size(), space), cs(captured.shard_size(), space);
    eager(e1.view(), es.view());
    eager(e2.view(), es.view());
    eager.synchronize();
    captured(c1.view(), cs.view());
    captured.synchronize();
    replay_captured(stream, [&] { captured(c2.view(), cs.view()); });
    CHECK_NOTHROW(captured.synchronize());
    CHECK(download(space, es.data(), es.size()) == download(space, cs.data(), cs.size()));
  }
  GRADCOMP_CUDA_TRY(cudaStreamDestroy(stream));
}

// The two-level reduce-scatter's step (the node's reduce-scatter, the rail's
// compressed one, the shard's rounding to bf16) captures too: one node of one
// rank runs every stage of it.
TEST_CASE("a two-level reduce-scatter step captures into a CUDA Graph and replays with the same shard") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  cudaStream_t stream = nullptr;
  GRADCOMP_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    cuda_space const space{stream};
    single_rank<cuda_space> world(space);
    auto groups = split_nodes(world, 1);
    std::size_t const d = 300001;
    using scatterer =
        hierarchical_reduce_scatterer<thc<>, error_feedback::residual, single_rank<cuda_space>, cuda_space, bfloat16>;
    hierarchical_options const options{.bf16_within_node = true};
    scatterer eager(thc<>{}, groups, bucket_layout(d), space, options),
        captured(thc<>{}, groups, bucket_layout(d), space, options);
    auto narrow = [](std::vector<float> const& x) {
      std::vector<bfloat16> out(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) out[i] = bfloat16(x[i]);
      return out;
    };
    auto const first = narrow(random_gradient(31, 0, d)), second = narrow(random_gradient(32, 0, d));
    auto e1 = upload(space, first), e2 = upload(space, second), c1 = upload(space, first), c2 = upload(space, second);
    buffer<bfloat16, cuda_space> es(eager.shard_size(), space), cs(captured.shard_size(), space);
    eager(e1.view(), es.view());
    eager(e2.view(), es.view());
    eager.synchronize();
    captured(c1.view(), cs.view());
    captured.synchronize();
    replay_captured(stream, [&] { captured(c2.view(), cs.view()); });
    CHECK_NOTHROW(captured.synchronize());
    auto const a = download(space, es.data(), es.size()), b = download(space, cs.data(), cs.size());
    CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(bfloat16)) == 0);
  }
  GRADCOMP_CUDA_TRY(cudaStreamDestroy(stream));
}

namespace {

// Reduces the same values stored as G and as fp32 on the device, step after
// step: the 16-bit bucket must end as the fp32 one rounded once, with the
// same residual.
template <class G, class C>
void check_16bit_on_device(C const& c, gradcomp::bucket_layout const& layout, int steps, std::uint64_t seed) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  using reducer = allreducer<C, error_feedback::residual, single_rank<cuda_space>>;
  cuda_space const space{};
  single_rank<cuda_space> world(space);
  std::size_t const d = layout.size();
  reducer wide(c, world, layout, space), narrow(c, world, layout, space);
  for (int step = 0; step < steps; ++step) {
    auto const drawn = random_gradient(seed + step, 0, d);
    std::vector<G> g16(d);
    std::vector<float> g32(d);
    for (std::size_t i = 0; i < d; ++i) g16[i] = G(drawn[i]), g32[i] = static_cast<float>(g16[i]);
    auto x = upload(space, g32);
    auto y = upload(space, g16);
    wide(x.view());
    narrow(y.view());
    auto const a = download(space, x.data(), d);
    auto const b = download(space, y.data(), d);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < d; ++i) wrong += G(a[i]).bits == b[i].bits ? 0 : 1;
    INFO(std::string(C::name) << ", " << d << " elements, step " << step);
    CHECK(wrong == 0);
    auto const ra = download(space, wide.residual().data(), d), rb = download(space, narrow.residual().data(), d);
    CHECK(std::memcmp(ra.data(), rb.data(), d * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("16-bit gradients on the device: the fp32 result rounded once, the same residual") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  // (THC's register kernels need blocks of 256 and more: below.)
  for_each_compressor([](auto c, double) { check_16bit_on_device<bfloat16>(c, odd_layout(40), 3, 90); });
  // THC's register kernels (blocks of 256 to 4096) load and store 16-bit gradients eight at a time.
  for (std::size_t block : {256u, 1024u, 4096u})
    check_16bit_on_device<gradcomp::half>(thc<>{.block = block}, bucket_layout(3 * block + 77), 1, 7);
}

// A run saved on the device and restored into new allreducers continues
// bitwise, warm-up position, residual and compressor state included.
TEST_CASE("a checkpoint on the device continues a run bitwise") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  auto check = [](auto c, bucket_layout const& layout) {
    using C = decltype(c);
    using reducer = allreducer<C, error_feedback::residual, single_rank<cuda_space>>;
    cuda_space const space{};
    single_rank<cuda_space> world(space);
    std::size_t const d = layout.size();
    allreducer_options const options{.warmup_steps = 1};
    reducer whole(c, world, layout, space, options);
    auto first = std::make_unique<reducer>(c, world, layout, space, options);
    std::vector<float> a, b;
    for (int step = 0; step < 5; ++step) {
      if (step == 3) {
        auto const saved = first->save();
        first = std::make_unique<reducer>(c, world, layout, space, options);
        first->restore(span<std::byte const>(saved.data(), saved.size()));
      }
      auto const g = random_gradient(60 + step, 0, d);
      auto x = upload(space, g), y = upload(space, g);
      whole(x.view());
      (*first)(y.view());
      a = download(space, x.data(), d);
      b = download(space, y.data(), d);
    }
    INFO(std::string(C::name));
    CHECK(std::memcmp(a.data(), b.data(), d * sizeof(float)) == 0);
    auto const ra = download(space, whole.residual().data(), d), rb = download(space, first->residual().data(), d);
    CHECK(std::memcmp(ra.data(), rb.data(), d * sizeof(float)) == 0);
  };
  bucket_layout const flat(100003);
  check(bf16{}, flat);
  check(topkc<>{.chunk_size = 64}, flat);
  check(thc<>{}, flat);
  check(intsgd<>{}, flat);
  bucket_layout matrices;
  matrices.add({300, 200}).add({200}).add({64, 300});
  check(powersgd<>{.matrix_rank = 4}, matrices);
}

// The model reducer on the device: gradients written on a compute stream,
// buckets reduced on the collective's stream after events, finish() ordering
// the compute stream after them; bitwise the host's result.
TEST_CASE("the model reducer on the device gives bitwise the host's result") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::vector<std::vector<std::size_t>> const shapes = {{300, 200}, {200}, {64, 300}, {64}, {100, 100}};
  model_reducer_options options;
  options.compressor = compressor_spec::parse("topkc:fraction=0.1,chunk_size=64");
  options.first_bucket_cap_bytes = options.bucket_cap_bytes = 30000 * sizeof(float);
  options.min_compression_elements = 1000;
  cudaStream_t compute = nullptr, comm = nullptr;
  GRADCOMP_CUDA_TRY(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  GRADCOMP_CUDA_TRY(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
  {
    single_rank<host_space> host_world;
    single_rank<cuda_space> device_world(cuda_space{comm});
    model_reducer<single_rank<host_space>, host_space> on_host(shapes, host_world, options);
    model_reducer<single_rank<cuda_space>, cuda_space> on_device(shapes, device_world, options, cuda_space{compute});
    REQUIRE(on_device.buckets() == on_host.buckets());
    for (int step = 0; step < 3; ++step) {
      for (std::size_t p = shapes.size(); p-- > 0;) {
        std::vector<float> const g = random_gradient(70 + step * 10 + p, 0, on_host.gradient(p).size());
        std::copy(g.begin(), g.end(), on_host.gradient(p).data());
        GRADCOMP_CUDA_TRY(cudaMemcpyAsync(on_device.gradient(p).data(), g.data(), g.size() * sizeof(float),
                                          cudaMemcpyHostToDevice, compute));
        on_host.mark_ready(p);
        on_device.mark_ready(p);
      }
      on_host.finish();
      on_device.finish();
      GRADCOMP_CUDA_TRY(cudaStreamSynchronize(compute));  // finish() ordered the compute stream after the buckets
      for (std::size_t p = 0; p < shapes.size(); ++p) {
        auto const d = on_device.gradient(p);
        std::vector<float> got(d.size());
        GRADCOMP_CUDA_TRY(cudaMemcpy(got.data(), d.data(), d.size() * sizeof(float), cudaMemcpyDeviceToHost));
        INFO("step " << step << ", parameter " << p);
        CHECK(std::memcmp(got.data(), on_host.gradient(p).data(), d.size() * sizeof(float)) == 0);
      }
    }
  }
  GRADCOMP_CUDA_TRY(cudaStreamDestroy(compute));
  GRADCOMP_CUDA_TRY(cudaStreamDestroy(comm));
}

// The test above can fail: a host wait inside a capture does break it.
TEST_CASE("capturing a host wait fails, as the capture test relies on") {
  cudaStream_t stream = nullptr;
  GRADCOMP_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  GRADCOMP_CUDA_TRY(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaStreamSynchronize(stream) != cudaSuccess);
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamEndCapture(stream, &graph) != cudaSuccess);  // the capture was invalidated
  cudaGetLastError();
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// On the device a bad step is reported at the next call, on every rank, with
// the gradient and the residual untouched and the step not counted.
TEST_CASE("the CUDA space reports a bad step at the next call, before enqueuing anything") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(2, [](local_group::communicator& comm) {
    cuda_space const space{};
    std::size_t const d = 10000;
    allreducer<bf16, error_feedback::residual, local_group::communicator, allreduce_aggregator, cuda_space> reduce(
        bf16{}, comm, bucket_layout(d), space);
    auto clean = upload(space, random_gradient(1, comm.rank(), d));
    reduce(clean.view());
    auto const residual = download(space, reduce.residual().data(), d);
    auto g = random_gradient(2, comm.rank(), d);
    if (comm.rank() == 1) g[9] = std::numeric_limits<float>::infinity();
    auto bad = upload(space, g);
    CHECK_NOTHROW(reduce(bad.view()));  // enqueued; the verdict is on its way
    auto next = upload(space, random_gradient(3, comm.rank(), d));
    auto const next_before = download(space, next.data(), d);
    CHECK_THROWS_AS(reduce(next.view()), nonfinite_error);
    CHECK(download(space, next.data(), d) == next_before);  // nothing was enqueued for it
    auto const g_after = download(space, bad.data(), d);
    CHECK(std::memcmp(g_after.data(), g.data(), d * sizeof(float)) == 0);
    auto const residual_after = download(space, reduce.residual().data(), d);
    CHECK(std::memcmp(residual_after.data(), residual.data(), d * sizeof(float)) == 0);
    CHECK(reduce.steps() == 1);
    CHECK_NOTHROW(settled_step(reduce, next.view()));
    CHECK(reduce.steps() == 2);
  });
}

#if GRADCOMP_TEST_NCCL
// One GPU allows one NCCL rank: the backend's calls, types and error
// checks, and the allreducer's default (NCCL on the communicator's stream).
TEST_CASE("the NCCL backend runs the pipeline on one rank") {
  using namespace gradcomp;
  cudaStream_t stream;
  GRADCOMP_CUDA_TRY(cudaStreamCreate(&stream));
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  nccl_communicator comm = nccl_communicator::create(id, 1, 0, stream);
  CHECK(comm.size() == 1);
  cuda_space const space{stream};

  auto ints = testing::upload(space, std::vector<std::int32_t>{1, -2, 3});
  comm.all_reduce(ints.data(), ints.data(), 3, reduce_op::max);
  comm.wait(std::chrono::seconds(60));
  CHECK(testing::download(space, ints.data(), 3) == std::vector<std::int32_t>{1, -2, 3});

  std::vector<float> const g = testing::random_gradient(7, 0, 100000);
  nccl_allreducer<bf16, error_feedback::residual> reduce(bf16{}, comm, bucket_layout(g.size()));  // cuda_space
  auto gradient = testing::upload(space, g);
  reduce(gradient.view());
  comm.wait(std::chrono::seconds(60));
  auto const out = testing::download(space, gradient.data(), g.size());
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < g.size(); ++i) mismatches += out[i] == static_cast<float>(bfloat16(g[i])) ? 0 : 1;
  CHECK(mismatches == 0);
  CHECK(reduce.wire_bytes() == g.size() * 2 + 8);
  GRADCOMP_CUDA_TRY(cudaStreamDestroy(stream));
}
#endif

int main(int argc, char** argv) {
  if (!gradcomp::cuda_device_available()) {
    std::puts("no CUDA device: skipping the gpu tests");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
