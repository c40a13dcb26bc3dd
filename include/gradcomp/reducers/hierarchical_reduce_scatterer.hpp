// Compressed reduce-scatter in two levels, for sharded optimizers across
// nodes (as ZeRO++'s qgZ): the node's reduce-scatter in fp32 or bf16, then a
// compressed reduce-scatter across nodes, and no all-gather.
//
//   1. reduce-scatter inside the node (hierarchical.hpp's first level): each
//      of the node's L ranks receives the node's mean of its part, 1/L of the
//      bucket;
//   2. each rank reduce-scatters its part across nodes with its rail, through
//      the compressor (reduce_scatterer over the rail): of the N nodes' ranks
//      with local rank l, the one on node n receives the mean over the world
//      of sub-shard n of part l.
//
// So shards lie in the bucket part by part: rank (node n, local rank l) owns
// shard l * N + n of the N x L equal shards a flat reduce_scatterer would cut
// (the same shard sizes). Only the parts' compressed payloads cross the slow
// link, integer lanes are sized by the number of nodes, and error feedback
// lives on the part. Parts are whole multiples of N sub-shards, so they may
// differ from hierarchical_allreducer's (whole blocks or chunks). Where they
// coincide (a bucket of whole multiples of N x L blocks or chunks), or for
// the element-wise casts, each shard is the slice of hierarchical_allreducer's
// result that its all-gather would have sent: bitwise where the rail's
// reduce-scatter is bitwise its all-reduce's slice (see reduce_scatterer.hpp).
#pragma once

#include <gradcomp/reducers/hierarchical.hpp>
#include <gradcomp/reducers/reduce_scatterer.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Reduce-scatters one bucket in two levels (see the top of this header):
/// afterwards each rank holds the mean over the world of its own shard.
/// Construction is collective over the world; if any rank cannot use the
/// configuration, every rank throws invalid_argument.
///
/// For the compressors reduce_scatterer takes (payloads summed element by
/// element, no tensor shapes); PowerSGD and classic TopK do not compile.
/// Buckets and shards are stored as `Gradient` (float, bfloat16 or half).
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>,
          class Gradient = float>
class hierarchical_reduce_scatterer {
  static_assert(detail::shards_by_elements<Compressor>,
                "hierarchical_reduce_scatterer cuts buckets into shards of elements: the compressor's payload must be "
                "summable and shape-free (PowerSGD and classic TopK cannot reduce-scatter: use an all-reduce)");
  static_assert(reduce_scattering<Collective>,
                "hierarchical_reduce_scatterer needs a collective with reduce_scatter (gradcomp::reduce_scattering)");
  static_assert(gradient_element<Gradient>, "gradients are stored as float, bfloat16 or half");

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// The bucket `layout` over `groups` (see split_nodes), in the local
  /// collective's default space. `groups` is borrowed and must outlive this.
  hierarchical_reduce_scatterer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout,
                                hierarchical_options options = {})
      : hierarchical_reduce_scatterer(std::move(compressor), groups, std::move(layout), default_space(groups.local),
                                      options) {}

  /// The same, running in `space`.
  hierarchical_reduce_scatterer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout,
                                Space space, hierarchical_options options = {})
      : groups_(&groups),
        layout_(std::move(layout)),
        space_(space),
        options_(options),
        rail_(groups.cross, groups.local) {
    int const nodes = groups.nodes(), per_node = groups.ranks_per_node();
    std::size_t const d = layout_.size();
    // Parts of N whole sub-shards each: the rail's reduce-scatter then needs
    // no padding, and every shard is as long as a flat reduce-scatter's.
    auto parts =
        detail::element_parts(d, per_node, static_cast<std::size_t>(nodes) * detail::shard_alignment(compressor));
    detail::set_up_on_every_rank(
        groups, space_, d, detail::two_level_terms<ErrorFeedback, Gradient>(compressor, options_),
        "hierarchical_reduce_scatterer", [&] {
          allreducer_options o = options_.reduce;
          o.bucket = o.bucket * static_cast<std::uint64_t>(per_node) + static_cast<std::uint64_t>(groups.local.rank());
          inner_.emplace(std::move(compressor), rail_, bucket_layout(parts.slot), space_, o);
          node_.emplace(std::move(parts), space_, options_.bf16_within_node);
        });
  }
  // (Not copied or moved: the rail's reducer keeps the address of rail_.)
  hierarchical_reduce_scatterer(hierarchical_reduce_scatterer const&) = delete;
  hierarchical_reduce_scatterer& operator=(hierarchical_reduce_scatterer const&) = delete;

  /// Reduce-scatters `gradient`, this rank's whole bucket (layout().size()
  /// values), which the step consumes. On return (on the CUDA space, once the
  /// stream gets there) `shard` (shard_size() values) holds the mean over the
  /// world of elements [shard_offset(), shard_offset() + shard_size()). A step
  /// that any rank found bad commits nothing on any rank, as reduce_scatterer's:
  /// on the host it throws on every rank and writes no shard; on the CUDA space
  /// the next call or synchronize() throws, and `shard` holds unspecified values.
  void operator()(span<Gradient, memory> gradient, span<Gradient, memory> shard) {
    std::size_t const d = layout_.size(), slot = node_->parts().slot;
    bool const ok = gradient.size() == d && shard.size() == shard_size();
    // A wrong size still takes part in the step, whose agreement then fails
    // every rank instead of leaving peers waiting.
    float* part = (*node_)(groups_->local, gradient, ok);
    float* mine = part + inner_->shard_offset();  // the rail's shard, reduced in place
    if (!ok)                                      // (the rail's agreement then fails every rank of the world)
      inner_->refuse_step("hierarchical_reduce_scatterer: this rank passed a gradient of " +
                          std::to_string(gradient.size()) + " elements and a shard of " + std::to_string(shard.size()) +
                          "; the bucket has " + std::to_string(d) + " and this rank's shard " +
                          std::to_string(shard_size()) + " (every rank skips this step)");
    (*inner_)(span<float, memory>(part, slot), span<float, memory>(mine, inner_->shard_size()));
    transform(space_, shard.size(), inputs(mine), outputs(detail::gradient_stream(shard.data())), detail::same_value{});
  }

  /// Where the shard of the rank with local rank `local_rank` on node `node`
  /// starts in the bucket.
  std::size_t shard_offset(int node, int local_rank) const { return shard(node, local_rank).first; }
  /// How many elements that shard holds (shards at the end of the bucket may
  /// hold fewer, or none).
  std::size_t shard_size(int node, int local_rank) const { return shard(node, local_rank).count; }
  /// Where the shard of world rank `rank` starts, counting ranks node by node
  /// (rank = node * ranks_per_node + local rank, as split_nodes makes nodes
  /// of consecutive ranks when given ranks_per_node).
  std::size_t shard_offset(int rank) const { return shard_offset(rank / per_node(), rank % per_node()); }
  /// How many elements the shard of world rank `rank` holds (counted so).
  std::size_t shard_size(int rank) const { return shard_size(rank / per_node(), rank % per_node()); }
  /// Where this rank's shard starts.
  std::size_t shard_offset() const { return shard_offset(groups_->cross.rank(), groups_->local.rank()); }
  /// How many elements this rank's shard holds.
  std::size_t shard_size() const { return shard_size(groups_->cross.rank(), groups_->local.rank()); }

  /// Waits for every step enqueued so far (see allreducer::synchronize).
  void synchronize() { inner_->synchronize(); }
  /// Bytes the last step sent across nodes, per rank (its rail's wire bytes).
  std::size_t wire_bytes() const { return inner_->wire_bytes(); }
  /// Bytes the last step sent inside the node, per rank: its reduce-scatter.
  std::size_t node_bytes() const { return node_->bytes(); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return inner_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return inner_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return inner_->compressor(); }
  /// The elements of the bucket this rank reduce-scatters across nodes with
  /// its rail (its part): its residual's first rail_elements().count values
  /// are theirs.
  element_range rail_elements() const {
    return node_->parts().of_rank[static_cast<std::size_t>(groups_->local.rank())];
  }
  /// The error-feedback residual of this rank's part.
  auto residual() const requires ErrorFeedback::enabled { return inner_->residual(); }
  /// A hash of the configuration: the rail's reduce-scatter, the node's size,
  /// the intra-node precision, the bucket and how it is stored.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash("hierarchical reduce-scatter", inner_->fingerprint());
    h = detail::hash_combine(h, layout_.fingerprint());
    h = detail::hash_combine(h, static_cast<std::uint64_t>(groups_->ranks_per_node()));
    h = detail::hash_combine(h, options_.bf16_within_node ? 1 : 0);
    return detail::hash_combine(h, detail::gradient_tag<Gradient>);
  }

  /// @name Checkpoints: this rank's part state (see allreducer::save)
  /// @{
  std::vector<std::byte> save() { return detail::wrap_rail_state(identity(), inner_->save()); }
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const {
    return inner_->parse_checkpoint(detail::unwrap_rail_state(bytes, identity()));
  }
  void restore(bucket_checkpoint const& c) { inner_->restore(c); }
  /// Restores what save() wrote, on every rank of the world together, or on
  /// none (checkpoint_error naming the problem).
  void restore(span<std::byte const> bytes) { detail::restore_on_every_rank(*this, *groups_, space_, bytes); }
  /// @}

 private:
  int per_node() const { return groups_->ranks_per_node(); }

  // Shard (node, local rank): sub-shard `node` of part `local rank`, within
  // the bucket (the padding of the last parts is no one's).
  element_range shard(int node, int local_rank) const {
    std::size_t const d = layout_.size(), sub = node_->parts().slot / static_cast<std::size_t>(groups_->nodes());
    std::size_t const first =
        std::min(d, node_->parts().slot * static_cast<std::size_t>(local_rank) + sub * static_cast<std::size_t>(node));
    return {first, std::min(d, first + sub) - first};
  }

  detail::checkpoint_identity identity() const { return detail::two_level_identity(*groups_, fingerprint()); }

  node_groups<Collective>* groups_;
  bucket_layout layout_;
  Space space_;
  hierarchical_options options_;
  rail_collective<Collective> rail_;
  std::optional<reduce_scatterer<Compressor, ErrorFeedback, rail_collective<Collective>, Space>> inner_;
  std::optional<detail::node_reduction<Space, Gradient>> node_;  // the first level
};

}  // namespace gradcomp::inline GRADCOMP_ABI
