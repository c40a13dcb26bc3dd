// Compressed reduce-scatter, for sharded optimizers (ZeRO, FSDP): each rank
// receives only its shard of the mean.
//
// The bucket is cut into one shard per rank, in rank order, each a whole
// number of THC rotation blocks and TopK-Chunked chunks; the last shards may
// be short or empty, and zero padding fills the bucket up to whole shards (as
// FSDP pads its flat parameters). A step is the all-reduce path's step on the
// padded bucket, error feedback included, with one difference: a payload
// aligned with the elements (the 16- and 32-bit casts, both QSGDs, THC's
// levels) travels by one reduce-scatter instead of an all-reduce, half the
// bytes, and the casts, QSGDs and THC decode only the shard. Payloads that are
// small already (TopK-Chunked's agreed chunks, GlobalRandK's values) and
// IntSGD's (its running norm needs every summed code) are all-reduced as
// before. Each rank's shard is that slice of the all-reduce path: bitwise
// where the payload's lanes are integers, or the collective's reduce-scatter
// adds floats in its all-reduce's order (local_group); MPI and NCCL may add a
// 16-bit cast's values in another order (a rounding apart).
#pragma once

#include <gradcomp/reducers/bucket_engine.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Reduce-scatters one bucket through a compressor (see the top of this
/// header): afterwards each rank holds the mean over ranks of its own shard.
/// Owns the bucket's state, as allreducer does; construction is collective,
/// and every rank throws together if any cannot use the configuration.
///
/// \tparam Compressor    a compressor whose payload sums element by element
///                       and needs no tensor shapes (not PowerSGD, not
///                       classic TopK: those refuse to compile).
/// \tparam ErrorFeedback error_feedback::none or error_feedback::residual.
/// \tparam Collective    a collective with reduce_scatter (every gradcomp
///                       backend).
/// \tparam Space         host_space, or cuda_space (the default for NCCL).
/// \tparam Gradient      float, bfloat16 or half: how buckets are stored.
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>,
          class Gradient = float>
class reduce_scatterer : bucket_engine<Compressor, ErrorFeedback, Collective, allreduce_aggregator, Space> {
  static_assert(detail::shards_by_elements<Compressor>,
                "reduce_scatterer cuts buckets into shards of elements: the compressor's payload must be summable "
                "and shape-free (PowerSGD and classic TopK cannot reduce-scatter: use allreducer)");
  static_assert(reduce_scattering<Collective>,
                "reduce_scatterer needs a collective with reduce_scatter (gradcomp::reduce_scattering)");
  static_assert(gradient_element<Gradient>, "gradients are stored as float, bfloat16 or half");
  // The engine runs on the padded bucket, each step delivering this rank's shard.
  using engine = bucket_engine<Compressor, ErrorFeedback, Collective, allreduce_aggregator, Space>;

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// Sets up the bucket `layout` for this rank of `collective`, in the
  /// collective's default space. The collective is borrowed and must outlive
  /// the reduce_scatterer.
  reduce_scatterer(Compressor compressor, Collective& collective, bucket_layout layout, allreducer_options options = {})
      : reduce_scatterer(std::move(compressor), collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  reduce_scatterer(Compressor compressor, Collective& collective, bucket_layout layout, Space space,
                   allreducer_options options = {})
      : engine(compressor, collective, padded(layout, collective.size(), compressor), space, options,
               step_output::own_block, "reduce_scatterer"),
        rank_(collective.rank()),
        layout_(std::move(layout)),
        parts_(detail::element_parts(layout_.size(), collective.size(), detail::shard_alignment(compressor))),
        whole_(engine::layout().size() == layout_.size() ? 0 : engine::layout().size(), space) {}

  /// Reduce-scatters `gradient`, this rank's whole bucket (layout().size()
  /// values), which the step consumes: its contents afterwards are
  /// unspecified. On return (on the CUDA space, once the stream gets there)
  /// `shard` (shard_size() values) holds the mean over ranks of elements
  /// [shard_offset(), shard_offset() + shard_size()). A step that any rank
  /// found bad commits nothing on any rank, as allreducer's: on the host it
  /// throws on every rank and writes no shard; on the CUDA space the next
  /// call or synchronize() throws, and `shard` then holds this rank's own
  /// values.
  void operator()(span<Gradient, memory> gradient, span<Gradient, memory> shard) {
    std::size_t const d = layout_.size(), padded = padded_layout().size();
    if (gradient.size() != d || shard.size() != shard_size())  // (every rank then fails the step, none waits)
      refuse_step("reduce_scatterer: this rank passed a gradient of " + std::to_string(gradient.size()) +
                  " elements and a shard of " + std::to_string(shard.size()) + "; the bucket has " + std::to_string(d) +
                  " and this rank's shard " + std::to_string(shard_size()) + " (every rank skips this step)");
    Gradient* whole = detail::padded_bucket(this->space(), gradient, whole_.data(), padded);
    this->reduce(span<Gradient, memory>(whole, padded));
    Gradient const* mine = whole + shard_offset();
    if (!shard.empty() && shard.data() != mine) this->space().copy(shard.data(), mine, shard.size_bytes());
  }

  /// Where rank `rank`'s shard starts in the bucket.
  std::size_t shard_offset(int rank) const { return parts_.of_rank[static_cast<std::size_t>(rank)].first; }
  /// How many elements rank `rank`'s shard holds (the last ones may hold
  /// fewer than the others, or none).
  std::size_t shard_size(int rank) const { return parts_.of_rank[static_cast<std::size_t>(rank)].count; }
  /// Where this rank's shard starts.
  std::size_t shard_offset() const { return shard_offset(rank_); }
  /// How many elements this rank's shard holds.
  std::size_t shard_size() const { return shard_size(rank_); }

  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The bucket the compressor sees: layout() and, where shards need it, a
  /// last tensor of zero padding.
  bucket_layout const& padded_layout() const { return engine::layout(); }

  /// The engine's (see bucket_engine): synchronize(), refuse_step() and begin_at();
  /// wire_bytes() per rank; steps(), warming_up(), compressor(), options();
  /// residual() of this rank's whole padded bucket; fingerprint(), the
  /// all-reduce path's marked as a reduce-scatter of these shards; and the
  /// checkpoints of this rank's state, save(), parse_checkpoint() and both
  /// restore()s (the one of bytes collective: every rank restores, or none).
  using engine::synchronize, engine::refuse_step, engine::begin_at, engine::wire_bytes, engine::steps,
      engine::warming_up, engine::compressor, engine::options, engine::residual, engine::fingerprint, engine::save,
      engine::parse_checkpoint, engine::restore;

 private:
  static bucket_layout padded(bucket_layout layout, int ranks, Compressor const& compressor) {
    std::size_t const elements = detail::element_parts(layout.size(), ranks, detail::shard_alignment(compressor)).slot *
                                 static_cast<std::size_t>(ranks);
    if (elements > layout.size()) layout.add({elements - layout.size()});
    return layout;
  }

  int rank_;
  bucket_layout layout_;
  detail::node_parts parts_;       // each rank's shard, in rank order, and the slot they pad to
  buffer<Gradient, Space> whole_;  // the padded bucket, where the bucket needs padding
};

}  // namespace gradcomp
