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

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/reducers/detail/two_level.hpp>
#include <gradcomp/reducers/node_groups.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Reduce-scatters one bucket in two levels (see the top of this header):
/// afterwards each rank holds the mean over the world of its own shard.
/// Construction is collective over the world; if any rank cannot use the
/// configuration, every rank throws invalid_argument.
///
/// For the compressors reduce_scatterer takes (payloads summed element by
/// element, no tensor shapes); PowerSGD and classic TopK do not compile.
/// Buckets and shards are stored as `Gradient` (float, bfloat16 or half).
///
/// Besides its own members it has those of detail::two_level, as
/// hierarchical_allreducer: synchronize(), wire_bytes() (across nodes),
/// steps(), warming_up(), layout(), compressor(), rail_elements() (its
/// part), residual() (of its part), fingerprint() and the checkpoints.
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>,
          class Gradient = float>
class hierarchical_reduce_scatterer : public detail::two_level<Compressor, ErrorFeedback, Collective, Space, Gradient> {
  static_assert(detail::shards_by_elements<Compressor>,
                "hierarchical_reduce_scatterer cuts buckets into shards of elements: the compressor's payload must be "
                "summable and shape-free (PowerSGD and classic TopK cannot reduce-scatter: use an all-reduce)");
  static_assert(reduce_scattering<Collective>,
                "hierarchical_reduce_scatterer needs a collective with reduce_scatter (gradcomp::reduce_scattering)");
  static_assert(gradient_element<Gradient>, "gradients are stored as float, bfloat16 or half");
  using base = detail::two_level<Compressor, ErrorFeedback, Collective, Space, Gradient>;

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// The bucket `layout` over `groups` (see split_nodes), in the local
  /// collective's default space. `groups` is borrowed and must outlive this.
  hierarchical_reduce_scatterer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout,
                                hierarchical_options options = {})
      : hierarchical_reduce_scatterer(std::move(compressor), groups, std::move(layout), default_space(groups.local),
                                      options) {}

  /// The same, running in `space`. Parts are N whole sub-shards each: the
  /// rail's reduce-scatter then needs no padding, and every shard is as long
  /// as a flat reduce-scatter's.
  hierarchical_reduce_scatterer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout,
                                Space space, hierarchical_options options = {})
      : base(compressor, groups, layout, space, options,
             detail::element_parts(layout.size(), groups.ranks_per_node(),
                                   static_cast<std::size_t>(groups.nodes()) * detail::shard_alignment(compressor)),
             step_output::own_block, "hierarchical_reduce_scatterer") {}

  /// Reduce-scatters `gradient`, this rank's whole bucket (layout().size()
  /// values), which the step consumes. On return (on the CUDA space, once the
  /// stream gets there) `shard` (shard_size() values) holds the mean over the
  /// world of elements [shard_offset(), shard_offset() + shard_size()). A step
  /// that any rank found bad commits nothing on any rank, as reduce_scatterer's:
  /// on the host it throws on every rank and writes no shard; on the CUDA space
  /// the next call or synchronize() throws, and `shard` holds unspecified values.
  void operator()(span<Gradient, memory> gradient, span<Gradient, memory> shard) {
    auto& rail = *this->engine_;
    std::size_t const d = this->layout_.size(), slot = this->node_->parts().slot;
    bool const ok = gradient.size() == d && shard.size() == shard_size();
    // A wrong size still takes part in the step, whose agreement then fails
    // every rank instead of leaving peers waiting.
    float* part = (*this->node_)(this->groups_->local, gradient, ok);
    if (!ok)  // (the rail's agreement then fails every rank of the world)
      rail.refuse_step("hierarchical_reduce_scatterer: this rank passed a gradient of " +
                       std::to_string(gradient.size()) + " elements and a shard of " + std::to_string(shard.size()) +
                       "; the bucket has " + std::to_string(d) + " and this rank's shard " +
                       std::to_string(shard_size()) + " (every rank skips this step)");
    rail.reduce(span<float, memory>(part, slot));  // the rail's block of the part, reduced in place
    float const* mine = part + sub_shard() * static_cast<std::size_t>(this->groups_->cross.rank());
    transform(this->space_, shard.size(), inputs(mine), outputs(detail::gradient_stream(shard.data())),
              detail::same_value{});
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
  std::size_t shard_offset() const { return shard_offset(this->groups_->cross.rank(), this->groups_->local.rank()); }
  /// How many elements this rank's shard holds.
  std::size_t shard_size() const { return shard_size(this->groups_->cross.rank(), this->groups_->local.rank()); }

  /// Bytes the last step sent inside the node, per rank: its reduce-scatter.
  std::size_t node_bytes() const { return this->node_->bytes(); }

 private:
  int per_node() const { return this->groups_->ranks_per_node(); }
  // Each node's block of a part, on the rail.
  std::size_t sub_shard() const { return this->node_->parts().slot / static_cast<std::size_t>(this->groups_->nodes()); }

  // Shard (node, local rank): sub-shard `node` of part `local rank`, within
  // the bucket (the padding of the last parts is no one's).
  element_range shard(int node, int local_rank) const {
    std::size_t const d = this->layout_.size(), sub = sub_shard();
    std::size_t const first = std::min(
        d, this->node_->parts().slot * static_cast<std::size_t>(local_rank) + sub * static_cast<std::size_t>(node));
    return {first, std::min(d, first + sub) - first};
  }
};

}  // namespace gradcomp::inline GRADCOMP_ABI
