// A world in two levels: this rank's node, and its rail across nodes
// (split_nodes), and one rail as a collective whose steps agree over the
// whole world (rail_collective).
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A world in two levels: this rank's node, and its rail across nodes.
template <class Collective>
struct node_groups {
  Collective local;  ///< The ranks of this rank's node.
  Collective cross;  ///< One rank per node: those with this rank's local rank (its rail).
  /// Number of nodes.
  int nodes() const { return cross.size(); }
  /// Ranks per node.
  int ranks_per_node() const { return local.size(); }
  /// Ranks in the world.
  int size() const { return nodes() * ranks_per_node(); }
  /// This rank in the world: nodes of consecutive ranks.
  int rank() const { return cross.rank() * ranks_per_node() + local.rank(); }
};

/// Splits `world` into nodes, and each rank's rail across them. Nodes are
/// runs of `ranks_per_node` consecutive ranks when it is given (emulation,
/// clusters the backend cannot see), else what the backend detects
/// (split_node(): MPI's shared-memory groups, NCCL's host names). Every node
/// must hold the same number of ranks. Collective.
template <splittable Collective>
node_groups<Collective> split_nodes(Collective& world, int ranks_per_node = 0) {
  int const n = world.size(), rank = world.rank();
  GRADCOMP_EXPECTS(ranks_per_node >= 0, "split_nodes: ranks_per_node must not be negative");
  auto local = [&]() -> Collective {
    if (ranks_per_node > 0) {
      GRADCOMP_EXPECTS(n % ranks_per_node == 0, "split_nodes: " + std::to_string(n) + " ranks do not make nodes of " +
                                                    std::to_string(ranks_per_node));
      return world.split(rank / ranks_per_node, rank);
    }
    if constexpr (requires { world.split_node(); })
      return world.split_node();
    else
      throw invalid_argument("split_nodes: this collective cannot detect nodes; give ranks_per_node");
  }();
  default_space_t<Collective> const space = default_space(world);
  std::int64_t const sizes[2] = {local.size(), -static_cast<std::int64_t>(local.size())};
  buffer<std::int64_t, default_space_t<Collective>> words(2, space);
  space.from_host(words.data(), sizes, sizeof sizes);
  world.all_reduce(words.data(), words.data(), 2, reduce_op::max);
  std::int64_t range[2];
  space.to_host(range, words.data(), sizeof range);
  GRADCOMP_EXPECTS(range[0] == -range[1], "split_nodes: nodes hold different numbers of ranks (from " +
                                              std::to_string(-range[1]) + " to " + std::to_string(range[0]) +
                                              "); hierarchical aggregation needs equal nodes");
  Collective cross = world.split(local.rank(), rank);
  return {std::move(local), std::move(cross)};
}

/// One rail of a two-level world as a collective: data moves among the rail's
/// ranks (one per node), while a step's agreement (agree) runs over the whole
/// world, so that all rails commit or fail a step together.
template <class Collective>
class rail_collective {
 public:
  rail_collective(Collective& cross, Collective& local) : cross_(&cross), local_(&local) {}

  int rank() const { return cross_->rank(); }
  int size() const { return cross_->size(); }
  bool accepts(memory_kind kind) const { return cross_->accepts(kind); }
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    cross_->all_reduce(send, recv, count, op);
  }
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    cross_->all_gather(send, recv, count);
  }
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    cross_->broadcast(buffer, count, root);
  }
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
    cross_->reduce_scatter(send, recv, count, op);
  }
  /// The step's status words summed over the world: over the rail, then
  /// over the node (each rank counted once).
  void agree(std::uint64_t const* send, std::uint64_t* recv) {
    cross_->all_reduce(send, recv, 1, reduce_op::sum);
    local_->all_reduce(recv, recv, 1, reduce_op::sum);
  }
  auto stream() const requires requires(Collective const& c) { c.stream(); }
  { return cross_->stream(); }
  void check_async() requires requires(Collective& c) { c.check_async(); }
  {
    cross_->check_async();
    local_->check_async();
  }
  /// The execution space of a rail: its backend's.
  friend auto default_space(rail_collective const& r) { return default_space(*r.cross_); }

 private:
  Collective* cross_;
  Collective* local_;
};

}  // namespace gradcomp
