// Data-parallel training of an MLP on Fashion-MNIST, written against
// gradcomp's public API as a user would write it. One call of train_rank
// runs one rank; ranks are threads (local_group) or processes (MPI).
#pragma once

#include "../common/timed_collective.hpp"
#include "fashion_mnist.hpp"
#include "mlp.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace train {

/// What to train, how, and how gradients travel.
struct options {
  std::string compressor = "bf16";               ///< A compressor_spec: "topkc:fraction=0.1", ...
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
    r.compressor = automatic() ? gradcomp::compressor_spec{} : spec();
    r.min_compression_elements = min_compression;
    r.bucket_cap_bytes = bucket_kb << 10;
    r.first_bucket_cap_bytes = bucket_kb << 10;
    r.overlap = overlap;
    r.bf16_within_node = bf16_within_node;
    r.reduce.warmup_steps = warmup;
    return r;
  }

  /// The compressor these options name (throws invalid_argument for a spec it cannot read).
  gradcomp::compressor_spec spec() const { return gradcomp::compressor_spec::parse(compressor); }
  /// Whether the planner chooses each bucket's compressor ("auto", "auto:of=...").
  bool automatic() const { return gradcomp::is_auto_spec(compressor); }
  /// What the planner weighs, for an automatic spec.
  gradcomp::planner_options planner() const {
    gradcomp::planner_options p;
    p.candidates = gradcomp::auto_candidates(compressor);
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

/// How a rank's gradients reach the other ranks. The backward pass hands
/// over each tensor's gradient as soon as it is computed (ready); finish()
/// waits for the reductions and leaves the rank-mean of every tensor in a
/// flat buffer, in the model's layout.
class reducer {
 public:
  virtual ~reducer() = default;
  /// Tensor t's gradient (layout order) is computed: `values`.
  virtual void ready(std::size_t tensor, float const* values) = 0;
  /// Waits for every reduction of this step; writes the mean gradient.
  virtual void finish(float* gradient) = 0;
  /// Bytes the last step put on the wire.
  virtual std::size_t wire_bytes() const = 0;
  /// Seconds spent in collectives so far (0 where they cannot be told apart
  /// from the compression kernels: NCCL runs both on one stream).
  virtual double comm_seconds() const = 0;
  /// Seconds spent reducing buckets so far, collectives included (on the
  /// host: each bucket's reduction, wherever it ran).
  virtual double reduction_seconds() const = 0;
  /// The reductions' state (residuals, compressor state, steps).
  virtual std::vector<std::byte> save() = 0;
  /// Restores what save() wrote (collective).
  virtual void restore(std::vector<std::byte> const& bytes) = 0;
  /// The runs of a model of `d` parameters whose mean finish() writes, and
  /// whose weights and momentum this rank updates: all of it, unless the
  /// optimizer is sharded.
  virtual std::vector<gradcomp::element_range> owned(std::size_t d) const { return {{0, d}}; }
  /// After this rank updated its owned weights: gives every rank the others'
  /// (collective; nothing to do unless the optimizer is sharded).
  virtual void share(float* /*weights*/) {}
};

/// Makes the reducer for a model's parameter layout.
using reducer_factory = std::function<std::unique_ptr<reducer>(gradcomp::bucket_layout const&)>;

/// The model's tensors in the order the backward pass produces them (the
/// MLP's last layer first: weights, then bias).
inline std::vector<std::size_t> backward_order(gradcomp::bucket_layout const& layout) {
  std::size_t const tensors = layout.tensors().size();
  std::vector<std::size_t> order;
  for (std::size_t layer = tensors / 2; layer-- > 0;) order.insert(order.end(), {2 * layer, 2 * layer + 1});
  return order;
}

/// The node and the rail this rank is in (nodes of ranks_per_node
/// consecutive ranks), each timed.
template <class Collective>
struct two_levels {
  using timed = timed_collective<Collective>;
  two_levels(Collective& world, int ranks_per_node)
      : raw(gradcomp::split_nodes(world, ranks_per_node)), groups{timed(raw.local), timed(raw.cross)} {}
  double seconds() const { return groups.local.seconds() + groups.cross.seconds(); }
  gradcomp::node_groups<Collective> raw;
  gradcomp::node_groups<timed> groups;
};

/// A gradcomp model_reducer over `Collective` on the host, gradients stored
/// as G, timing its collectives.
template <class Collective, gradcomp::gradient_element G>
class host_reducer : public reducer {
  using timed = timed_collective<Collective>;
  using model_reducer = gradcomp::model_reducer<timed, gradcomp::host_space, G>;

 public:
  host_reducer(options const& o, Collective& comm, gradcomp::bucket_layout const& layout)
      : layout_(layout), timed_(comm) {
    gradcomp::host_space const one{.threads = 1};  // the ranks are the threads
    gradcomp::model_reducer_options reducing = o.reducer_options();
    if (o.ranks_per_node > 0) {  // two levels: nodes of ranks_per_node ranks, rails across them
      nodes_ = std::make_unique<two_levels<Collective>>(comm, o.ranks_per_node);
      if (o.automatic()) reducing = planned(nodes_->raw, comm.rank(), o, layout);
      reduce_ = std::make_unique<model_reducer>(shapes(layout), nodes_->groups, reducing, one);
    } else {  // (the planner chooses each large bucket's compressor over the real world, untimed)
      if (o.automatic()) reducing = planned(comm, comm.rank(), o, layout);
      reduce_ = std::make_unique<model_reducer>(shapes(layout), timed_, reducing, one);
    }
    auto const order = backward_order(layout);
    parameter_of_.resize(order.size());
    for (std::size_t p = 0; p < order.size(); ++p) parameter_of_[order[p]] = p;
  }
  // The options with each large bucket's compressor chosen by the planner
  // over `world` (flat, or node_groups), its table and predictions printed
  // by rank 0.
  template <class World>
  static gradcomp::model_reducer_options planned(World& world, int rank, options const& o,
                                                 gradcomp::bucket_layout const& layout) {
    gradcomp::host_space const one{.threads = 1};
    auto [chosen, plan] = gradcomp::choose_compressors<G>(world, shapes(layout), o.reducer_options(), one, o.planner());
    if (rank == 0) std::printf("%s", plan.table().c_str());
    print_predictions(world, rank, shapes(layout), chosen, plan, one);
    return chosen;
  }

  // One line per candidate (and the plan's choice), "prediction: spec=S
  // ms=T": the predicted reductions of a whole step, the small buckets (the
  // `small` compressor whatever the choice, planned here too) included; what
  // bench/e2e/validate.sh compares with measured steps.
  template <class World>
  static void print_predictions(World& world, int rank, std::vector<std::vector<std::size_t>> const& model,
                                gradcomp::model_reducer_options const& options, gradcomp::compression_plan const& plan,
                                gradcomp::host_space const& space) {
    gradcomp::bucket_plan const buckets = gradcomp::plan_buckets(model, sizeof(G), options);
    std::vector<gradcomp::bucket_layout> small;
    for (auto const& b : buckets.buckets) {
      if (b.compressed) continue;
      small.emplace_back();
      for (std::size_t p : b.params) small.back().add(model[p]);
    }
    gradcomp::planner_options planner;
    planner.candidates = {options.small};
    planner.bf16_within_node = options.bf16_within_node;
    double const rest = small.empty() ? 0.0 : gradcomp::plan_compression<G>(world, small, space, planner).predicted();
    if (rank != 0 || plan.buckets.empty()) return;
    for (auto const& row : plan.buckets.front().rows)
      if (double const t = plan.predicted(row.spec); t >= 0)
        std::printf("prediction: spec=%s ms=%.3f\n", row.spec.c_str(), (t + rest) * 1e3);
    std::printf("prediction: spec=auto ms=%.3f\n", (plan.predicted() + rest) * 1e3);
  }

  void ready(std::size_t tensor, float const* values) override {
    std::size_t const p = parameter_of_[tensor];
    auto g = reduce_->gradient(p);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = G(values[i]);
    reduce_->mark_ready(p);
  }
  void finish(float* gradient) override {
    reduce_->finish();
    for (auto const& e : reduce_->timeline()) busy_ += e.finished - e.started;
    for (std::size_t t = 0; t < layout_.tensors().size(); ++t) {
      auto const g = reduce_->gradient(parameter_of_[t]);
      float* out = gradient + layout_.tensors()[t].offset;
      for (std::size_t i = 0; i < g.size(); ++i) out[i] = static_cast<float>(g[i]);
    }
  }
  std::size_t wire_bytes() const override { return reduce_->wire_bytes(); }
  double comm_seconds() const override { return timed_.seconds() + (nodes_ ? nodes_->seconds() : 0.0); }
  double reduction_seconds() const override { return busy_; }
  std::vector<std::byte> save() override { return reduce_->save(); }
  void restore(std::vector<std::byte> const& bytes) override { reduce_->restore({bytes.data(), bytes.size()}); }

 private:
  static std::vector<std::vector<std::size_t>> shapes(gradcomp::bucket_layout const& layout) {
    std::vector<std::vector<std::size_t>> out;
    for (std::size_t t : backward_order(layout)) out.push_back(layout.tensors()[t].shape);
    return out;
  }

  gradcomp::bucket_layout layout_;
  timed timed_;
  std::unique_ptr<two_levels<Collective>> nodes_;
  std::unique_ptr<model_reducer> reduce_;
  std::vector<std::size_t> parameter_of_;  // layout tensor -> the reducer's parameter
  double busy_ = 0;
};

/// A sharded optimizer's reductions (ZeRO-2, FSDP's SHARD_GRAD_OP): each
/// bucket's gradient is reduce-scattered through the compressor, so a rank
/// receives the mean of its shard only and updates only that shard's weights
/// and momentum; the ranks then all-gather the updated weights, so every
/// replica holds the same bits: in fp32, or in bf16 (FSDP's mixed precision:
/// every rank computes with the bf16 weights, and updates fp32 masters of its
/// shard, kept by train_rank). Buckets are made as model_reducer makes
/// them (backward order; 1-D tensors and small buckets in bf16), and each is
/// reduced once its last gradient is ready, on the training thread. With
/// ranks_per_node, buckets are reduce-scattered in two levels
/// (hierarchical_reduce_scatterer), and the weights all-gathered over the world.
template <class Collective, gradcomp::gradient_element G>
class sharded_reducer : public reducer {
  using timed = timed_collective<Collective>;
  using scatterer = gradcomp::any_reduce_scatterer<timed, gradcomp::host_space, G>;

 public:
  sharded_reducer(options const& o, Collective& comm, gradcomp::bucket_layout const& layout)
      : layout_(layout), timed_(comm), sixteen_bit_(o.gather_dtype == "bf16") {
    gradcomp::host_space const one{.threads = 1};  // the ranks are the threads
    // Two levels: each bucket reduce-scattered in the node, then compressed
    // across nodes; ranks are counted node by node, as the world numbers them.
    if (o.ranks_per_node > 0) nodes_ = std::make_unique<two_levels<Collective>>(comm, o.ranks_per_node);
    auto const& tensors = layout.tensors();
    bucket_of_.resize(tensors.size());
    offset_in_bucket_.resize(tensors.size());
    // Buckets in backward order: matrices up to the cap, vectors on their own.
    std::size_t constexpr none = ~std::size_t{0};
    std::size_t open[2] = {none, none};  // the open bucket of matrices, and of vectors
    for (std::size_t t : backward_order(layout)) {
      int const kind = tensors[t].shape.size() <= 1 ? 1 : 0;
      if (open[kind] == none) open[kind] = buckets_.size(), buckets_.emplace_back();
      bucket& b = buckets_[open[kind]];
      bucket_of_[t] = open[kind];
      offset_in_bucket_[t] = b.layout.size();
      b.tensors.push_back(t);
      b.layout.add(tensors[t].shape);
      if (kind == 0 && b.layout.size() * sizeof(G) >= (o.bucket_kb << 10)) open[kind] = none;
    }
    gradcomp::model_reducer_options const plan = o.reducer_options();
    auto const large = [&](bucket const& b) {
      return tensors[b.tensors.front()].shape.size() > 1 && b.layout.size() >= o.min_compression;
    };
    std::vector<gradcomp::compressor_spec> chosen;  // the planner's, one per large bucket (auto)
    if (o.automatic()) {                            // planned as reduce-scatters over the real world (or its levels)
      std::vector<gradcomp::bucket_layout> layouts;
      for (bucket const& b : buckets_)
        if (large(b)) layouts.push_back(b.layout);
      gradcomp::planner_options const planner = o.planner();
      if (!layouts.empty()) {
        auto const planned = nodes_ ? gradcomp::plan_sharded_compression<G>(nodes_->raw, layouts, one, planner)
                                    : gradcomp::plan_sharded_compression<G>(comm, layouts, one, planner);
        if (comm.rank() == 0) std::printf("%s", planned.table().c_str());
        for (std::size_t b = 0; b < layouts.size(); ++b) chosen.push_back(planned.chosen(b));
      }
    }
    for (std::size_t i = 0, k = 0; i < buckets_.size(); ++i) {
      bucket& b = buckets_[i];
      auto const spec = !large(b) ? plan.small : o.automatic() ? chosen[k++] : plan.compressor;
      gradcomp::allreducer_options r = plan.reduce;
      r.bucket = i;
      if (nodes_)
        b.scatter = std::make_unique<scatterer>(spec, nodes_->groups, b.layout, one,
                                                gradcomp::hierarchical_options{r, o.bf16_within_node});
      else
        b.scatter = std::make_unique<scatterer>(spec, timed_, b.layout, one, r);
      b.values.resize(b.layout.size());
      b.shard.resize(b.scatter->shard_size());
      b.slot = b.scatter->shard_size(0);
      if (sixteen_bit_)
        b.send16.resize(b.slot), b.gathered16.resize(b.slot * static_cast<std::size_t>(comm.size()));
      else
        b.send.resize(b.slot), b.gathered.resize(b.slot * static_cast<std::size_t>(comm.size()));
      b.waiting = b.tensors.size();
    }
  }

  void ready(std::size_t tensor, float const* values) override {
    bucket& b = buckets_[bucket_of_[tensor]];
    std::size_t const at = offset_in_bucket_[tensor];
    std::size_t const n = layout_.tensors()[tensor].elements;
    for (std::size_t i = 0; i < n; ++i) b.values[at + i] = G(values[i]);
    if (--b.waiting > 0) return;
    auto const start = std::chrono::steady_clock::now();
    (*b.scatter)({b.values.data(), b.values.size()}, {b.shard.data(), b.shard.size()});
    busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void finish(float* gradient) override {
    for (bucket& b : buckets_) {
      if (b.waiting != 0) throw std::logic_error("sharded_reducer: a bucket's gradients were not all ready");
      b.waiting = b.tensors.size();
      for_each_run(b, b.scatter->shard_offset(), b.shard.size(), [&](std::size_t flat, std::size_t at, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i)
          gradient[flat + i] = static_cast<float>(b.shard[at - b.scatter->shard_offset() + i]);
      });
    }
  }
  std::vector<gradcomp::element_range> owned(std::size_t) const override {
    std::vector<gradcomp::element_range> out;
    for (bucket const& b : buckets_)
      for_each_run(b, b.scatter->shard_offset(), b.shard.size(), [&](std::size_t flat, std::size_t, std::size_t n) {
        out.push_back({flat, n});
      });
    return out;
  }
  void share(float* weights) override {
    auto const start = std::chrono::steady_clock::now();
    for (bucket& b : buckets_) {
      if (sixteen_bit_)
        gather(b, b.send16, b.gathered16, weights);
      else
        gather(b, b.send, b.gathered, weights);
    }
    busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::size_t wire_bytes() const override {  // the gradients' reduce-scatters, and the weights' all-gathers
    std::size_t const weight = sixteen_bit_ ? sizeof(gradcomp::bfloat16) : sizeof(float);
    std::size_t bytes = 0;
    for (bucket const& b : buckets_)
      bytes += b.scatter->wire_bytes() + b.slot * weight * static_cast<std::size_t>(timed_.size() - 1);
    return bytes;
  }
  double comm_seconds() const override { return timed_.seconds() + (nodes_ ? nodes_->seconds() : 0.0); }
  double reduction_seconds() const override { return busy_; }
  std::vector<std::byte> save() override {  // how weights travel, then each bucket's state with its size
    std::vector<std::byte> out;
    auto put = [&](std::uint64_t word) {
      auto const* p = reinterpret_cast<std::byte const*>(&word);
      out.insert(out.end(), p, p + sizeof word);
    };
    put(sixteen_bit_ ? 16 : 32);
    for (bucket& b : buckets_) {
      auto const bytes = b.scatter->save();
      put(bytes.size());
      out.insert(out.end(), bytes.begin(), bytes.end());
    }
    return out;
  }
  void restore(std::vector<std::byte> const& bytes) override {
    // Every bucket's state is read before any is applied, and the ranks agree
    // first: all restore, or none does.
    std::vector<gradcomp::bucket_checkpoint> parsed;
    std::string failure;
    std::uint64_t steps = 0;
    try {
      std::size_t at = 0;
      auto word = [&] {
        std::uint64_t w = 0;
        if (bytes.size() - at < sizeof w) throw gradcomp::checkpoint_error("the sharded reducer's state is truncated");
        std::memcpy(&w, bytes.data() + at, sizeof w);
        at += sizeof w;
        return w;
      };
      std::uint64_t const bits = word();
      if (bits != 16 && bits != 32) throw gradcomp::checkpoint_error("the checkpoint is not a sharded optimizer's");
      if (bits != (sixteen_bit_ ? 16u : 32u))
        throw gradcomp::checkpoint_error("the checkpoint's weights were all-gathered in " +
                                         std::string(bits == 16 ? "bf16" : "fp32") + "; this run gathers them in " +
                                         (sixteen_bit_ ? "bf16" : "fp32"));
      for (bucket const& b : buckets_) {
        std::uint64_t const size = word();
        if (bytes.size() - at < size) throw gradcomp::checkpoint_error("the sharded reducer's state is truncated");
        parsed.push_back(b.scatter->parse_checkpoint({bytes.data() + at, static_cast<std::size_t>(size)}));
        at += size;
        if (parsed.back().steps != parsed.front().steps)
          throw gradcomp::checkpoint_error("the sharded reducer's buckets are of different steps");
      }
      if (at != bytes.size()) throw gradcomp::checkpoint_error("the sharded reducer's state has bytes left over");
      steps = parsed.empty() ? 0 : parsed.front().steps;
    } catch (gradcomp::checkpoint_error const& e) {
      failure = e.what();
    }
    // Every rank's verdict and step, on every rank: all throw the same
    // error, or none does.
    gradcomp::expect_restorable(gradcomp::agreement(timed_, gradcomp::host_space{.threads = 1}, steps, 0, failure),
                                failure);
    for (std::size_t i = 0; i < buckets_.size(); ++i) buckets_[i].scatter->restore(parsed[i]);
  }

 private:
  struct bucket {
    std::vector<std::size_t> tensors;  // layout indices, in bucket order
    gradcomp::bucket_layout layout;
    std::unique_ptr<scatterer> scatter;
    std::vector<G> values, shard;                        // the bucket's gradient; this rank's shard of the mean
    std::size_t slot = 0;                                // elements each rank sends in the weights' all-gather
    std::vector<float> send, gathered;                   // that all-gather's buffers (fp32) ...
    std::vector<gradcomp::bfloat16> send16, gathered16;  // ... or bf16
    std::size_t waiting = 0;                             // tensors not yet ready this step
  };

  // All-gathers every rank's shard of `weights` as T into `weights`.
  template <class T>
  void gather(bucket const& b, std::vector<T>& mine, std::vector<T>& all, float* weights) {
    std::size_t const first = b.scatter->shard_offset();
    std::fill(mine.begin(), mine.end(), T(0.0f));
    for_each_run(b, first, b.shard.size(), [&](std::size_t flat, std::size_t at, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) mine[at - first + i] = T(weights[flat + i]);
    });
    timed_.all_gather(mine.data(), all.data(), b.slot);
    for (int r = 0; r < timed_.size(); ++r) {
      std::size_t const from = b.scatter->shard_offset(r);
      T const* theirs = all.data() + static_cast<std::size_t>(r) * b.slot;
      for_each_run(b, from, b.scatter->shard_size(r), [&](std::size_t flat, std::size_t at, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) weights[flat + i] = static_cast<float>(theirs[at - from + i]);
      });
    }
  }

  // Calls f(flat offset, bucket offset, count) for each run of the bucket's
  // elements [first, first + count) that lies in one tensor.
  template <class F>
  void for_each_run(bucket const& b, std::size_t first, std::size_t count, F&& f) const {
    std::size_t const end = first + count;
    for (std::size_t tensor : b.tensors) {
      auto const& t = layout_.tensors()[tensor];
      std::size_t const at = offset_in_bucket_[tensor];
      std::size_t const lo = std::max(first, at), hi = std::min(end, at + t.elements);
      if (lo < hi) f(t.offset + (lo - at), lo, hi - lo);
    }
  }

  gradcomp::bucket_layout layout_;
  timed timed_;
  std::unique_ptr<two_levels<Collective>> nodes_;  // two levels, or none (flat)
  std::vector<bucket> buckets_;
  std::vector<std::size_t> bucket_of_;         // layout tensor -> its bucket ...
  std::vector<std::size_t> offset_in_bucket_;  // ... and where it starts there
  bool sixteen_bit_;                           // weights all-gathered in bf16
  double busy_ = 0;
};

/// The host reducer `o` names, over `comm`.
template <class Collective>
reducer_factory host_reducers(options const& o, Collective& comm) {
  return [&o, &comm](gradcomp::bucket_layout const& layout) -> std::unique_ptr<reducer> {
    bool const half = o.grad_dtype == "bf16";
    if (o.shard_optimizer) {
      if (half) return std::make_unique<sharded_reducer<Collective, gradcomp::bfloat16>>(o, comm, layout);
      return std::make_unique<sharded_reducer<Collective, float>>(o, comm, layout);
    }
    if (half) return std::make_unique<host_reducer<Collective, gradcomp::bfloat16>>(o, comm, layout);
    return std::make_unique<host_reducer<Collective, float>>(o, comm, layout);
  };
}

/// What a rank saves to resume a run: the weights, the optimizer's momentum
/// (of this rank's shards: all of them unless the optimizer is sharded), the
/// reducer's state and where the run was. One file per rank.
struct checkpoint {
  std::uint64_t step = 0;
  double wall_s = 0, loss_sum = 0;
  std::uint64_t loss_count = 0, wire = 0;
  std::vector<float> weights, velocity;
  std::vector<std::byte> reducer;

  static std::string file(std::string const& path, int rank) { return path + ".rank" + std::to_string(rank); }

  void write(std::string const& path) const {
    std::string const tmp = path + ".partial";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      auto put = [&](void const* p, std::size_t n) { out.write(static_cast<char const*>(p), static_cast<long>(n)); };
      std::uint64_t const sizes[3] = {weights.size(), velocity.size(), reducer.size()};
      put(magic, sizeof magic);
      put(&step, 8), put(&wall_s, 8), put(&loss_sum, 8), put(&loss_count, 8), put(&wire, 8), put(sizes, sizeof sizes);
      put(weights.data(), weights.size() * 4), put(velocity.data(), velocity.size() * 4);
      put(reducer.data(), reducer.size());
      if (!out) throw std::runtime_error("cannot write the checkpoint " + tmp);
    }
    std::rename(tmp.c_str(), path.c_str());  // a crash mid-write leaves the last whole checkpoint
  }

  /// Reads a file write() wrote for a model of `d` parameters, of which
  /// this rank owns `owned` (its momentum's length).
  static checkpoint read(std::string const& path, std::size_t d, std::size_t owned) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open the checkpoint " + path);
    checkpoint c;
    auto get = [&](void* p, std::size_t n) {
      if (!in.read(static_cast<char*>(p), static_cast<long>(n)))
        throw std::runtime_error("the checkpoint " + path + " is truncated");
    };
    char m[sizeof magic];
    std::uint64_t sizes[3];
    get(m, sizeof m);
    if (std::memcmp(m, magic, sizeof m) != 0) throw std::runtime_error(path + " is not a training checkpoint");
    get(&c.step, 8), get(&c.wall_s, 8), get(&c.loss_sum, 8), get(&c.loss_count, 8), get(&c.wire, 8),
        get(sizes, sizeof sizes);
    if (sizes[0] != d)
      throw std::runtime_error("the checkpoint " + path + " is of a model of " + std::to_string(sizes[0]) +
                               " parameters; this one has " + std::to_string(d));
    if (sizes[1] != owned)
      throw std::runtime_error("the checkpoint " + path + " holds the momentum of " + std::to_string(sizes[1]) +
                               " parameters; this rank updates " + std::to_string(owned) +
                               " (is the optimizer sharded in one run and not the other?)");
    if (sizes[2] > (std::uint64_t{1} << 32)) throw std::runtime_error("the checkpoint " + path + " is corrupt");
    c.weights.resize(d), c.velocity.resize(owned), c.reducer.resize(sizes[2]);
    get(c.weights.data(), d * 4), get(c.velocity.data(), owned * 4), get(c.reducer.data(), c.reducer.size());
    return c;
  }

  static constexpr char magic[8] = {'G', 'C', 'T', 'R', 'A', 'I', 'N', '1'};
};

inline std::uint64_t weights_hash(std::vector<float> const& w) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (float v : w) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 0x100000001b3ull;
  }
  return hash;
}

/// Test accuracy of `model`.
inline double accuracy(mlp& model, dataset const& test) {
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < test.count; begin += 1000) {
    std::size_t const batch = std::min<std::size_t>(1000, test.count - begin);
    auto const predicted = model.predict(test.images.data() + begin * test.pixels, batch);
    for (std::size_t b = 0; b < batch; ++b) correct += predicted[b] == test.labels[begin + b];
  }
  return static_cast<double>(correct) / static_cast<double>(test.count);
}

/// Seconds of one step's forward and backward passes on a batch of
/// `o.batch` examples: the median of five after a warm one, the slowest
/// rank's (collective over `comm`).
template <class Collective>
double forward_backward_seconds(Collective& comm, mlp& model, dataset const& train_set, options const& o) {
  std::size_t const batch = std::min(o.batch, train_set.count);
  std::vector<float> gradient(model.layout().size());
  std::vector<double> times;
  for (int s = 0; s < 6; ++s) {
    auto const start = std::chrono::steady_clock::now();
    (void)model.loss_and_gradient(train_set.images.data(), train_set.labels.data(), batch, gradient.data(),
                                  [](std::size_t) {});
    if (s > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  double slowest = times[times.size() / 2];
  comm.all_reduce(&slowest, &slowest, 1, gradcomp::reduce_op::max);
  return slowest;
}

/// Trains one rank of `comm`; every rank must call it with the same options.
/// Gradients travel through the reducer `make` builds (by default over `comm`
/// itself), bucket by bucket as the backward pass produces them; `comm` also
/// carries the few control messages. Returns rank 0's records (other ranks
/// return an empty result).
template <class Collective>
result train_rank(Collective& comm, options const& o, dataset const& train_set, dataset const& test_set,
                  reducer_factory make = {}) {
  using clock = std::chrono::steady_clock;
  int const rank = comm.rank(), ranks = comm.size();
  std::vector<std::size_t> sizes{train_set.pixels};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(10);
  mlp model(sizes, o.seed);  // the same weights on every rank
  std::size_t const d = model.layout().size();

  options planned = o;  // (a reducer of the caller's own plans nothing)
  if (!make && o.automatic() && !o.steps_factor.empty())
    planned.compute_seconds = forward_backward_seconds(comm, model, train_set, o);
  auto reduce = (make ? make : host_reducers(planned, comm))(model.layout());
  // The runs of weights this rank updates; the optimizer's state (momentum,
  // 16-bit gathers' fp32 masters) holds only those, one run after another.
  auto const owned = reduce->owned(d);
  std::size_t state = 0;
  for (auto const& run : owned) state += run.count;

  // This rank's shard: every ranks-th example, reshuffled each epoch.
  std::vector<std::size_t> shard;
  for (std::size_t i = rank; i < train_set.count; i += ranks) shard.push_back(i);
  std::size_t const steps_per_epoch = shard.size() / o.batch;
  std::size_t const total_steps = static_cast<std::size_t>(o.epochs * static_cast<double>(steps_per_epoch));
  std::vector<float> images(o.batch * train_set.pixels), gradient(d), velocity(state, 0.0f);
  std::vector<std::uint8_t> labels(o.batch);
  auto shuffle = [&](std::size_t epoch) {
    std::shuffle(shard.begin(), shard.end(), std::mt19937_64(o.seed * 7919 + epoch * 131 + rank));
  };

  result out;
  double eval_seconds = 0, exposed_seconds = 0, loss_sum = 0, resumed_wall = 0;
  std::size_t loss_count = 0, wire = 0, first_step = 0;
  if (!o.resume.empty()) {  // every rank restores together, or none does
    checkpoint c;
    std::string failure;
    try {
      c = checkpoint::read(checkpoint::file(o.resume, rank), d, state);
    } catch (std::exception const& e) {
      failure = e.what();
    }
    try {
      reduce->restore(c.reducer);  // (an empty state fails on every rank)
    } catch (std::exception const& e) {
      throw std::runtime_error(failure.empty() ? std::string(e.what()) : failure);
    }
    model.params() = std::move(c.weights);  // (16-bit gathers: this rank's masters, rounded below)
    velocity = std::move(c.velocity);
    first_step = c.step, resumed_wall = c.wall_s, loss_sum = c.loss_sum, loss_count = c.loss_count, wire = c.wire;
    for (std::size_t epoch = 0; epoch * steps_per_epoch < first_step; ++epoch) shuffle(epoch);  // the data order so far
  }
  // Weights all-gathered in bf16: this rank updates fp32 masters of its
  // shards, and every rank computes with the weights rounded to bf16.
  std::vector<float> master;
  if (o.shard_optimizer && o.gather_dtype == "bf16") {
    for (auto const& run : owned)
      master.insert(master.end(), model.params().begin() + static_cast<std::ptrdiff_t>(run.first),
                    model.params().begin() + static_cast<std::ptrdiff_t>(run.first + run.count));
    for (float& x : model.params()) x = static_cast<float>(gradcomp::bfloat16(x));
  }
  auto const start = clock::now();
  auto wall = [&] { return resumed_wall + std::chrono::duration<double>(clock::now() - start).count() - eval_seconds; };
  std::int32_t stop = 0;
  for (std::size_t step = first_step; step < total_steps && !stop && (o.max_steps == 0 || step < o.max_steps); ++step) {
    std::size_t const in_epoch = step % steps_per_epoch;
    if (in_epoch == 0) shuffle(step / steps_per_epoch);
    for (std::size_t b = 0; b < o.batch; ++b) {
      std::size_t const example = shard[in_epoch * o.batch + b];
      std::memcpy(images.data() + b * train_set.pixels, train_set.images.data() + example * train_set.pixels,
                  train_set.pixels * sizeof(float));
      labels[b] = train_set.labels[example];
    }
    // Backward: each tensor's gradient goes to its bucket as soon as it is
    // computed; a whole bucket starts reducing while the layers below are
    // differentiated.
    // (exposed: what the training thread spends on reductions, in ready()
    // and finish(); without overlap every reduction runs inside ready().)
    loss_sum += model.loss_and_gradient(images.data(), labels.data(), o.batch, gradient.data(), [&](std::size_t t) {
      auto const before = clock::now();
      reduce->ready(t, gradient.data() + model.layout().tensors()[t].offset);
      exposed_seconds += std::chrono::duration<double>(clock::now() - before).count();
    });
    ++loss_count;
    auto const before = clock::now();
    reduce->finish(gradient.data());  // the rank mean, through the compressor
    exposed_seconds += std::chrono::duration<double>(clock::now() - before).count();
    wire += reduce->wire_bytes();

    auto& w = model.params();
    std::size_t k = 0;             // this weight's place in the optimizer's state
    for (auto const& run : owned)  // (a sharded optimizer: this rank's shards; then every rank's weights)
      for (std::size_t i = run.first; i < run.first + run.count; ++i, ++k) {
        velocity[k] = o.momentum * velocity[k] + gradient[i];
        if (master.empty()) {
          w[i] -= o.lr * velocity[k];
        } else {
          master[k] -= o.lr * velocity[k];
          w[i] = master[k];
        }
      }
    reduce->share(w.data());
    if (o.check_replicas) {
      std::uint64_t const hash = weights_hash(w);
      std::vector<std::uint64_t> all(ranks);
      comm.all_gather(&hash, all.data(), 1);
      for (int r = 1; r < ranks; ++r)
        if (all[r] != all[0])
          throw std::runtime_error("rank " + std::to_string(r) + "'s weights differ from rank 0's after step " +
                                   std::to_string(step + 1));
    }

    bool const last = step + 1 == total_steps || step + 1 == o.max_steps;
    if ((step + 1) % o.eval_every == 0 || last) {
      if (rank == 0) {
        auto const eval_start = clock::now();
        double const now = wall();
        double const acc = accuracy(model, test_set);
        eval_seconds += std::chrono::duration<double>(clock::now() - eval_start).count();
        double const comm_s = reduce->comm_seconds();
        out.records.push_back({step + 1, static_cast<double>(step + 1) / steps_per_epoch, now,
                               std::max(0.0, reduce->reduction_seconds() - comm_s), comm_s, wire, loss_sum / loss_count,
                               acc, exposed_seconds});
        if (acc >= o.target && out.time_to_target < 0) out.time_to_target = now, out.steps_to_target = step + 1;
        stop = (o.stop_at_target && out.time_to_target >= 0) || (o.time_budget > 0 && now >= o.time_budget);
      }
      loss_sum = 0;
      loss_count = 0;
      comm.broadcast(&stop, 1, 0);  // rank 0 decides for everyone
    }
    if (!o.checkpoint.empty() && o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) {
      double now = rank == 0 ? wall() : 0;  // rank 0's clock, as the records
      comm.broadcast(&now, 1, 0);
      checkpoint c{step + 1, now, loss_sum, loss_count, wire, model.params(), velocity, reduce->save()};
      std::size_t k = 0;
      for (auto const& run : master.empty() ? decltype(owned){} : owned) {  // this rank's masters, whole
        std::copy_n(master.data() + k, run.count, c.weights.data() + run.first);
        k += run.count;
      }
      c.write(checkpoint::file(o.checkpoint, rank));
    }
  }
  out.wire_bytes_per_step = reduce->wire_bytes();
  out.weights_hash = weights_hash(model.params());
  if (rank != 0) out.records.clear();
  return out;
}

}  // namespace train
