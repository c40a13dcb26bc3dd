// What the two-level reducers (hierarchical_allreducer and
// hierarchical_reduce_scatterer) share: their options, and two_level, the
// state both own (the node's first level, the rail's bucket engine) with
// what both show of it: their set-up on every rank together, the rail's
// accessors and their checkpoints' envelope.
#pragma once

#include <gradcomp/detail/hash.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/bucket_engine.hpp>
#include <gradcomp/reducers/detail/checkpoint.hpp>
#include <gradcomp/reducers/detail/node_reduction.hpp>
#include <gradcomp/reducers/node_groups.hpp>
#include <gradcomp/reducers/options.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Options of a hierarchical_allreducer.
struct hierarchical_options {
  /// The rail's compressor options: non-finite policy, seed, warm-up.
  allreducer_options reduce{};
  /// Reduce-scatter inside the node in bf16 (half the bytes, one rounding
  /// of each rank's value) rather than fp32.
  bool bf16_within_node = false;
};

namespace detail {

/// How a two-level reducer's buckets are stored, for the ranks' agreement
/// (float: 0, as before 16-bit buckets existed, so that fp32 checkpoints keep
/// their identity).
template <class Gradient>
inline constexpr std::uint64_t gradient_tag = std::is_same_v<Gradient, float>      ? 0
                                              : std::is_same_v<Gradient, bfloat16> ? 1
                                                                                   : 2;

/// What every rank of the world must share to reduce a bucket in two levels:
/// the compressor and its parameters, error feedback, how buckets are stored,
/// the node's precision and the rail's options (a rank of another rail with
/// other options would still exchange with this one inside the node).
template <class ErrorFeedback, class Gradient, class Compressor>
std::uint64_t two_level_terms(Compressor const& compressor, hierarchical_options const& o) {
  std::uint64_t h = hash(ErrorFeedback::name, hash_combine(compressor.fingerprint(), gradient_tag<Gradient>));
  h = hash_combine(h, o.bf16_within_node ? 1 : 0);
  h = hash_combine(h, static_cast<std::uint64_t>(o.reduce.nonfinite));
  h = hash_combine(h, o.reduce.warmup_steps);
  h = hash_combine(h, o.reduce.bucket);
  h = hash_combine(h, o.reduce.seed.has_value() ? 1 : 0);
  return hash_combine(h, o.reduce.seed.value_or(0));
}

/// The state a two-level reducer owns, and what both of them show of it: the
/// node's first level (node_reduction) over `parts`, and the bucket engine of
/// this rank's part on its rail, whose steps deliver `output` (the part's
/// mean for the all-reduce, the rail's block of it for the reduce-scatter).
///
/// Construction is collective over the world: first every rank states its
/// bucket size (zero is valid, as flat: its steps always commit) and the
/// terms every rank must share (two_level_terms), before any rail exchanges
/// anything; then the rail's engine is set up, and if that fails on any rank
/// (a lane that would overflow), every rank throws invalid_argument naming
/// the first rank that failed. Not copied or moved: the engine keeps the
/// address of the rail.
template <class Compressor, class ErrorFeedback, class Collective, class Space, class Gradient>
class two_level {
 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  two_level(two_level const&) = delete;
  two_level& operator=(two_level const&) = delete;

  /// Waits for every step enqueued so far (see allreducer::synchronize).
  void synchronize() { engine_->synchronize(); }
  /// Counts warm-up steps as taken (see bucket_engine::begin_at).
  void begin_at(std::uint64_t steps) { engine_->begin_at(steps); }
  /// Bytes the last step sent across nodes, per rank (its rail's wire bytes).
  std::size_t wire_bytes() const { return engine_->wire_bytes(); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return engine_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return engine_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return engine_->compressor(); }
  /// The elements of the bucket this rank reduces across nodes with its
  /// rail (its part): its residual's first rail_elements().count values are
  /// theirs.
  element_range rail_elements() const {
    return node_->parts().of_rank[static_cast<std::size_t>(groups_->local.rank())];
  }
  /// The error-feedback residual of this rank's part (PowerSGD: of its tensors).
  auto residual() const requires ErrorFeedback::enabled { return engine_->residual(); }

  /// A hash of the configuration: the rail's, the node's size, the
  /// intra-node precision, the bucket and how it is stored.
  std::uint64_t fingerprint() const {
    bool const all_reduce = output_ == step_output::whole_bucket;
    std::uint64_t h = hash(all_reduce ? "hierarchical" : "hierarchical reduce-scatter", engine_->fingerprint());
    h = hash_combine(h, layout_.fingerprint());
    h = hash_combine(h, static_cast<std::uint64_t>(groups_->ranks_per_node()));
    h = hash_combine(h, options_.bf16_within_node ? 1 : 0);
    // (an fp32 all-reduce hashes no storage tag, as before 16-bit buckets)
    return all_reduce && std::is_same_v<Gradient, float> ? h : hash_combine(h, gradient_tag<Gradient>);
  }

  /// @name Checkpoints: this rank's part's state (see allreducer::save), in
  /// an envelope that names the world
  /// @{
  std::vector<std::byte> save() {
    std::vector<std::byte> const rail = engine_->save();
    checkpoint_writer w(identity());
    w.word(rail.size());
    w.raw(rail.data(), rail.size());
    return std::move(w).finish();
  }
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const {
    checkpoint_reader r(open(bytes, identity()));
    auto const rail = r.block("the shard's state");
    r.finish();
    return engine_->parse_checkpoint(rail);
  }
  void restore(bucket_checkpoint const& c) { engine_->restore(c); }
  /// Restores what save() wrote, on every rank of the world together, or on
  /// none (checkpoint_error naming the problem).
  void restore(span<std::byte const> bytes) {
    auto const [c, failure] = parsed_or_why([&] { return parse_checkpoint(bytes); });
    expect_restorable(agreement(groups_->local, groups_->cross, space_, failure.empty() ? c.steps : 0, 0, failure),
                      failure);
    restore(c);
  }
  /// @}

 protected:
  using engine_type =
      bucket_engine<Compressor, ErrorFeedback, rail_collective<Collective>, default_aggregator_t<Compressor>, Space>;

  /// Sets up the bucket `layout` over `groups` (see the class), cut into
  /// `parts` for the node's ranks; `who` names the reducer in errors.
  two_level(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout, Space space,
            hierarchical_options options, node_parts parts, step_output output, char const* who)
      : groups_(&groups),
        layout_(std::move(layout)),
        space_(space),
        options_(options),
        output_(output),
        rail_(groups.cross, groups.local) {
    expect_same_bucket(agreement(groups.local, groups.cross, space_, layout_.size(),
                                 two_level_terms<ErrorFeedback, Gradient>(compressor, options_), ""),
                       who, "compressor, its parameters, its options or the gradients' type differ from rank 0's");
    std::string failure;
    try {
      auto const local_rank = static_cast<std::size_t>(groups.local.rank());
      allreducer_options o = options_.reduce;  // (each rail of a bucket draws its own numbers)
      o.bucket = o.bucket * static_cast<std::uint64_t>(groups.ranks_per_node()) + local_rank;
      bucket_layout part = shards_by_tensors<Compressor> ? tensors_within(layout_, parts.of_rank[local_rank])
                                                         : bucket_layout(parts.slot);
      engine_.emplace(std::move(compressor), rail_, std::move(part), space_, o, output, who);
      node_.emplace(std::move(parts), space_, options_.bf16_within_node, output == step_output::whole_bucket);
    } catch (std::exception const& e) {
      failure = "across " + std::to_string(groups.nodes()) + " nodes of " + std::to_string(groups.ranks_per_node()) +
                " ranks (lanes sum one value per node): " + e.what();
    }
    expect_none_failed(agreement(groups.local, groups.cross, space_, 0, 0, failure), failure, who,
                       "this configuration");
  }
  ~two_level() = default;

  checkpoint_identity identity() const {
    auto const& g = *groups_;
    return {checkpoint_kind::hierarchical, fingerprint(), static_cast<std::uint32_t>(g.nodes() * g.ranks_per_node()),
            static_cast<std::uint32_t>(g.cross.rank() * g.ranks_per_node() + g.local.rank())};
  }

  node_groups<Collective>* groups_;
  bucket_layout layout_;
  Space space_;
  hierarchical_options options_;
  step_output output_;
  rail_collective<Collective> rail_;
  std::optional<engine_type> engine_;                    // this rank's part, on its rail
  std::optional<node_reduction<Space, Gradient>> node_;  // the first level, and the padded bucket
};

}  // namespace detail
}  // namespace gradcomp::inline GRADCOMP_ABI
