// One bucket's compressed all-reduce: the bucket engine, each step
// delivering the whole bucket's mean.
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/reducers/bucket_engine.hpp>
#include <gradcomp/reducers/options.hpp>

#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Reduces one bucket of gradients across ranks through a compressor:
/// afterwards every rank holds the mean over ranks of what their payloads
/// decode to, in place.
///
/// Owns the bucket's state (see bucket_engine, whose members it has): the
/// error-feedback residual, the workspace and the compressor's resources (all
/// sized once here: steps never allocate), the step's status words, the
/// count of committed steps, the warm-up and the checkpoints. Move-only. The
/// collective is borrowed and must outlive the allreducer. Construction is
/// collective: every rank constructs its allreducer together, and if any
/// rank cannot use the configuration (bad parameters, a size that
/// overflows, no memory) or the ranks' buckets or configurations differ,
/// every rank throws invalid_argument naming the first rank at fault.
///
/// \tparam Compressor    fp32, bf16, topkc<>, ... (gradcomp::compressor).
/// \tparam ErrorFeedback error_feedback::none or error_feedback::residual.
/// \tparam Collective    nccl_communicator (nccl_allreducer in <gradcomp/nccl.hpp>),
///                       mpi_communicator, local_group::communicator, yours.
/// \tparam Aggregator    all-reduce for summable payloads (default), all-gather.
/// \tparam Space         host_space, or cuda_space (the default for NCCL).
template <class Compressor, class ErrorFeedback, class Collective, class Aggregator = default_aggregator_t<Compressor>,
          class Space = default_space_t<Collective>>
class allreducer : public bucket_engine<Compressor, ErrorFeedback, Collective, Aggregator, Space> {
  using engine = bucket_engine<Compressor, ErrorFeedback, Collective, Aggregator, Space>;

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// Sets up the bucket described by `layout` for this rank of `collective`,
  /// in the collective's default space.
  allreducer(Compressor compressor, Collective& collective, bucket_layout layout, allreducer_options options = {})
      : allreducer(std::move(compressor), collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  /// @note Waits for the space: construction exchanges the configuration.
  allreducer(Compressor compressor, Collective& collective, bucket_layout layout, Space space,
             allreducer_options options = {})
      : engine(std::move(compressor), collective, std::move(layout), space, options, step_output::whole_bucket,
               "allreducer") {}

  /// Reduces `gradient` (layout().size() values) in place: on return (on
  /// the CUDA space, once the stream reaches this point) it holds the
  /// rank-mean of the decompressed payloads.
  ///
  /// 16-bit gradients (bfloat16, half) are read and written as they are
  /// stored, with no fp32 copy: the compressor sees their exact float values,
  /// and the mean is rounded to the storage type once, on output. The
  /// error-feedback residual stays fp32. (Every rank's bucket must use the
  /// same type for results to agree bitwise.)
  ///
  /// A step that any rank found bad commits nothing (see nonfinite_policy).
  /// @note On the CUDA space this enqueues the step and returns without
  /// waiting for it. It first waits for this allreducer's previous step to
  /// finish on the device (normally long done: a training step lies
  /// between), to learn whether every rank committed it; if not, it throws
  /// nonfinite_error (or collective_error) on every rank before enqueuing
  /// anything. During CUDA Graph capture it never waits: the verdict of
  /// captured steps is read by synchronize().
  void operator()(span<float, memory> gradient) { this->reduce(gradient); }
  /// The same for a bucket stored as bfloat16.
  void operator()(span<bfloat16, memory> gradient) { this->reduce(gradient); }
  /// The same for a bucket stored as IEEE half.
  void operator()(span<half, memory> gradient) { this->reduce(gradient); }
};

}  // namespace gradcomp
