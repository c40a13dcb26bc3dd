// TopK-Chunked behaviour that needs no execution-space variants.
#include "common/topk_suite.hpp"

namespace gradcomp::testing {

/// A faulty collective for tests: rank 1 receives a corrupted first element
/// from every floating-point all-reduce, as a broken backend might deliver.
template <collective Inner>
class skewed_collective {
 public:
  explicit skewed_collective(Inner& inner) : inner_(inner) {}
  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }
  bool accepts(memory_kind kind) const { return kind == memory_kind::host && inner_.accepts(kind); }
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    inner_.all_reduce(send, recv, count, op);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, bfloat16>)
      if (rank() == 1 && count > 0) recv[0] = T(1e30f);
  }
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    inner_.all_gather(send, recv, count);
  }
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    inner_.broadcast(buffer, count, root);
  }

 private:
  Inner& inner_;
};

}  // namespace gradcomp::testing

// With verify_selection, ranks whose summed scores differ (here: a faulty
// backend) all get a clear error in the same step instead of silently
// diverging; without it, they diverge.
TEST_CASE("TopK-Chunked's verify mode catches ranks that select different chunks") {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  std::size_t const d = 64 * 100;
  auto run = [&](bool verify) {
    std::vector<std::vector<float>> outputs(4);
    local_group::run(4, [&](local_group::communicator& comm) {
      skewed_collective<local_group::communicator> faulty(comm);
      allreducer<topkc<>, error_feedback::residual, decltype(faulty)> reduce(
          topkc<>{.chunk_size = 64, .chunks = 3, .verify_selection = verify}, faulty, bucket_layout(d), host_space{});
      auto g = random_gradient(11, comm.rank(), d);
      g[0] = 0.0f;  // chunk 0 is not among the largest unless the fault puts it there
      std::fill_n(g.begin(), 64, 0.0f);
      if (verify) {
        CHECK_THROWS_WITH_AS(reduce({g.data(), d}), doctest::Contains("the ranks selected different chunks"),
                             collective_error);
      } else {
        reduce({g.data(), d});
        outputs[comm.rank()] = g;
      }
    });
    return outputs;
  };
  run(true);
  auto const diverged = run(false);
  CHECK(diverged[0] != diverged[1]);  // what verify_selection exists to catch
  CHECK(diverged[0] == diverged[2]);
}
