// What a model-level reducer is told (model_reducer_options) and what it
// reports of a step (bucket_event).
#pragma once

#include <gradcomp/compressors/choice.hpp>
#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/reducers/model/bucket_rules.hpp>
#include <gradcomp/reducers/options.hpp>

#include <cstddef>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// How a model-level reducer (model_reducer, model_reduce_scatterer, the DDP
/// hook) packs (bucket_rules: plan_buckets, takes_compressor) and reduces a
/// model's gradients.
struct model_reducer_options : bucket_rules {
  /// The compressor of large buckets of matrices (takes_compressor): a spec,
  /// or `auto` with candidates, which choose_compressors (or the DDP hook's
  /// planner, bucket by bucket) resolves into `compressors`.
  compressor_choice compressor{};
  /// Where not empty, the compressor of each large bucket of matrices, in
  /// the order plan_buckets gives them (the planner's choices:
  /// choose_compressors), instead of `compressor`.
  std::vector<compressor_spec> compressors{};
  /// The compressor of the buckets that do not take `compressor`
  /// (takes_compressor: small ones, and those of 1-D tensors only): bf16,
  /// without error feedback.
  compressor_spec small{};
  /// Non-finite policy, seed and warm-up of every bucket (each bucket's
  /// position is its `bucket`).
  allreducer_options reduce{};
  /// Host collectives: reduce on a progress thread while the caller goes on
  /// (the collective must then allow calls from another thread than the
  /// caller's: MPI_THREAD_SERIALIZED; local_group does). False: each bucket is
  /// reduced inside the mark_ready call that completes it. (On CUDA the
  /// reductions are enqueued on the collective's stream either way.)
  bool overlap = true;
  /// Host collectives: how many buckets are reduced at once, each lane over
  /// its own split of the group (the collective must then be splittable),
  /// bucket b on lane b mod lanes on every rank, so the results are bitwise
  /// the same for any number. gloo and TCP move two messages at once faster
  /// than one after the other. (On CUDA, one lane: the reductions are
  /// enqueued on the collective's stream.)
  int lanes = 1;
  /// Hierarchical reducers (built from node_groups): reduce-scatter inside the
  /// node in bf16 rather than fp32.
  bool bf16_within_node = false;
};

/// One bucket's reduction in the last step, in seconds from the step's first
/// mark_ready (host clock; on CUDA, when it was enqueued).
struct bucket_event {
  std::size_t bucket;
  double launched;  ///< Its last gradient was marked ready, and every earlier bucket launched.
  double started;   ///< Its reduction began.
  double finished;  ///< Its reduction returned.
};

}  // namespace gradcomp
