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

#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/detail/two_level.hpp>
#include <gradcomp/reducers/node_groups.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>,
          class Gradient = float>
class hierarchical_allreducer {
  static_assert(detail::shards_in_two_levels<Compressor>,
                "hierarchical_allreducer shards buckets across a node's ranks: the compressor's payload must sum "
                "(classic TopK's pairs do not: run it flat)");
  static_assert(gradient_element<Gradient>, "gradients are stored as float, bfloat16 or half");
  static constexpr bool wide = std::is_same_v<Gradient, float>;

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
      : groups_(&groups),
        layout_(std::move(layout)),
        space_(space),
        options_(options),
        rail_(groups.cross, groups.local) {
    int const per_node = groups.ranks_per_node();
    std::size_t const d = layout_.size();
    int const first = static_cast<int>(options_.reduce.bucket % static_cast<std::uint64_t>(per_node));
    detail::node_parts parts;
    if constexpr (detail::shards_by_tensors<Compressor>)
      parts = detail::tensor_parts(layout_, per_node, first);
    else
      parts = detail::element_parts(d, per_node, detail::shard_alignment(compressor));
    auto const local_rank = static_cast<std::size_t>(groups.local.rank());
    detail::set_up_on_every_rank(
        groups, space_, d, detail::two_level_terms<ErrorFeedback, Gradient>(compressor, options_),
        "hierarchical_allreducer", [&] {
          allreducer_options o = options_.reduce;
          o.bucket = o.bucket * static_cast<std::uint64_t>(per_node) + local_rank;
          if constexpr (detail::shards_by_tensors<Compressor>)
            inner_.emplace(std::move(compressor), rail_, detail::tensors_within(layout_, parts.of_rank[local_rank]),
                           space_, o);
          else
            inner_.emplace(std::move(compressor), rail_, bucket_layout(parts.slot), space_, o);
          node_.emplace(std::move(parts), space_, options_.bf16_within_node);
          if (!wide) rounded_ = buffer<Gradient, Space>(node_->parts().slot, space_);
        });
  }
  // (Not copied or moved: the rail's reducer keeps the address of rail_.)
  hierarchical_allreducer(hierarchical_allreducer const&) = delete;
  hierarchical_allreducer& operator=(hierarchical_allreducer const&) = delete;

  /// Reduces `gradient` (layout().size() values) in place: on return every
  /// rank holds the mean over all ranks. A step that any rank of the world
  /// found bad commits nothing on any rank (see nonfinite_policy).
  void operator()(span<Gradient, memory> gradient) {
    auto& local = groups_->local;
    std::size_t const d = layout_.size(), padded = node_->padded(), slot = node_->parts().slot;
    bool const ok = gradient.size() == d;
    // A wrong size still takes part in the step (with the old contents), so the
    // rail's agreement fails every rank instead of leaving peers waiting.
    float* part = (*node_)(local, gradient, ok);
    if (!ok)  // (the rail's agreement then fails every rank of the world)
      inner_->refuse_step("hierarchical_allreducer: the gradient has " + std::to_string(gradient.size()) +
                          " elements but the bucket was set up for " + std::to_string(d) +
                          " (every rank skips this step)");
    (*inner_)(span<float, memory>(part, inner_->layout().size()));  // the slot, or this rank's tensors
    Gradient* out = node_->in_place() && padded == d ? gradient.data() : node_->whole();
    if constexpr (wide) {
      local.all_gather(part, out, slot);
    } else {
      transform(space_, slot, inputs(part), outputs(detail::gradient_stream(rounded_.data())), detail::same_value{});
      local.all_gather(rounded_.data(), out, slot);
    }
    if (out != gradient.data()) node_->unpack(gradient);
  }

  /// Waits for every step enqueued so far (see allreducer::synchronize).
  void synchronize() { inner_->synchronize(); }
  /// Bytes the last step sent across nodes, per rank (its rail's wire bytes).
  std::size_t wire_bytes() const { return inner_->wire_bytes(); }
  /// Bytes the last step moved inside the node, per rank: the reduce-scatter
  /// and the all-gather.
  std::size_t node_bytes() const { return node_->bytes() + node_->padded() * sizeof(Gradient); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return inner_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return inner_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The elements of each rank's slot in the node's reduce-scatter: the
  /// shard (a multiple of the compressor's block or chunk; the last shards
  /// may cover padding), or for PowerSGD the largest run of whole tensors.
  std::size_t shard_size() const { return node_->parts().slot; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return inner_->compressor(); }
  /// The elements of the bucket this rank reduces across nodes, with its
  /// rail: its residual's first rail_elements().count values are theirs.
  element_range rail_elements() const {
    return node_->parts().of_rank[static_cast<std::size_t>(groups_->local.rank())];
  }
  /// This rank's shard's error-feedback residual (PowerSGD: of its tensors).
  auto residual() const requires ErrorFeedback::enabled { return inner_->residual(); }
  /// A hash of the configuration: the rail's, the node's size, the
  /// intra-node precision, the bucket and how it is stored.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash("hierarchical", inner_->fingerprint());
    h = detail::hash_combine(h, layout_.fingerprint());
    h = detail::hash_combine(h, static_cast<std::uint64_t>(groups_->ranks_per_node()));
    h = detail::hash_combine(h, options_.bf16_within_node ? 1 : 0);
    return wide ? h : detail::hash_combine(h, detail::gradient_tag<Gradient>);
  }

  /// @name Checkpoints: this rank's shard state (see allreducer::save)
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
  detail::checkpoint_identity identity() const { return detail::two_level_identity(*groups_, fingerprint()); }

  using inner_type =
      allreducer<Compressor, ErrorFeedback, rail_collective<Collective>, default_aggregator_t<Compressor>, Space>;

  node_groups<Collective>* groups_;
  bucket_layout layout_;
  Space space_;
  hierarchical_options options_;
  rail_collective<Collective> rail_;
  std::optional<inner_type> inner_;
  std::optional<detail::node_reduction<Space, Gradient>> node_;  // the first level, and the padded bucket
  buffer<Gradient, Space> rounded_;  // a 16-bit bucket: the shard's mean, rounded for the all-gather
};

}  // namespace gradcomp
