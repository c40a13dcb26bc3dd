// The c10d backend's tests: a Python module (gradcomp_c10d_tests) whose
// run() executes these doctest cases over a torch.distributed process group.
// test/torch/c10d_test.py starts the ranks (gloo over a FileStore) and calls
// it in each; a rank's cases see the group through c10d_world.
#define DOCTEST_CONFIG_IMPLEMENT
#include <gradcomp/collectives/c10d.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../common/compressors.hpp"
#include "../common/model_reducer_suite.hpp"
#include "../common/powersgd_suite.hpp"
#include "../common/quantize_suite.hpp"
#include "../common/topk_suite.hpp"

namespace gradcomp::testing {
namespace {

c10::intrusive_ptr<c10d::ProcessGroup> the_group;  // set by run()

// This process is one rank of the group.
struct c10d_world {
  template <class Body>
  void run(Body&& body) const {
    c10d_communicator comm(the_group);
    body(comm);
  }
};

using host_c10d = setup<host_space, c10d_world>;

// Rank r's contribution to element i of a test of type T: small values, so
// that a sum in any order is exact; above 2^31 for the unsigned max and min,
// where signed order differs.
template <class T>
T contribution(int r, std::size_t i, reduce_op op) {
  if constexpr (std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::uint64_t>) {
    if (op != reduce_op::sum) return static_cast<T>((T{1} << (sizeof(T) * 8 - 1)) + (r * 7 + i * 13) % 29);
  }
  int const v = static_cast<int>((r * 5 + i * 3) % 11) - (std::is_signed_v<T> || !std::is_integral_v<T> ? 5 : 0);
  return static_cast<T>(static_cast<float>(v));
}

template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
void check_all_reduce(c10d_communicator& comm, reduce_op op, bool in_place) {
  std::size_t const n = 1000;
  std::vector<T> send(n), recv(n, contribution<T>(99, 0, op));
  for (std::size_t i = 0; i < n; ++i) send[i] = contribution<T>(comm.rank(), i, op);
  T* out = in_place ? send.data() : recv.data();
  comm.all_reduce(send.data(), out, n, op);
  bool same = true;
  for (std::size_t i = 0; i < n; ++i) {
    using A = detail::accumulator_t<T>;
    A expected = static_cast<A>(contribution<T>(0, i, op));
    for (int r = 1; r < comm.size(); ++r)
      expected = detail::combine(expected, static_cast<A>(contribution<T>(r, i, op)), op);
    same = same && static_cast<A>(out[i]) == expected;
  }
  INFO(name_of(dtype_of_v<T>) << " " << name_of(op) << (in_place ? " in place" : ""));
  CHECK(same);
  if (!in_place) {
    bool untouched = true;  // send is the caller's (the sign flip is undone)
    for (std::size_t i = 0; i < n; ++i)
      untouched = untouched && same_bits(send[i], contribution<T>(comm.rank(), i, op));
    CHECK(untouched);
  }
}

template <class T>
void check_moves(c10d_communicator& comm) {
  int const size = comm.size(), rank = comm.rank();
  std::size_t const n = 37;
  // Small values: a sum of a few is exact in every type (int8 and bf16 too).
  auto value = [](int r, std::size_t i) { return static_cast<T>(static_cast<float>((r * 3 + i) % 25)); };
  INFO(name_of(dtype_of_v<T>));
  for (bool in_place : {false, true}) {
    std::vector<T> all(n * size, static_cast<T>(-1.0f));
    std::vector<T> mine(n);
    for (std::size_t i = 0; i < n; ++i) (in_place ? all[rank * n + i] : mine[i]) = value(rank, i);
    comm.all_gather(in_place ? all.data() + rank * n : mine.data(), all.data(), n);
    bool same = true;
    for (int r = 0; r < size; ++r)
      for (std::size_t i = 0; i < n; ++i) same = same && same_bits(all[r * n + i], value(r, i));
    CHECK_MESSAGE(same, std::string(in_place ? "all_gather in place" : "all_gather"));
  }
  for (int root = 0; root < size; ++root) {
    std::vector<T> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = value(rank, i);
    comm.broadcast(b.data(), n, root);
    bool same = true;
    for (std::size_t i = 0; i < n; ++i) same = same && same_bits(b[i], value(root, i));
    CHECK_MESSAGE(same, ("broadcast from " + std::to_string(root)));
  }
  for (bool in_place : {false, true}) {
    std::vector<T> send(n * size), recv(n, static_cast<T>(-1.0f));
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = value(rank, i);
    T* out = in_place ? send.data() + rank * n : recv.data();
    comm.reduce_scatter(send.data(), out, n, reduce_op::sum);
    bool same = true;
    for (std::size_t i = 0; i < n; ++i) {
      double expected = 0;
      for (int r = 0; r < size; ++r) expected += static_cast<double>(static_cast<float>(value(r, rank * n + i)));
      same = same && static_cast<double>(static_cast<float>(out[i])) == expected;
    }
    CHECK_MESSAGE(same, std::string(in_place ? "reduce_scatter in place" : "reduce_scatter"));
  }
}

template <class... T>
void check_every_type(c10d_communicator& comm) {
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min})
    for (bool in_place : {false, true}) (check_all_reduce<T>(comm, op, in_place), ...);
  (check_moves<T>(comm), ...);
}

// Gradients of small dyadic values: every sum of a few of them is exact in
// fp32 and bf16 whatever the order, so a backend that adds in another order
// than local_group still gives bitwise its result.
std::vector<float> dyadic_gradient(std::uint64_t seed, int rank, std::size_t n) {
  std::mt19937_64 rng(seed * 7919u + static_cast<std::uint64_t>(rank));
  std::uniform_int_distribution<int> v(-31, 31);
  std::vector<float> g(n);
  for (auto& x : g) x = std::ldexp(static_cast<float>(v(rng)), -6);
  return g;
}

}  // namespace
}  // namespace gradcomp::testing

using gradcomp::testing::host_c10d;

using namespace gradcomp;
using gradcomp::testing::the_group;

TEST_CASE("c10d: every wire type and operation against a serial reduction, in place and not") {
  c10d_communicator comm(the_group);
  REQUIRE(comm.size() > 1);
  testing::check_every_type<float, double, half, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t,
                            std::int64_t, std::uint64_t>(comm);
}

TEST_CASE("c10d: every compressor's allreducer equals the same allreducer over local_group on the same inputs") {
  c10d_communicator comm(the_group);
  int const n = comm.size();
  std::uint64_t const seed = testing::shared_seed(comm);
  INFO("seed " << seed);
  bucket_layout const layout = testing::odd_layout(20);
  for_each_registered([&]<class C>(std::type_identity<C>) {
    std::string const name(C::name);
    // TopK-Chunked's chunk scores are bf16 sums, which gloo rounds after each
    // addition and local_group once: the chosen chunks could differ. With
    // every chunk chosen, the values' path is compared bitwise.
    compressor_spec const spec = compressor_spec::parse(name == "topkc"          ? "topkc:fraction=1"
                                                        : name == "global_randk" ? "global_randk:k=1000"
                                                                                 : name);
    INFO(name);
    // PowerSGD's products are not small dyadic values: its sums round, in
    // the backend's order.
    bool const exact = name != "powersgd";
    any_allreducer<c10d_communicator, host_space> over_c10d(spec, comm, layout, host_space{});
    std::vector<std::vector<float>> local(static_cast<std::size_t>(n));
    std::vector<std::vector<float>> mine_steps;
    for (int step = 0; step < 2; ++step) {
      auto g = testing::dyadic_gradient(seed + step, comm.rank(), layout.size());
      over_c10d({g.data(), g.size()});
      mine_steps.push_back(g);
    }
    local_group::run(n, [&](local_group::communicator& c) {
      any_allreducer<local_group::communicator, host_space> r(spec, c, layout, host_space{1});
      for (int step = 0; step < 2; ++step) {
        auto g = testing::dyadic_gradient(seed + step, c.rank(), layout.size());
        r({g.data(), g.size()});
        if (c.rank() == comm.rank()) local[static_cast<std::size_t>(step)] = g;
      }
    });
    for (int step = 0; step < 2; ++step) {
      auto const& a = mine_steps[static_cast<std::size_t>(step)];
      auto const& b = local[static_cast<std::size_t>(step)];
      INFO("step " << step);
      if (exact) {
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
      } else {
        double worst = 0;
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
        CHECK(worst <= 1e-4);
      }
      CHECK(testing::same_as_rank0(comm, a));
    }
  });
}

TEST_CASE("c10d: split makes nodes, and the hierarchical allreducer over them agrees on every rank") {
  c10d_communicator world(the_group);
  if (world.size() % 2 != 0) return;
  auto groups = split_nodes(world, 2);
  CHECK(groups.local.size() == 2);
  CHECK(groups.local.rank() == world.rank() % 2);
  CHECK(groups.cross.size() == world.size() / 2);
  CHECK(groups.cross.rank() == world.rank() / 2);
  std::int32_t const mine = world.rank();
  std::vector<std::int32_t> node(2);
  groups.local.all_gather(&mine, node.data(), 1);
  CHECK(node[0] == world.rank() / 2 * 2);
  CHECK(node[1] == world.rank() / 2 * 2 + 1);
  // Keys that reorder a color's ranks are refused on every rank.
  CHECK_THROWS_WITH_AS(world.split(0, world.size() - world.rank()), doctest::Contains("keys must keep"),
                       invalid_argument);

  bucket_layout const layout(4099);
  any_allreducer<c10d_communicator, host_space> r(compressor_spec::parse("thc"), groups, layout, host_space{});
  auto g = testing::random_gradient(5, world.rank(), layout.size());
  r({g.data(), g.size()});
  CHECK(testing::same_as_rank0(world, g));
}

TEST_CASE_TEMPLATE_INVOKE(fp32_mean, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(cast_accuracy, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(aggregators_agree, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(residual_invariant, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_raise, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(nonfinite_propagate, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(config_mismatch, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(lengths, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(wire_bytes, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(topkc_mean, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(topk_mean, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(sparse_bad_input, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(psgd_ranks, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(quantize_homomorphic, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(quantize_agreement, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(quantize_bad_input, host_c10d);
TEST_CASE_TEMPLATE_INVOKE(model_any_order, host_c10d);  // its progress thread makes the group's calls

PYBIND11_MODULE(gradcomp_c10d_tests, m) {
  // Runs the cases on this rank of `group`; returns the number that failed.
  m.def("run", [](c10::intrusive_ptr<c10d::ProcessGroup> group, std::vector<std::string> args) {
    pybind11::gil_scoped_release release;
    the_group = std::move(group);
    std::vector<char const*> argv{"gradcomp_c10d_tests"};
    for (auto const& a : args) argv.push_back(a.c_str());
    doctest::Context context(static_cast<int>(argv.size()), argv.data());
    if (the_group->getRank() != 0) context.setOption("minimal", true);
    int const failed = context.run();
    the_group.reset();
    return failed;
  });
  // gradcomp's allreducer for `spec` over local_group (in-process ranks),
  // with the bucket options the DDP hook gives bucket `index`: the steps
  // `history[step][rank]`; returns `rank`'s output of the last step.
  m.def("local_allreduce", [](std::string const& spec, std::vector<std::vector<std::int64_t>> const& shapes,
                              std::size_t index, std::vector<std::vector<at::Tensor>> const& history, int rank) {
    bucket_layout layout;
    for (auto const& s : shapes) layout.add(std::vector<std::size_t>(s.begin(), s.end()));
    int const ranks = static_cast<int>(history.front().size());
    at::Tensor out;
    pybind11::gil_scoped_release release;
    local_group::run(ranks, [&](local_group::communicator& c) {
      allreducer_options o;
      o.bucket = index;
      any_allreducer<local_group::communicator, host_space> r(compressor_spec::parse(spec), c, layout, host_space{1},
                                                              o);
      for (auto const& step : history) {
        at::Tensor g = step[static_cast<std::size_t>(c.rank())].clone();
        r({g.data_ptr<float>(), static_cast<std::size_t>(g.numel())});
        if (c.rank() == rank && &step == &history.back()) out = g;
      }
    });
    return out;
  });
  // One all-reduce that must fail: a peer left or never calls. Returns the
  // collective_error's message and the seconds it took to arrive.
  m.def("failing_all_reduce", [](c10::intrusive_ptr<c10d::ProcessGroup> group, int timeout_ms) {
    pybind11::gil_scoped_release release;
    c10d_communicator comm(std::move(group), std::chrono::milliseconds(timeout_ms));
    std::vector<float> x(1024, 1.0f);
    auto const start = std::chrono::steady_clock::now();
    std::string message = "no error";
    try {
      comm.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum);
    } catch (collective_error const& e) {
      message = e.what();
    }
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::make_pair(message, seconds);
  });
}
