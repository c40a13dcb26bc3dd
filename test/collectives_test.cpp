// The in-process backend: real reductions, identical results on every rank,
// clear errors instead of hangs; and any_collective, which must give what
// its backend gives.
#include <gradcomp/collectives/any_collective.hpp>
#include <gradcomp/collectives/local_group.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

using gradcomp::local_group;
using gradcomp::reduce_op;

namespace {

template <class T>
std::vector<T> values_of(int rank, std::size_t count, std::uint32_t seed) {
  std::mt19937 rng(seed + 7919u * static_cast<std::uint32_t>(rank));
  std::vector<T> v(count);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>)
      x = std::uniform_real_distribution<T>(-100, 100)(rng);
    else if constexpr (std::is_integral_v<T>)
      x = static_cast<T>(std::uniform_int_distribution<int>(-100, 100)(rng));
    else
      x = T(std::uniform_real_distribution<float>(-100, 100)(rng));
  }
  return v;
}

}  // namespace

TEST_CASE_TEMPLATE("local_group all_reduce equals a serial reduction on every rank", T, float, double, std::int32_t,
                   std::int8_t, gradcomp::bfloat16) {
  std::uint32_t const seed = std::random_device{}();
  int const ranks = 5;
  for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::min}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{10007}}) {
      std::vector<std::vector<T>> results(ranks);
      local_group::run(ranks, [&](local_group::communicator& comm) {
        auto mine = values_of<T>(comm.rank(), count, seed);
        auto& out = results[comm.rank()];
        out.resize(count);
        if (comm.rank() % 2 == 0) {
          comm.all_reduce(mine.data(), out.data(), count, op);  // out of place
        } else {
          comm.all_reduce(mine.data(), mine.data(), count, op);  // in place
          out = mine;
        }
      });
      // Reference: accumulate in the accumulator type, in rank order.
      using A = gradcomp::detail::accumulator_t<T>;
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < ranks; ++r) inputs.push_back(values_of<T>(r, count, seed));
      std::size_t mismatches = 0;
      for (std::size_t i = 0; i < count; ++i) {
        A acc = static_cast<A>(inputs[0][i]);
        for (int r = 1; r < ranks; ++r) acc = gradcomp::detail::combine(acc, static_cast<A>(inputs[r][i]), op);
        T const expected = static_cast<T>(acc);
        for (int r = 0; r < ranks; ++r) mismatches += std::memcmp(&results[r][i], &expected, sizeof(T)) == 0 ? 0 : 1;
      }
      CHECK(mismatches == 0);
      for (int r = 1; r < ranks && count > 0; ++r)  // (memcmp of an empty vector's null data is undefined)
        CHECK(std::memcmp(results[r].data(), results[0].data(), count * sizeof(T)) == 0);
    }
  }
}

TEST_CASE("local_group sums integers exactly and floats in rank order") {
  int const ranks = 4;
  std::size_t const count = 100000;
  std::vector<std::int32_t> sums(count);
  std::vector<float> float_sums(count);
  local_group::run(ranks, [&](local_group::communicator& comm) {
    std::vector<std::int32_t> mine(count);
    std::vector<float> f(count);
    for (std::size_t i = 0; i < count; ++i) {
      mine[i] = static_cast<std::int32_t>(i) * (comm.rank() + 1);
      f[i] = static_cast<float>(i) * 1e-3f * static_cast<float>(comm.rank() + 1) + 1e7f * (comm.rank() == 0);
    }
    comm.all_reduce(mine.data(), mine.data(), count, reduce_op::sum);
    comm.all_reduce(f.data(), f.data(), count, reduce_op::sum);
    if (comm.rank() == 2) sums = mine, float_sums = f;
  });
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < count; ++i) {
    mismatches += sums[i] == static_cast<std::int32_t>(i) * 10 ? 0 : 1;
    float acc = static_cast<float>(i) * 1e-3f + 1e7f;
    for (int r = 1; r < ranks; ++r) acc += static_cast<float>(i) * 1e-3f * static_cast<float>(r + 1);
    mismatches += float_sums[i] == acc ? 0 : 1;
  }
  CHECK(mismatches == 0);
}

TEST_CASE("local_group all_gather and broadcast") {
  int const ranks = 3;
  std::size_t const count = 1001;
  local_group::run(ranks, [&](local_group::communicator& comm) {
    std::vector<std::int32_t> mine(count, comm.rank() * 10), all(count * ranks, -1);
    comm.all_gather(mine.data(), all.data(), count);
    for (int r = 0; r < ranks; ++r) CHECK(all[r * count + count / 2] == r * 10);

    std::vector<std::int32_t> in_place(count * ranks, -1);  // send lives in the rank's own slot
    std::fill_n(in_place.begin() + comm.rank() * count, count, comm.rank() + 100);
    comm.all_gather(in_place.data() + comm.rank() * count, in_place.data(), count);
    for (int r = 0; r < ranks; ++r) CHECK(in_place[r * count] == r + 100);

    std::vector<float> b(count, static_cast<float>(comm.rank()));
    comm.broadcast(b.data(), count, 1);
    CHECK(b.front() == 1.0f);
    CHECK(b.back() == 1.0f);
  });
}

TEST_CASE("local_group ranks that disagree all get the same error, never a hang") {
  auto const mismatched_count = [] {
    local_group::run(3, [](local_group::communicator& comm) {
      std::vector<float> v(comm.rank() == 2 ? 9 : 10, 1.0f);
      comm.all_reduce(v.data(), v.data(), v.size(), reduce_op::sum);
    });
  };
  CHECK_THROWS_WITH_AS(mismatched_count(), doctest::Contains("element count: rank 0 10, rank 2 9"),
                       gradcomp::collective_error);

  std::atomic<int> failures{0};
  local_group::run(2, [&](local_group::communicator& comm) {
    std::vector<float> v(4, 1.0f);
    try {
      if (comm.rank() == 0)
        comm.all_reduce(v.data(), v.data(), 4, reduce_op::sum);
      else
        comm.broadcast(v.data(), 4, 0);
    } catch (gradcomp::collective_error const& e) {
      CHECK(std::string(e.what()).find("different collectives") != std::string::npos);
      ++failures;
    }
  });
  CHECK(failures == 2);

  auto const bad_root = [] {
    local_group::run(2, [](local_group::communicator& comm) {
      float x = 1;
      comm.broadcast(&x, 1, 5);
    });
  };
  CHECK_THROWS_WITH_AS(bad_root(), doctest::Contains("root 5 is outside"), gradcomp::collective_error);
}

TEST_CASE("a failing rank releases its peers and its own error is reported") {
  auto const one_rank_fails = [] {
    local_group::run(4, [](local_group::communicator& comm) {
      std::vector<float> v(100, 1.0f);
      comm.all_reduce(v.data(), v.data(), v.size(), reduce_op::sum);
      if (comm.rank() == 3) throw std::runtime_error("rank 3 ran out of data");
      comm.all_reduce(v.data(), v.data(), v.size(), reduce_op::sum);  // peers block here until the abort
    });
  };
  CHECK_THROWS_WITH_AS(one_rank_fails(), "rank 3 ran out of data", std::runtime_error);
  CHECK_THROWS_AS(gradcomp::local_group(0), gradcomp::invalid_argument);
}

static_assert(gradcomp::reduce_scattering<gradcomp::any_collective> && gradcomp::splittable<gradcomp::any_collective>);

namespace {

// The required members alone: no reduce_scatter, no split.
struct plain_collective {
  local_group::communicator* inner;
  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  bool accepts(gradcomp::memory_kind k) const { return inner->accepts(k); }
  template <gradcomp::wire_type T>
  void all_reduce(T const* s, T* r, std::size_t n, reduce_op op) {
    inner->all_reduce(s, r, n, op);
  }
  template <gradcomp::wire_type T>
  void all_gather(T const* s, T* r, std::size_t n) {
    inner->all_gather(s, r, n);
  }
  template <gradcomp::wire_type T>
  void broadcast(T* b, std::size_t n, int root) {
    inner->broadcast(b, n, root);
  }
};

// Each call through `any` against the same call on `comm`, on fresh values.
template <class T>
void same_as_backend(local_group::communicator& comm, gradcomp::any_collective& any, std::uint32_t seed) {
  int const ranks = comm.size(), rank = comm.rank();
  std::size_t const count = 257;
  auto const mine = values_of<T>(rank, count * static_cast<std::size_t>(ranks), seed);
  auto bits = [](std::vector<T> const& a, std::vector<T> const& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
  };
  std::vector<T> direct(mine.size()), erased(mine.size(), T(-1));
  comm.all_reduce(mine.data(), direct.data(), mine.size(), reduce_op::sum);
  any.all_reduce(mine.data(), erased.data(), mine.size(), reduce_op::sum);
  CHECK(bits(direct, erased));
  std::vector<T> gathered(count * static_cast<std::size_t>(ranks)), erased_gather(gathered.size(), T(-1));
  comm.all_gather(mine.data(), gathered.data(), count);
  any.all_gather(mine.data(), erased_gather.data(), count);
  CHECK(bits(gathered, erased_gather));
  std::vector<T> scattered(count), erased_scatter(count, T(-1));
  comm.reduce_scatter(mine.data(), scattered.data(), count, reduce_op::max);
  any.reduce_scatter(mine.data(), erased_scatter.data(), count, reduce_op::max);
  CHECK(bits(scattered, erased_scatter));
  std::vector<T> root = mine, erased_root(mine.size(), T(-1));
  comm.broadcast(root.data(), root.size(), ranks - 1);
  if (rank == ranks - 1) erased_root = mine;
  any.broadcast(erased_root.data(), erased_root.size(), ranks - 1);
  CHECK(bits(root, erased_root));
}

}  // namespace

TEST_CASE("any_collective: every call bitwise its backend's, in every wire type; split groups as the backend's") {
  local_group::run(4, [&](local_group::communicator& comm) {
    gradcomp::any_collective any(comm);
    CHECK(any.rank() == comm.rank());
    CHECK(any.size() == 4);
    CHECK(any.accepts(gradcomp::memory_kind::host) == comm.accepts(gradcomp::memory_kind::host));
    std::uint32_t const seed = std::random_device{}();
    same_as_backend<float>(comm, any, seed);
    same_as_backend<double>(comm, any, seed + 1);
    same_as_backend<gradcomp::bfloat16>(comm, any, seed + 2);
    same_as_backend<gradcomp::half>(comm, any, seed + 3);
    same_as_backend<std::uint8_t>(comm, any, seed + 4);
    same_as_backend<std::int32_t>(comm, any, seed + 5);
    same_as_backend<std::uint64_t>(comm, any, seed + 6);

    // Split: the halves, ranked by key (reversed), own their groups.
    auto half = any.split(comm.rank() % 2, -comm.rank());
    CHECK(half.size() == 2);
    CHECK(half.rank() == (comm.rank() < 2 ? 1 : 0));
    std::int32_t mine = comm.rank(), sum = -1;
    half.all_reduce(&mine, &sum, 1, reduce_op::sum);
    CHECK(sum == (comm.rank() % 2 == 0 ? 0 + 2 : 1 + 3));
    auto copy = half;  // copies share the group
    copy.all_reduce(&mine, &sum, 1, reduce_op::max);
    CHECK(sum == (comm.rank() % 2 == 0 ? 2 : 3));
  });
}

TEST_CASE("any_collective over a backend without reduce_scatter or split refuses them by name") {
  local_group::run(2, [&](local_group::communicator& comm) {
    plain_collective plain{&comm};
    gradcomp::any_collective any(plain);
    float x = 1, y = 0;
    any.all_reduce(&x, &y, 1, reduce_op::sum);
    CHECK(y == 2);
    CHECK_THROWS_WITH_AS(any.reduce_scatter(&x, &y, 1, reduce_op::sum), doctest::Contains("cannot reduce-scatter"),
                         gradcomp::invalid_argument);
    CHECK_THROWS_WITH_AS(any.split(0, 0), doctest::Contains("cannot split"), gradcomp::invalid_argument);
    auto owned = gradcomp::any_collective::owning(plain_collective{&comm});  // (a copy of the wrapper, kept)
    y = 0;
    owned.all_reduce(&x, &y, 1, reduce_op::max);
    CHECK(y == 1);
  });
}
