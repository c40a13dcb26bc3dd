// How a rank's gradients reach the other ranks in the training example: the
// reducer interface the training loop calls, and its gradcomp reducers (a
// model_reducer, or a model_reduce_scatterer for a sharded optimizer).
#pragma once

#include "../common/timed_collective.hpp"
#include "options.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace train {

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

/// A gradcomp model-level reducer (`Delivery`: all-reduce, or reduce-scatter
/// for a sharded optimizer) over `Collective` on the host, gradients stored
/// as G, flat or in two levels, timing its collectives; with an automatic
/// spec, each large bucket's compressor chosen by the planner over the real
/// world (untimed), its table and predictions printed by rank 0.
template <class Delivery, class Collective, gradcomp::gradient_element G>
class model_reducer : public reducer {
 protected:
  using timed = timed_collective<Collective>;
  using model = gradcomp::basic_model_reducer<Delivery, timed, gradcomp::host_space, G>;

 public:
  model_reducer(options const& o, Collective& comm, gradcomp::bucket_layout const& layout)
      : layout_(layout), timed_(comm) {
    gradcomp::host_space const one{.threads = 1};  // the ranks are the threads
    gradcomp::model_reducer_options reducing = o.reducer_options();
    if (o.ranks_per_node > 0) {  // two levels: nodes of ranks_per_node ranks, rails across them
      nodes_ = std::make_unique<two_levels<Collective>>(comm, o.ranks_per_node);
      if (o.automatic()) reducing = planned(nodes_->raw, comm.rank(), o, layout);
      reduce_ = std::make_unique<model>(shapes(layout), nodes_->groups, reducing, one);
    } else {
      if (o.automatic()) reducing = planned(comm, comm.rank(), o, layout);
      reduce_ = std::make_unique<model>(shapes(layout), timed_, reducing, one);
    }
    tensor_of_ = backward_order(layout);
    parameter_of_.resize(tensor_of_.size());
    for (std::size_t p = 0; p < tensor_of_.size(); ++p) parameter_of_[tensor_of_[p]] = p;
  }

  void ready(std::size_t tensor, float const* values) override {
    std::size_t const p = parameter_of_[tensor];
    auto g = reduce_->gradient(p);
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = G(values[i]);
    reduce_->mark_ready(p);
  }
  std::size_t wire_bytes() const override { return reduce_->wire_bytes(); }
  double comm_seconds() const override { return timed_.seconds() + (nodes_ ? nodes_->seconds() : 0.0); }
  double reduction_seconds() const override { return busy_; }
  std::vector<std::byte> save() override { return reduce_->save(); }
  void restore(std::vector<std::byte> const& bytes) override { reduce_->restore({bytes.data(), bytes.size()}); }

 protected:
  // Waits for the step's reductions and counts their time.
  void reduce_step() {
    reduce_->finish();
    for (auto const& e : reduce_->timeline()) busy_ += e.finished - e.started;
  }

  static std::vector<std::vector<std::size_t>> shapes(gradcomp::bucket_layout const& layout) {
    std::vector<std::vector<std::size_t>> out;
    for (std::size_t t : backward_order(layout)) out.push_back(layout.tensors()[t].shape);
    return out;
  }

  gradcomp::bucket_layout layout_;
  timed timed_;
  std::unique_ptr<two_levels<Collective>> nodes_;
  std::unique_ptr<model> reduce_;
  std::vector<std::size_t> parameter_of_;  // layout tensor -> the reducer's parameter
  std::vector<std::size_t> tensor_of_;     // and back
  double busy_ = 0;

 private:
  // The options with each large bucket's compressor chosen by the planner
  // over `world` (flat, or node_groups).
  template <class World>
  static gradcomp::model_reducer_options planned(World& world, int rank, options const& o,
                                                 gradcomp::bucket_layout const& layout) {
    gradcomp::host_space const one{.threads = 1};
    auto [chosen, plan] =
        gradcomp::choose_compressors<G, Delivery>(world, shapes(layout), o.reducer_options(), one, o.planner());
    if (rank == 0) std::printf("%s", plan.table().c_str());
    if constexpr (!Delivery::scatters) print_predictions(world, rank, shapes(layout), chosen, plan, one);
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
};

/// Replicated weights: every bucket all-reduced (model_reducer).
template <class Collective, gradcomp::gradient_element G>
class host_reducer final : public model_reducer<gradcomp::all_reduce_delivery, Collective, G> {
  using base = model_reducer<gradcomp::all_reduce_delivery, Collective, G>;

 public:
  using base::base;

  void finish(float* gradient) override {
    this->reduce_step();
    for (std::size_t t = 0; t < this->layout_.tensors().size(); ++t) {
      auto const g = this->reduce_->gradient(this->parameter_of_[t]);
      float* out = gradient + this->layout_.tensors()[t].offset;
      for (std::size_t i = 0; i < g.size(); ++i) out[i] = static_cast<float>(g[i]);
    }
  }
};

/// A sharded optimizer's reductions (ZeRO-2, FSDP's SHARD_GRAD_OP): each
/// bucket's gradient is reduce-scattered through the compressor
/// (model_reduce_scatterer), so a rank receives the mean of its shard only
/// and updates only that shard's weights and momentum; the ranks then
/// all-gather the updated weights, so every replica holds the same bits: in
/// fp32, or in bf16 (FSDP's mixed precision: every rank computes with the
/// bf16 weights, and updates fp32 masters of its shard, kept by train_rank).
template <class Collective, gradcomp::gradient_element G>
class sharded_reducer final : public model_reducer<gradcomp::reduce_scatter_delivery, Collective, G> {
  using base = model_reducer<gradcomp::reduce_scatter_delivery, Collective, G>;

 public:
  sharded_reducer(options const& o, Collective& comm, gradcomp::bucket_layout const& layout)
      : base(o, comm, layout), sixteen_bit_(o.gather_dtype == "bf16") {
    std::size_t const ranks = static_cast<std::size_t>(comm.size());
    for (std::size_t b = 0; b < this->reduce_->buckets(); ++b) {
      std::size_t const slot = this->reduce_->bucket(b).shard_size(0);  // every rank's shard, padded to the first's
      gathers_.push_back({slot, std::vector<float>(sixteen_bit_ ? 0 : slot),
                          std::vector<float>(sixteen_bit_ ? 0 : slot * ranks),
                          std::vector<gradcomp::bfloat16>(sixteen_bit_ ? slot : 0),
                          std::vector<gradcomp::bfloat16>(sixteen_bit_ ? slot * ranks : 0)});
    }
  }

  void finish(float* gradient) override {
    this->reduce_step();
    for (std::size_t b = 0; b < this->reduce_->buckets(); ++b) {
      auto const shard = this->reduce_->shard(b);
      std::size_t const first = this->reduce_->bucket(b).shard_offset();
      for_each_run(b, first, shard.size(), [&](std::size_t flat, std::size_t at, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) gradient[flat + i] = static_cast<float>(shard[at - first + i]);
      });
    }
  }
  std::vector<gradcomp::element_range> owned(std::size_t) const override {
    std::vector<gradcomp::element_range> out;
    for (std::size_t b = 0; b < this->reduce_->buckets(); ++b) {
      auto const& r = this->reduce_->bucket(b);
      for_each_run(b, r.shard_offset(), r.shard_size(), [&](std::size_t flat, std::size_t, std::size_t n) {
        out.push_back({flat, n});
      });
    }
    return out;
  }
  void share(float* weights) override {
    auto const start = std::chrono::steady_clock::now();
    for (std::size_t b = 0; b < this->reduce_->buckets(); ++b) {
      if (sixteen_bit_)
        gather(b, gathers_[b].send16, gathers_[b].all16, weights);
      else
        gather(b, gathers_[b].send, gathers_[b].all, weights);
    }
    this->busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::size_t wire_bytes() const override {  // the gradients' reduce-scatters, and the weights' all-gathers
    std::size_t const weight = sixteen_bit_ ? sizeof(gradcomp::bfloat16) : sizeof(float);
    std::size_t bytes = this->reduce_->wire_bytes();
    for (auto const& g : gathers_) bytes += g.slot * weight * static_cast<std::size_t>(this->timed_.size() - 1);
    return bytes;
  }
  // How the weights travel (a word: 16 or 32), then the reducer's state.
  std::vector<std::byte> save() override {
    std::uint64_t const bits = sixteen_bit_ ? 16 : 32;
    std::vector<std::byte> out(sizeof bits);
    std::memcpy(out.data(), &bits, sizeof bits);
    auto const state = this->reduce_->save();
    out.insert(out.end(), state.begin(), state.end());
    return out;
  }
  void restore(std::vector<std::byte> const& bytes) override {
    std::uint64_t bits = 0;
    std::string failure;  // agreed with the reducer's own: every rank throws the same, or none does
    if (bytes.size() < sizeof bits) {
      failure = "the sharded reducer's state is truncated";
    } else {
      std::memcpy(&bits, bytes.data(), sizeof bits);
      if (bits != 16 && bits != 32)
        failure = "the checkpoint is not a sharded optimizer's";
      else if (bits != (sixteen_bit_ ? 16u : 32u))
        failure = "the checkpoint's weights were all-gathered in " + std::string(bits == 16 ? "bf16" : "fp32") +
                  "; this run gathers them in " + (sixteen_bit_ ? "bf16" : "fp32");
    }
    std::size_t const skip = failure.empty() ? sizeof bits : 0;
    this->reduce_->restore({bytes.data() + skip, bytes.size() - skip}, failure);
  }

 private:
  struct gather_buffers {
    std::size_t slot;                               // elements each rank sends
    std::vector<float> send, all;                   // fp32 ...
    std::vector<gradcomp::bfloat16> send16, all16;  // ... or bf16
  };

  // All-gathers every rank's shard of bucket b's `weights` as T into `weights`.
  template <class T>
  void gather(std::size_t b, std::vector<T>& mine, std::vector<T>& all, float* weights) {
    auto const& r = this->reduce_->bucket(b);
    std::size_t const first = r.shard_offset(), slot = gathers_[b].slot;
    std::fill(mine.begin(), mine.end(), T(0.0f));
    for_each_run(b, first, r.shard_size(), [&](std::size_t flat, std::size_t at, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) mine[at - first + i] = T(weights[flat + i]);
    });
    this->timed_.all_gather(mine.data(), all.data(), slot);
    for (int rank = 0; rank < this->timed_.size(); ++rank) {
      std::size_t const from = r.shard_offset(rank);
      T const* theirs = all.data() + static_cast<std::size_t>(rank) * slot;
      for_each_run(b, from, r.shard_size(rank), [&](std::size_t flat, std::size_t at, std::size_t n) {
        for (std::size_t i = 0; i < n; ++i) weights[flat + i] = static_cast<float>(theirs[at - from + i]);
      });
    }
  }

  // Calls f(flat offset, bucket offset, count) for each run of bucket b's
  // elements [first, first + count) that lies in one tensor.
  template <class F>
  void for_each_run(std::size_t b, std::size_t first, std::size_t count, F&& f) const {
    std::size_t const end = first + count;
    std::size_t at = 0;  // where the parameter starts in the bucket
    for (std::size_t p : this->reduce_->parameters_of(b)) {
      auto const& t = this->layout_.tensors()[this->tensor_of_[p]];
      std::size_t const lo = std::max(first, at), hi = std::min(end, at + t.elements);
      if (lo < hi) f(t.offset + (lo - at), lo, hi - lo);
      at += t.elements;
    }
  }

  bool sixteen_bit_;  // weights all-gathered in bf16
  std::vector<gather_buffers> gathers_;
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

}  // namespace train
