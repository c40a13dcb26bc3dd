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
// Buckets of 16-bit gradients (bfloat16, half) are widened to fp32 for the
// node's reduce-scatter (or sent as bf16), and the shard's mean is rounded
// once, to the gradient's type, before the all-gather: the fp32 path's
// result, rounded, for half its all-gather bytes.
//
// Error feedback lives on the shard, and integer lanes are sized by the
// number of nodes, not of ranks: only the nodes' sums cross the slow link.
//
// Shards are runs of elements, whole rotation blocks and chunks, except for
// PowerSGD, whose step needs whole matrices: its shards are runs of whole
// tensors, as even as the tensors allow, each in a slot of the node's
// reduce-scatter as large as the largest. A bucket with fewer tensors than
// the node has ranks leaves some ranks without a tensor; they reduce one
// zero across nodes, so that every rail steps and agrees alike. Buckets
// rotate which rank takes the first run, so one-matrix buckets spread over
// the node. PowerSGD is linear in the gradient, so its two-level step is the
// flat step up to rounding, with error feedback on each node's mean.
// A step's verdict (non-finite values, a lane that would overflow) is agreed
// by every rank of the world, so the rails of a node commit or fail a step
// together and no shard's state moves alone.
#pragma once

#include <gradcomp/reducers/detail/two_level.hpp>
#include <gradcomp/reducers/node_groups.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <cstdint>
#include <string>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// A bucket reduced in two levels (see the top of this header): the result is
/// the mean over every rank of the world, bitwise identical on every rank.
/// Construction is collective over the world; if any rank cannot use the
/// configuration, every rank throws invalid_argument.
///
/// For compressors whose payload is summed element by element (bf16, fp32,
/// fp16, TopK-Chunked, THC, the QSGDs, GlobalRandK, IntSGD), and for
/// PowerSGD, sharded by whole tensors. Classic TopK, whose pairs do not sum,
/// does not compile. Buckets are stored as `Gradient`: float, bfloat16 or
/// half; error feedback keeps its fp32 residual on the shard either way.
///
/// Besides its own members it has those of detail::two_level, which the
/// two-level reducers share: synchronize(), wire_bytes() (across nodes),
/// begin_at(), steps(), warming_up(), layout(), compressor(), rail_elements(),
/// residual(), fingerprint() and the checkpoints (save(), parse_checkpoint(),
/// restore()).
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>,
          class Gradient = float>
class hierarchical_allreducer : public detail::two_level<Compressor, ErrorFeedback, Collective, Space, Gradient> {
  static_assert(detail::shards_in_two_levels<Compressor>,
                "hierarchical_allreducer shards buckets across a node's ranks: the compressor's payload must sum "
                "(classic TopK's pairs do not: run it flat)");
  static_assert(gradient_element<Gradient>, "gradients are stored as float, bfloat16 or half");
  using base = detail::two_level<Compressor, ErrorFeedback, Collective, Space, Gradient>;

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
      : base(compressor, groups, layout, space, options, parts(compressor, groups, layout, options),
             step_output::whole_bucket, "hierarchical_allreducer") {}

  /// Reduces `gradient` (layout().size() values) in place: on return every
  /// rank holds the mean over all ranks. A step that any rank of the world
  /// found bad commits nothing on any rank (see nonfinite_policy).
  void operator()(span<Gradient, memory> gradient) {
    auto& local = this->groups_->local;
    auto& rail = *this->engine_;
    std::size_t const d = this->layout_.size();
    bool const ok = gradient.size() == d;
    // A wrong size still takes part in the step (with the old contents), so the
    // rail's agreement fails every rank instead of leaving peers waiting.
    float* part = (*this->node_)(local, gradient, ok);
    if (!ok)  // (the rail's agreement then fails every rank of the world)
      rail.refuse_step("hierarchical_allreducer: the gradient has " + std::to_string(gradient.size()) +
                       " elements but the bucket was set up for " + std::to_string(d) +
                       " (every rank skips this step)");
    rail.reduce(span<float, memory>(part, rail.layout().size()));  // the slot, or this rank's tensors
    this->node_->all_gather(local, part, gradient);
  }

  /// Bytes the last step moved inside the node, per rank: the reduce-scatter
  /// and the all-gather.
  std::size_t node_bytes() const { return this->node_->bytes() + this->node_->padded() * sizeof(Gradient); }
  /// The elements of each rank's slot in the node's reduce-scatter: the
  /// shard (a multiple of the compressor's block or chunk; the last shards
  /// may cover padding), or for PowerSGD the largest run of whole tensors.
  std::size_t shard_size() const { return this->node_->parts().slot; }

 private:
  // Runs of elements, whole blocks or chunks; for PowerSGD runs of whole
  // tensors, each bucket starting them at another rank.
  static detail::node_parts parts(Compressor const& compressor, node_groups<Collective> const& groups,
                                  bucket_layout const& layout, hierarchical_options const& options) {
    int const per_node = groups.ranks_per_node();
    if constexpr (detail::shards_by_tensors<Compressor>)
      return detail::tensor_parts(layout, per_node,
                                  static_cast<int>(options.reduce.bucket % static_cast<std::uint64_t>(per_node)));
    else
      return detail::element_parts(layout.size(), per_node, detail::shard_alignment(compressor));
  }
};

}  // namespace gradcomp
