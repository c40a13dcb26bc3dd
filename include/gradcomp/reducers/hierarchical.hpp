// Two-level aggregation: fast links inside a node, slow ones between nodes,
// and compression only where it pays.
//
//   1. reduce-scatter inside the node (fp32, or bf16 for half the bytes): each
//      of the node's L ranks receives the node's sum of its 1/L shard;
//   2. each rank compresses its shard (divided by L: the node's mean) and runs
//      the compressed all-reduce across nodes with its rail, the ranks of the
//      same local rank on every node (L rails in parallel);
//   3. all-gather inside the node: every rank holds the whole mean.
//
// Error feedback lives on the shard, and integer lanes are sized by the
// number of nodes, not of ranks: only the nodes' sums cross the slow link.
// A step's verdict (non-finite values, a lane that would overflow) is agreed
// by every rank of the world, so the rails of a node commit or fail a step
// together and no shard's state moves alone.
#pragma once

#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
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
};

namespace detail {
// The largest of every rank's `value`, over a world given as its two levels.
template <class Collective, class Space>
std::int64_t world_max(Collective& local, Collective& cross, Space const& space, std::int64_t value) {
  buffer<std::int64_t, Space> word(1, space);
  space.from_host(word.data(), &value, sizeof value);
  local.all_reduce(word.data(), word.data(), 1, reduce_op::max);
  cross.all_reduce(word.data(), word.data(), 1, reduce_op::max);
  space.to_host(&value, word.data(), sizeof value);
  return value;
}
}  // namespace detail

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
  /// The step's status words summed over the world: over the rail, then
  /// over the node (each rank counted once).
  void agree(std::uint64_t const* send, std::uint64_t* recv) {
    cross_->all_reduce(send, recv, 1, reduce_op::sum);
    local_->all_reduce(recv, recv, 1, reduce_op::sum);
  }
  auto stream() const
    requires requires(Collective const& c) { c.stream(); }
  {
    return cross_->stream();
  }
  void check_async()
    requires requires(Collective& c) { c.check_async(); }
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


/// Options of a hierarchical_allreducer.
struct hierarchical_options {
  /// The rail's compressor options: non-finite policy, seed, warm-up.
  allreducer_options reduce{};
  /// Reduce-scatter inside the node in bf16 (half the bytes, one rounding
  /// of each rank's value) rather than fp32.
  bool bf16_within_node = false;
};

namespace detail {
struct divide_by {
  float n;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x / n; }
};
struct divide_bf16_by {
  float n;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, bfloat16 x, float& out) const { out = static_cast<float>(x) / n; }
};
struct to_bf16 {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, bfloat16& out) const { out = bfloat16(x); }
};
}  // namespace detail

/// A bucket reduced in two levels (see the top of this header): the result is
/// the mean over every rank of the world, bitwise identical on every rank.
/// Construction is collective over the world; if any rank cannot use the
/// configuration, every rank throws invalid_argument.
///
/// For compressors whose payload is summed element by element (bf16, fp32,
/// fp16, TopK-Chunked, THC, the QSGDs, GlobalRandK, IntSGD). PowerSGD is not
/// sharded (a shard of a matrix is not a matrix of the same rank): use it
/// flat, over the world.
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>>
class hierarchical_allreducer {
  static_assert(detail::shards_by_elements<Compressor>,
                "hierarchical_allreducer shards buckets by elements: the compressor's payload must be summable and "
                "shape-free (PowerSGD and classic TopK run flat)");

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// The bucket `layout` over `groups` (see split_nodes), in the local
  /// collective's default space. `groups` is borrowed and must outlive the
  /// allreducer.
  hierarchical_allreducer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout,
                          hierarchical_options options = {})
      : hierarchical_allreducer(std::move(compressor), groups, std::move(layout), default_space(groups.local),
                                options) {}

  /// The same, running in `space`.
  hierarchical_allreducer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout, Space space,
                          hierarchical_options options = {})
      : groups_(&groups), layout_(std::move(layout)), space_(space), options_(options), rail_(groups.cross, groups.local) {
    int const nodes = groups.nodes(), per_node = groups.ranks_per_node();
    std::size_t const d = layout_.size();
    shard_ = detail::shard_elements(d, per_node, detail::shard_alignment(compressor));
    std::string failure = d == 0 ? "hierarchical_allreducer: the bucket is empty" : "";
    std::int64_t const mine = static_cast<std::int64_t>(detail::hash_combine(d, compressor.fingerprint()) >> 1);
    // The node's ranks must agree before the rails exchange anything.
    if (detail::world_max(groups.local, groups.cross, space_, mine) !=
            -detail::world_max(groups.local, groups.cross, space_, -mine) &&
        failure.empty())
      failure = "hierarchical_allreducer: ranks disagree on the bucket or the compressor";
    if (failure.empty()) {
      try {
        allreducer_options o = options_.reduce;
        o.bucket = o.bucket * static_cast<std::uint64_t>(per_node) + static_cast<std::uint64_t>(groups.local.rank());
        inner_.emplace(std::move(compressor), rail_, bucket_layout(shard_), space_, o);
        whole_ = buffer<float, Space>(shard_ * per_node, space_);
        part_ = buffer<float, Space>(shard_, space_);
        if (options_.bf16_within_node) narrow_ = buffer<bfloat16, Space>(shard_ * (per_node + 1), space_);
      } catch (std::exception const& e) {
        failure = "hierarchical_allreducer: across " + std::to_string(nodes) + " nodes of " +
                  std::to_string(per_node) + " ranks (lanes sum one value per node): " + e.what();
      }
    }
    if (detail::world_max(groups.local, groups.cross, space_, failure.empty() ? 0 : 1) != 0)
      throw invalid_argument(failure.empty() ? "hierarchical_allreducer: another rank cannot use this configuration"
                                             : failure);
    space_.fill_zero(whole_.data(), whole_.size() * sizeof(float));
  }

  /// Reduces `gradient` (layout().size() values) in place: on return every
  /// rank holds the mean over all ranks. A step that any rank of the world
  /// found bad commits nothing on any rank (see nonfinite_policy).
  void operator()(span<float, memory> gradient) {
    auto& local = groups_->local;
    std::size_t const d = layout_.size(), padded = whole_.size();
    float const per_node = static_cast<float>(local.size());
    bool const ok = gradient.size() == d;
    // A wrong size still takes part in the step (with the old contents), so the
    // rail's agreement fails every rank instead of leaving peers waiting.
    float const* send = ok ? detail::padded_bucket(space_, gradient, whole_.data(), padded) : whole_.data();
    if (options_.bf16_within_node) {
      bfloat16* wide = narrow_.data() + shard_;
      transform(space_, padded, inputs(send), outputs(wide), detail::to_bf16{});
      local.reduce_scatter(wide, narrow_.data(), shard_, reduce_op::sum);
      transform(space_, shard_, inputs(narrow_.data()), outputs(part_.data()), detail::divide_bf16_by{per_node});
    } else {
      local.reduce_scatter(send, part_.data(), shard_, reduce_op::sum);
      transform(space_, shard_, inputs(part_.data()), outputs(part_.data()), detail::divide_by{per_node});
    }
    try {
      if (ok)
        (*inner_)(part_.view());
      else
        (*inner_)(part_.view().subspan(0, shard_ - 1));  // refused: every rank fails the step
    } catch (invalid_argument const&) {
      if (ok) throw;
      throw invalid_argument("hierarchical_allreducer: the gradient has " + std::to_string(gradient.size()) +
                             " elements but the bucket was set up for " + std::to_string(d) +
                             " (every rank skips this step)");
    }
    float* out = padded == d ? gradient.data() : whole_.data();
    local.all_gather(part_.data(), out, shard_);
    if (padded != d) space_.copy(gradient.data(), whole_.data(), d * sizeof(float));
  }

  /// Waits for every step enqueued so far (see allreducer::synchronize).
  void synchronize() { inner_->synchronize(); }
  /// Bytes the last step sent across nodes, per rank (its rail's wire bytes).
  std::size_t wire_bytes() const { return inner_->wire_bytes(); }
  /// Bytes the last step moved inside the node, per rank: the reduce-scatter
  /// and the all-gather.
  std::size_t node_bytes() const {
    std::size_t const element = options_.bf16_within_node ? sizeof(bfloat16) : sizeof(float);
    return whole_.size() * element + whole_.size() * sizeof(float);
  }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return inner_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return inner_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The elements of this rank's shard (a multiple of the compressor's block
  /// or chunk; the last shards may cover padding).
  std::size_t shard_size() const { return shard_; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return inner_->compressor(); }
  /// This rank's shard's error-feedback residual.
  auto residual() const
    requires ErrorFeedback::enabled
  {
    return inner_->residual();
  }
  /// A hash of the configuration: the rail's, the node's size, the
  /// intra-node precision, the bucket.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash("hierarchical", inner_->fingerprint());
    h = detail::hash_combine(h, layout_.fingerprint());
    h = detail::hash_combine(h, static_cast<std::uint64_t>(groups_->ranks_per_node()));
    return detail::hash_combine(h, options_.bf16_within_node ? 1 : 0);
  }

  /// @name Checkpoints: this rank's shard state (see allreducer::save)
  /// @{
  std::vector<std::byte> save() {
    detail::checkpoint_writer w(identity());
    auto const blob = inner_->save();
    w.word(blob.size());
    w.raw(blob.data(), blob.size());
    return std::move(w).finish();
  }
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const {
    detail::checkpoint_reader r(detail::open(bytes, identity()));
    auto const blob = r.block("the shard's state");
    bucket_checkpoint c = inner_->parse_checkpoint(blob);
    r.finish();
    return c;
  }
  void restore(bucket_checkpoint const& c) { inner_->restore(c); }
  /// Restores what save() wrote, on every rank of the world together, or on
  /// none (checkpoint_error naming the problem).
  void restore(span<std::byte const> bytes) {
    bucket_checkpoint c;
    std::string failure;
    try {
      c = parse_checkpoint(bytes);
    } catch (checkpoint_error const& e) {
      failure = e.what();
    }
    auto& g = *groups_;
    std::int64_t const steps = failure.empty() ? static_cast<std::int64_t>(c.steps) : 0;
    bool const any_failed = detail::world_max(g.local, g.cross, space_, failure.empty() ? 0 : 1) != 0;
    if (any_failed)
      throw checkpoint_error(failure.empty() ? "another rank cannot restore its checkpoint; no rank restored anything"
                                             : failure + "; no rank restored anything");
    if (detail::world_max(g.local, g.cross, space_, steps) != -detail::world_max(g.local, g.cross, space_, -steps))
      throw checkpoint_error("the ranks' checkpoints are of different steps; no rank restored anything");
    inner_->restore(c);
  }
  /// @}

 private:
  detail::checkpoint_identity identity() const {
    auto const& g = *groups_;
    return {checkpoint_kind::hierarchical, fingerprint(),
            static_cast<std::uint32_t>(g.nodes() * g.ranks_per_node()),
            static_cast<std::uint32_t>(g.cross.rank() * g.ranks_per_node() + g.local.rank())};
  }

  using inner_type = allreducer<Compressor, ErrorFeedback, rail_collective<Collective>,
                                default_aggregator_t<Compressor>, Space>;

  node_groups<Collective>* groups_;
  bucket_layout layout_;
  Space space_;
  hierarchical_options options_;
  rail_collective<Collective> rail_;
  std::size_t shard_ = 0;
  std::optional<inner_type> inner_;
  buffer<float, Space> whole_;      // the padded bucket (padding, and the all-gather)
  buffer<float, Space> part_;       // this rank's shard
  buffer<bfloat16, Space> narrow_;  // bf16 within the node: the shard, then the padded bucket
};

}  // namespace gradcomp
