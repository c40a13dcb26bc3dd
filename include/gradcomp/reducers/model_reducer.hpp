// A model's gradients, packed into buckets and reduced while the backward
// pass goes on: PyTorch DDP's bucketing and overlap, with a compressor per
// bucket (model_reducer), or each bucket reduce-scattered for a sharded
// optimizer (model_reduce_scatterer). An adapter of the model-level core
// (reducers/model/): it owns the gradients' storage and follows the plan.
#pragma once

#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/model/bucket_rules.hpp>
#include <gradcomp/reducers/model/model_buckets.hpp>
#include <gradcomp/reducers/model/options.hpp>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A model's gradients, in buckets, each reduced through `Delivery`
/// (model_reducer: all-reduce; model_reduce_scatterer: reduce-scatter) by
/// its own reducer.
///
/// Built from the parameters' shapes in the order the backward pass produces
/// their gradients, it packs them into buckets (plan_buckets), owns the
/// gradients' storage (gradient(p)), and reduces a bucket as soon as its
/// last gradient is marked ready, while the backward pass goes on. Buckets
/// are reduced in bucket order on every rank (bucket b on lane b mod lanes),
/// so the ranks' collectives match and the results are bitwise those of
/// reducing every bucket after the backward pass, whatever order the
/// gradients become ready in and however many lanes there are.
///
/// A step: write each parameter's gradient into gradient(p), call
/// mark_ready(p) (from a backward hook), then finish() before the optimizer
/// reads the gradients (a reduce-scatter: shard(b) of each bucket).
/// Construction is collective; a step allocates nothing (everything it keeps
/// is sized at construction).
template <class Delivery, class Collective, class Space = default_space_t<Collective>,
          gradient_element Gradient = float>
class basic_model_reducer {
 public:
  using memory = typename Space::memory;
  using gradient_type = Gradient;  ///< How gradients are stored: float, bfloat16 or half.
  using shape = std::vector<std::size_t>;
  using reducer = typename Delivery::template reducer<Collective, Space, Gradient>;

  /// Buckets for `shapes` (in backward order) on this rank of `collective`.
  /// On CUDA, `compute` is the space the backward pass runs in: a bucket's
  /// reduction waits for it by an event, and finish() makes it wait for the
  /// reductions; the host never waits. On the host, the reductions run in
  /// `compute` (its thread count: one where the ranks are threads).
  basic_model_reducer(std::vector<shape> const& shapes, Collective& collective, model_reducer_options options = {},
                      Space compute = {})
      : compute_(compute) {
    flat_ = std::make_unique<flat>(who, collective, std::move(options), reduce_space(collective),
                                   &make_bucket<reducer, Collective, Space>);
    build(*flat_, shapes);
  }

  /// The same, every bucket reduced in two levels over `groups` (the
  /// hierarchical reducers; `compressor` must be one that shards).
  /// Collective over the world.
  basic_model_reducer(std::vector<shape> const& shapes, node_groups<Collective>& groups,
                      model_reducer_options options = {}, Space compute = {})
      : compute_(compute) {
    two_level_ = std::make_unique<two_level>(who, groups, std::move(options), reduce_space(groups.local),
                                             &make_bucket<reducer, node_groups<Collective>, Space>);
    build(*two_level_, shapes);
  }

  basic_model_reducer(basic_model_reducer const&) = delete;
  basic_model_reducer& operator=(basic_model_reducer const&) = delete;

  /// Parameter p's gradient, to be written by the backward pass.
  span<Gradient, memory> gradient(std::size_t p) {
    check_parameter(p);
    return storage_.view().subspan(plan_.params[p].offset, plan_.params[p].size);
  }

  /// Parameter p's gradient is written: once every gradient of its bucket
  /// is, the bucket is reduced (and then every later bucket already whole).
  void mark_ready(std::size_t p) {
    check_parameter(p);
    GRADCOMP_EXPECTS(!marked_[p],
                     std::string(who) + ": parameter " + std::to_string(p) + " was marked ready twice in one step");
    marked_[p] = 1;
    std::size_t const b = plan_.params[p].bucket;
    if (--waiting_[b] != 0) return;
#if GRADCOMP_HAS_CUDA
    if constexpr (on_device) GRADCOMP_CUDA_TRY(cudaEventRecord(ready_events_[b].get(), compute_.stream));
#endif
    while (next_launch_ < plan_.buckets.size() && waiting_[next_launch_] == 0) launch(next_launch_++);
  }

  /// Waits for every bucket's reduction, then rethrows the first error one
  /// raised (every rank raises the same). Throws invalid_argument naming the
  /// parameters never marked ready (their buckets were not reduced).
  /// @note Host: waits for the reductions. CUDA: never waits; orders
  /// `compute` after them.
  void finish() {
    std::exception_ptr error;
    try {
      visit([](auto& core) { core.finish(); });
    } catch (...) {
      error = std::current_exception();
    }
#if GRADCOMP_HAS_CUDA
    if constexpr (on_device) {
      cudaStream_t const stream = visit([](auto& core) { return core.space().stream; });
      GRADCOMP_CUDA_TRY(cudaEventRecord(finished_event_.get(), stream));
      GRADCOMP_CUDA_TRY(cudaStreamWaitEvent(compute_.stream, finished_event_.get(), 0));
    }
#endif
    std::string missing;
    for (std::size_t p = 0; p < plan_.params.size(); ++p)
      if (!marked_[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    reset_step();
    if (error) std::rethrow_exception(error);
    GRADCOMP_EXPECTS(missing.empty(), std::string(who) + ": finish() before parameters " + missing +
                                          " were marked ready (their buckets were not reduced)");
  }

  /// Buckets, in the order they are reduced.
  std::size_t buckets() const { return plan_.buckets.size(); }
  /// Bucket b's reduction (its compressor, layout, steps, wire bytes).
  reducer const& bucket(std::size_t b) const {
    return *visit([&](auto const& core) { return core.bucket(b); });
  }
  /// The parameters bucket b holds, in its layout's order.
  std::vector<std::size_t> const& parameters_of(std::size_t b) const { return plan_.buckets[b].params; }
  /// How the parameters were packed.
  bucket_plan const& plan() const { return plan_; }
  /// The last step's reductions, bucket by bucket, in the order they started.
  std::vector<bucket_event> timeline() const {
    return visit([](auto const& core) { return core.timeline(); });
  }
  /// Bytes the last step put on the wire, every bucket together.
  std::size_t wire_bytes() const {
    return visit([](auto const& core) { return core.wire_bytes(); });
  }

  /// @name Reduce-scatter (model_reduce_scatterer)
  /// @{
  /// This rank's shard of bucket b's mean, after finish().
  span<Gradient, memory> shard(std::size_t b) requires Delivery::scatters {
    return shards_.view().subspan(shard_at_[b], bucket(b).shard_size());
  }
  /// @}

  /// @name Checkpoints: every bucket's state in one checkpoint
  /// @{

  /// This rank's state (see allreducer::save), every bucket's.
  /// @note Waits for the reductions.
  std::vector<std::byte> save() {
    return visit([](auto& core) { return core.save(); });
  }

  /// Restores what save() wrote, on every rank together: if any rank's
  /// checkpoint or any bucket in it is unusable, or the ranks' steps differ,
  /// every rank throws checkpoint_error and no bucket changes. `failure`:
  /// why this rank cannot restore where its caller found it (a state of its
  /// own saved beside this one), agreed as the rest.
  /// @note Collective; waits for the space.
  void restore(span<std::byte const> bytes, std::string failure = {}) {
    visit([&](auto& core) { core.restore(bytes, std::move(failure)); });
  }
  /// @}

  /// A hash of every bucket's configuration.
  std::uint64_t fingerprint() const {
    return visit([](auto const& core) {
      std::uint64_t h = detail::hash("model_reducer", core.fingerprint());
      for (std::size_t b = 0; b < core.size(); ++b) h = detail::hash_combine(h, core.bucket(b)->fingerprint());
      return h;
    });
  }

 private:
  static constexpr bool on_device = !std::is_same_v<memory, host_memory>;
  static constexpr char const* who = Delivery::model_name;
  using flat = model_buckets<Delivery, Collective, Space, Gradient>;
  using two_level = model_buckets<Delivery, node_groups<Collective>, Space, Gradient>;

  // f(the core), flat or in two levels.
  template <class F>
  decltype(auto) visit(F&& f) {
    return flat_ ? f(*flat_) : f(*two_level_);
  }
  template <class F>
  decltype(auto) visit(F&& f) const {
    return flat_ ? f(std::as_const(*flat_)) : f(std::as_const(*two_level_));
  }

  // The space reductions run in: the collective's on a device, else `compute`.
  Space reduce_space(Collective& collective) const {
    if constexpr (on_device)
      return default_space(collective);
    else
      return compute_;
  }

  template <class Core>
  void build(Core& core, std::vector<shape> const& shapes) {
    model_reducer_options const& options = core.options();
    std::string failure;
    try {
      plan_ = plan_buckets(shapes, sizeof(Gradient), options);
    } catch (std::exception const& e) {
      failure = e.what();
    }
    agree_on_plan(core, shapes, failure);
    storage_ = buffer<Gradient, Space>(plan_.total, core.space());
    core.space().fill_zero(storage_.data(), plan_.total * sizeof(Gradient));
    std::size_t const buckets = plan_.buckets.size();
    std::size_t compressed = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      bucket_layout layout;
      for (std::size_t p : plan_.buckets[b].params) layout.add(shapes[p]);
      core.build(b, std::move(layout),
                 plan_.buckets[b].compressed ? compressor_of(options, compressed++) : options.small);
    }
    if constexpr (Delivery::scatters) {  // each bucket's shard, one after another
      std::size_t total = 0;
      for (std::size_t b = 0; b < buckets; ++b)
        shard_at_.push_back(std::exchange(total, total + bucket(b).shard_size()));
      shards_ = buffer<Gradient, Space>(total, core.space());
      core.space().fill_zero(shards_.data(), total * sizeof(Gradient));
    }
    // What a step keeps, sized once: steps allocate nothing.
    marked_.resize(plan_.params.size());
    waiting_.resize(buckets);
    ready_events_.resize(buckets);
    reset_step();
  }

  // One agreement on the whole plan before any bucket's own: a rank whose
  // model has another number of tensors or buckets would otherwise wait in a
  // bucket's construction that its peers never start.
  template <class Core>
  void agree_on_plan(Core& core, std::vector<shape> const& shapes, std::string& failure) {
    model_reducer_options const& options = core.options();
    std::uint64_t h = detail::hash_combine(plan_fingerprint(plan_, shapes, sizeof(Gradient)), core.fingerprint());
    std::size_t compressed = 0;
    for (auto const& b : plan_.buckets) compressed += b.compressed ? 1 : 0;
    if (failure.empty() && !options.compressors.empty() && options.compressors.size() != compressed)
      failure = std::string(who) + ": " + std::to_string(options.compressors.size()) + " compressors given for " +
                std::to_string(compressed) + " compressed buckets";
    if (failure.empty() && options.compressors.empty() && compressed > 0 && options.compressor.is_automatic())
      failure = std::string(who) + ": the compressor '" + options.compressor.str() +
                "' is the planner's to choose: plan the buckets first (choose_compressors)";
    agreement const all = detail::model::agree_over(core.world(), core.space(), shapes.size(), h, failure);
    expect_none_failed(all, failure, who, "this model or these options");
    expect_same(all, who, "the model", "tensors",
                "model differs from rank 0's (tensor shapes, gradient type, compressors or bucket rules)");
  }

  // The compressor of the k-th compressed bucket.
  static compressor_spec const& compressor_of(model_reducer_options const& o, std::size_t k) {
    return o.compressors.empty() ? o.compressor.spec() : o.compressors[k];
  }

  void check_parameter(std::size_t p) const {
    GRADCOMP_EXPECTS(p < plan_.params.size(), std::string(who) + ": parameter " + std::to_string(p) + " of " +
                                                  std::to_string(plan_.params.size()));
  }

  void reset_step() {
    std::fill(marked_.begin(), marked_.end(), char{0});
    for (std::size_t b = 0; b < waiting_.size(); ++b) waiting_[b] = plan_.buckets[b].params.size();
    next_launch_ = 0;
  }

  void launch(std::size_t b) {
    visit([&](auto& core) {
#if GRADCOMP_HAS_CUDA
      if constexpr (on_device) GRADCOMP_CUDA_TRY(cudaStreamWaitEvent(core.space().stream, ready_events_[b].get(), 0));
#endif
      auto const& bucket = plan_.buckets[b];
      auto gradient = storage_.view().subspan(bucket.offset, bucket.size);
      if constexpr (Delivery::scatters)
        core.submit(b, gradient, shards_.view().subspan(shard_at_[b], core.bucket(b)->shard_size()));
      else
        core.submit(b, gradient);
    });
  }

  Space compute_;
  std::unique_ptr<flat> flat_;  // one of the two
  std::unique_ptr<two_level> two_level_;
  bucket_plan plan_;
  buffer<Gradient, Space> storage_;
  buffer<Gradient, Space> shards_;  // reduce-scatter: each bucket's shard of the mean
  std::vector<std::size_t> shard_at_;

  // This step.
  std::vector<char> marked_;
  std::vector<std::size_t> waiting_;
  std::size_t next_launch_ = 0;

  // CUDA: each bucket's "gradients written" on the compute stream, and "every
  // reduction done" on the collective's stream.
  struct no_event {};
#if GRADCOMP_HAS_CUDA
  using event = std::conditional_t<on_device, detail::cuda_event, no_event>;
#else
  using event = no_event;
#endif
  std::vector<event> ready_events_;
  event finished_event_{};
};

/// A model's gradients in buckets, each all-reduced by its own
/// any_allreducer (see basic_model_reducer).
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
using model_reducer = basic_model_reducer<all_reduce_delivery, Collective, Space, Gradient>;

/// A model's gradients in buckets, each reduce-scattered by its own
/// any_reduce_scatterer: after finish(), shard(b) holds this rank's shard of
/// bucket b's mean (a sharded optimizer updates those weights only).
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
using model_reduce_scatterer = basic_model_reducer<reduce_scatter_delivery, Collective, Space, Gradient>;

}  // namespace gradcomp
