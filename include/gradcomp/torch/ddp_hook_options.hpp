// What the DDP hook is told (ddp_hook_options), with the hook's defaults and
// why each is what it is: gradcomp.torch's Options are this struct.
#pragma once

#include <gradcomp/reducers/model/options.hpp>

#include <map>
#include <string>

namespace gradcomp::inline GRADCOMP_ABI {

/// How a ddp_hook_state reduces DDP's buckets: the model-level options
/// (compressor, small, bucket rules, warm-up, seed, non-finite policy,
/// lanes), and the host loops' threads. Their defaults are the hook's, and
/// gradcomp.torch reads them from here:
/// - compressor bf16 (model_reducer_options): the reduction of PyTorch's
///   bf16_compress_hook, the baseline to beat; compression is a choice;
/// - two warm-up iterations: DDP rebuilds its buckets after the first, so the
///   compressors start on the buckets it keeps (PyTorch refuses a
///   start_powerSGD_iter below 2 with error feedback for the same reason);
/// - two lanes: gloo moves two collectives at once faster than one after the
///   other (as it does for PyTorch's own hooks);
/// - `auto` prices a compressor whose steps to a target are unknown at twice
///   bf16's steps: the planner predicts a step's time, not convergence, and
///   a compressor that saves a step's communication can need more steps than
///   that saves.
struct ddp_hook_options : model_reducer_options {
  /// Threads of the host loops (gradcomp.torch passes torch's intra-op
  /// thread count, what the user gave each rank); 0: OpenMP's default.
  int threads = 0;
  /// `auto`: steps to a target relative to bf16's, by candidate spec, where
  /// measured for this model (planner_options::steps_factor).
  std::map<std::string, double> auto_steps_factor{};
  /// `auto`: the steps factor of a candidate auto_steps_factor leaves out
  /// (planner_options::unknown_steps_factor): 2, so a compressor is chosen
  /// only where it would pay even at twice bf16's steps.
  double auto_unknown_steps_factor = 2;
  ddp_hook_options() {
    reduce.warmup_steps = 2;
    lanes = 2;
  }
};

}  // namespace gradcomp
