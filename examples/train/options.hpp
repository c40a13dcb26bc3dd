// What the training example is told (options) and what it reports (record,
// result).
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace train {

/// What to train, how, and how gradients travel.
struct options {
  std::string compressor = "bf16";               ///< A compressor_choice: "topkc:fraction=0.1", "auto", ...
  std::uint64_t warmup = 0;                      ///< Steps that send the plain fp32 mean first.
  bool overlap = true;                           ///< Reduce a bucket while the backward pass goes on.
  std::string grad_dtype = "fp32";               ///< How gradients are stored: fp32 or bf16.
  std::size_t bucket_kb = 256;                   ///< Bucket cap (DDP's bucket_cap_mb; the MLP is about 2 MB).
  std::size_t min_compression = 4096;            ///< Smaller buckets and 1-D tensors travel as bf16.
  int ranks_per_node = 0;                        ///< Hierarchical: nodes of this many ranks (0: flat).
  bool bf16_within_node = false;                 ///< Hierarchical: reduce-scatter inside the node in bf16.
  bool shard_optimizer = false;                  ///< Reduce-scatter; each rank updates its shard (sharded_reducer).
  std::string gather_dtype = "fp32";             ///< Sharded: weights all-gathered in fp32, or bf16 (fp32 masters).
  std::string checkpoint;                        ///< Save here (one file per rank: PATH.rank<r>) ...
  std::size_t checkpoint_every = 0;              ///< ... every this many steps (0: never).
  std::string resume;                            ///< Resume from this checkpoint (PATH, as saved).
  int ranks = 4;                                 ///< In-process ranks (MPI: the world's size).
  std::size_t batch = 64;                        ///< Examples per rank per step.
  float lr = 0.05f;                              ///< SGD learning rate.
  float momentum = 0.9f;                         ///< SGD momentum.
  double epochs = 3;                             ///< Passes over the training set.
  double time_budget = 0;                        ///< Stop after this many training seconds (0: no limit).
  double target = 0.85;                          ///< Test accuracy whose first crossing is the time-to-accuracy.
  bool stop_at_target = false;                   ///< End the run when the target is reached.
  std::uint64_t seed = 1;                        ///< Model initialization and data order.
  std::vector<std::size_t> hidden = {512, 256};  ///< Hidden layer widths.
  std::size_t eval_every = 100;                  ///< Steps between test evaluations.
  std::size_t max_steps = 0;                     ///< Stop after this many steps (0: no limit).
  bool check_replicas = false;  ///< After each step, ranks compare their weights (throws if they differ).
  /// The planner's steps to the target relative to bf16's, by spec string
  /// (auto only): it then ranks by time to target, ...
  std::map<std::string, double> steps_factor;
  /// ... whole steps weighed, by the forward and backward passes' seconds
  /// (train_rank times them before planning; the optimizer's and the small
  /// buckets' time are left out, a small part of a step here).
  double compute_seconds = 0;

  /// How the model's buckets are made and reduced (an automatic spec's
  /// buckets take bf16 until the planner chooses: host_reducer).
  gradcomp::model_reducer_options reducer_options() const {
    gradcomp::model_reducer_options r;
    r.compressor = choice();
    r.min_compression_elements = min_compression;
    r.bucket_cap_bytes = bucket_kb << 10;
    r.first_bucket_cap_bytes = bucket_kb << 10;
    r.overlap = overlap;
    r.bf16_within_node = bf16_within_node;
    r.reduce.warmup_steps = warmup;
    return r;
  }

  /// The compressor these options name (throws invalid_argument for a spec it cannot read).
  gradcomp::compressor_choice choice() const { return gradcomp::compressor_choice::parse(compressor); }
  /// The fixed compressor these options name (invalid_argument where automatic).
  gradcomp::compressor_spec spec() const { return choice().spec(); }
  /// Whether the planner chooses each bucket's compressor ("auto", "auto:of=...").
  bool automatic() const { return choice().is_automatic(); }
  /// What the planner weighs, for an automatic spec.
  gradcomp::planner_options planner() const {
    gradcomp::planner_options p;
    p.candidates = choice().candidates();
    p.steps_factor = steps_factor;
    p.compute_seconds = compute_seconds;
    p.bf16_within_node = bf16_within_node;
    return p;
  }
};

/// One evaluation, as rank 0 saw it.
struct record {
  std::size_t step;        ///< Steps done.
  double epoch;            ///< Epochs done.
  double wall_s;           ///< Training seconds (evaluations excluded).
  double compress_s;       ///< Seconds reducing buckets outside collectives (overlapped or not).
  double comm_s;           ///< Seconds in collectives.
  std::size_t wire_bytes;  ///< Bytes put on the wire so far.
  double loss;             ///< Mean training loss since the last evaluation.
  double test_accuracy;    ///< On the 10000 test images.
  double exposed_s;        ///< Seconds the training thread spent on reductions (handing over, waiting).
};

/// A run, as rank 0 saw it.
struct result {
  std::vector<record> records;
  double time_to_target = -1;       ///< Training seconds until test accuracy >= target; -1: not reached.
  std::size_t steps_to_target = 0;  ///< Steps until test accuracy >= target; 0: not reached.
  std::size_t wire_bytes_per_step = 0;
  std::uint64_t weights_hash = 0;  ///< FNV-1a of the final weights' bits.
};

}  // namespace train
