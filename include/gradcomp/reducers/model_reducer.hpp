// A model's gradients, packed into buckets and reduced while the backward
// pass goes on: PyTorch DDP's bucketing and overlap, with a compressor per
// bucket.
#pragma once

#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>
#include <gradcomp/reducers/bucket_plan.hpp>
#include <gradcomp/reducers/model_reducer_options.hpp>
#include <gradcomp/reducers/options.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A model's gradients, in buckets, each reduced by its own any_allreducer.
///
/// Built from the parameters' shapes in the order the backward pass produces
/// their gradients, it packs them into buckets (in that order, by byte cap;
/// 1-D tensors apart), owns the gradients' storage (gradient(p)), and
/// reduces a bucket as soon as its last gradient is marked ready, while the
/// backward pass goes on. Buckets are reduced strictly in bucket order on
/// every rank, so the ranks' collectives match and the results are bitwise
/// those of reducing every bucket after the backward pass, whatever order
/// the gradients become ready in.
///
/// A step: write each parameter's gradient into gradient(p), call
/// mark_ready(p) (from a backward hook), then finish() before the optimizer
/// reads the gradients. Construction is collective; a step allocates
/// nothing (everything it keeps is sized at construction).
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
class model_reducer {
 public:
  using memory = typename Space::memory;
  using gradient_type = Gradient;  ///< How gradients are stored: float, bfloat16 or half.
  using shape = std::vector<std::size_t>;

  /// Buckets for `shapes` (in backward order) on this rank of `collective`.
  /// On CUDA, `compute` is the space the backward pass runs in: a bucket's
  /// reduction waits for it by an event, and finish() makes it wait for the
  /// reductions; the host never waits. On the host, the reductions run in
  /// `compute` (its thread count: one where the ranks are threads).
  model_reducer(std::vector<shape> const& shapes, Collective& collective, model_reducer_options options = {},
                Space compute = {})
      : collective_(&collective),
        options_(std::move(options)),
        compute_(compute),
        space_(on_device ? default_space(collective) : compute) {
    build(shapes, [&](compressor_spec const& spec, bucket_layout layout, allreducer_options const& o) {
      return std::make_unique<bucket_reducer>(spec, collective, std::move(layout), space_, o);
    });
  }

  /// The same, every bucket reduced in two levels over `groups` (see
  /// hierarchical_allreducer; `compressor` must be one that shards).
  /// Collective over the world.
  model_reducer(std::vector<shape> const& shapes, node_groups<Collective>& groups, model_reducer_options options = {},
                Space compute = {})
      : collective_(&groups.local),
        groups_(&groups),
        options_(std::move(options)),
        compute_(compute),
        space_(on_device ? default_space(groups.local) : compute) {
    build(shapes, [&](compressor_spec const& spec, bucket_layout layout, allreducer_options const& o) {
      return std::make_unique<bucket_reducer>(spec, groups, std::move(layout), space_,
                                              hierarchical_options{o, options_.bf16_within_node});
    });
  }

  model_reducer(model_reducer const&) = delete;
  model_reducer& operator=(model_reducer const&) = delete;

  ~model_reducer() {
    if (worker_.joinable()) {
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      wake_.notify_all();
      worker_.join();
    }
  }

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
                     "model_reducer: parameter " + std::to_string(p) + " was marked ready twice in one step");
    if (steps_started_ == 0) step_start_ = clock::now();
    steps_started_ = 1;
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
    if (overlapping()) {
      // The backward pass is over: this thread reduces the buckets still
      // queued itself (one at a time, in order, as the progress thread would)
      // and waits for the one in flight by yielding rather than sleeping. A
      // sleeping thread's wake-up costs a scheduler slice, which on a busy
      // host is longer than what overlap saves.
      std::unique_lock lock(mutex_);
      while (completed_ != next_launch_) {
        if (!running_ && taken_ != queued_) {
          std::size_t const b = take();
          lock.unlock();
          run(b);
          lock.lock();
          running_ = false;
          wake_.notify_all();
          continue;
        }
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
      }
    }
#if GRADCOMP_HAS_CUDA
    if constexpr (on_device) {
      GRADCOMP_CUDA_TRY(cudaEventRecord(finished_event_.get(), space_.stream));
      GRADCOMP_CUDA_TRY(cudaStreamWaitEvent(compute_.stream, finished_event_.get(), 0));
    }
#endif
    std::exception_ptr error = std::exchange(error_, nullptr);
    std::string missing;
    for (std::size_t p = 0; p < plan_.params.size(); ++p)
      if (!marked_[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    reset_step();
    if (error) std::rethrow_exception(error);
    GRADCOMP_EXPECTS(missing.empty(), "model_reducer: finish() before parameters " + missing +
                                          " were marked ready (their buckets were not reduced)");
  }

  /// Buckets, in the order they are reduced.
  std::size_t buckets() const { return plan_.buckets.size(); }
  /// Bucket b's reduction (its compressor, layout, steps, wire bytes).
  any_allreducer<Collective, Space, Gradient> const& bucket(std::size_t b) const { return *reducers_[b]; }
  /// The parameters bucket b holds, in its layout's order.
  std::vector<std::size_t> const& parameters_of(std::size_t b) const { return plan_.buckets[b].params; }
  /// How the parameters were packed.
  bucket_plan const& plan() const { return plan_; }
  /// The last step's reductions, bucket by bucket (a copy).
  std::vector<bucket_event> timeline() const {
    std::lock_guard lock(mutex_);
    return last_timeline_;
  }
  /// Bytes the last step put on the wire, every bucket together.
  std::size_t wire_bytes() const {
    std::size_t total = 0;
    for (auto const& r : reducers_) total += r->wire_bytes();
    return total;
  }

  /// @name Checkpoints: every bucket's state in one checkpoint
  /// @{

  /// This rank's state (see allreducer::save), every bucket's.
  /// @note Waits for the reductions.
  std::vector<std::byte> save() { return detail::save_each(identity(), reducers_); }

  /// Restores what save() wrote, on every rank together: if any rank's
  /// checkpoint or any bucket in it is unusable, or the ranks' steps differ,
  /// every rank throws checkpoint_error and no bucket changes.
  /// @note Collective; waits for the space.
  void restore(span<std::byte const> bytes) {
    auto const [parsed, failure] =
        detail::parsed_or_why([&] { return detail::parse_each(bytes, identity(), reducers_); });
    std::uint64_t const steps = parsed.empty() ? 0 : parsed.front().steps;
    // One agreement for every bucket, over the world.
    expect_restorable(agree(steps, 0, failure), failure);
    for (std::size_t b = 0; b < reducers_.size(); ++b) reducers_[b]->restore(parsed[b]);
  }
  /// @}

  /// A hash of every bucket's configuration.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash("model_reducer");
    for (auto const& r : reducers_) h = detail::hash_combine(h, r->fingerprint());
    return h;
  }

 private:
  using clock = std::chrono::steady_clock;
  static constexpr bool on_device = !std::is_same_v<memory, host_memory>;

  using bucket_reducer = any_allreducer<Collective, Space, Gradient>;

  bool overlapping() const { return !on_device && options_.overlap; }

  template <class Make>
  void build(std::vector<shape> const& shapes, Make make) {
    std::string failure;
    try {
      plan_ = plan_buckets(shapes, sizeof(Gradient), options_);
    } catch (std::exception const& e) {
      failure = e.what();
    }
    agree_on_plan(shapes, failure);
    std::size_t const buckets = plan_.buckets.size();
    storage_ = buffer<Gradient, Space>(plan_.total, space_);
    space_.fill_zero(storage_.data(), plan_.total * sizeof(Gradient));
    std::size_t compressed = 0;
    for (std::size_t b = 0; b < buckets; ++b) {
      bucket_layout layout;
      for (std::size_t p : plan_.buckets[b].params) layout.add(shapes[p]);
      allreducer_options o = options_.reduce;
      o.bucket = b;
      reducers_.push_back(
          make(plan_.buckets[b].compressed ? compressor_of(compressed++) : options_.small, std::move(layout), o));
    }
    // What a step keeps, sized once: steps allocate nothing.
    marked_.resize(plan_.params.size());
    waiting_.resize(buckets);
    launched_at_.resize(buckets);
    timeline_.reserve(buckets);
    last_timeline_.reserve(buckets);
    ready_events_.resize(buckets);
    reset_step();
    if (overlapping()) worker_ = std::thread([this] { progress(); });
  }

  // One agreement on the whole plan before any bucket's own: a rank whose
  // model has another number of tensors or buckets would otherwise wait in a
  // bucket's construction that its peers never start.
  void agree_on_plan(std::vector<shape> const& shapes, std::string& failure) {
    std::uint64_t h = detail::hash_combine(plan_fingerprint(plan_, shapes, sizeof(Gradient)),
                                           detail::hash(options_.compressor.str(), detail::hash(options_.small.str())));
    std::size_t compressed = 0;
    for (auto const& b : plan_.buckets) compressed += b.compressed ? 1 : 0;
    for (auto const& c : options_.compressors) h = detail::hash(c.str(), h);
    if (failure.empty() && !options_.compressors.empty() && options_.compressors.size() != compressed)
      failure = "model_reducer: " + std::to_string(options_.compressors.size()) + " compressors given for " +
                std::to_string(compressed) + " compressed buckets";
    agreement const all = agree(shapes.size(), h, failure);
    expect_none_failed(all, failure, "model_reducer", "this model or these options");
    expect_same(all, "model_reducer", "the model", "tensors",
                "model differs from rank 0's (tensor shapes, gradient type, compressors or bucket rules)");
  }

  // The compressor of the k-th compressed bucket.
  compressor_spec const& compressor_of(std::size_t k) const {
    return options_.compressors.empty() ? options_.compressor : options_.compressors[k];
  }

  // One agreement over the world: flat, or over the node groups.
  agreement agree(std::uint64_t a, std::uint64_t b, std::string const& failure) {
    return groups_ ? agreement(groups_->local, groups_->cross, space_, a, b, failure)
                   : agreement(*collective_, space_, a, b, failure);
  }

  void check_parameter(std::size_t p) const {
    GRADCOMP_EXPECTS(p < plan_.params.size(),
                     "model_reducer: parameter " + std::to_string(p) + " of " + std::to_string(plan_.params.size()));
  }

  void reset_step() {
    std::fill(marked_.begin(), marked_.end(), char{0});
    for (std::size_t b = 0; b < waiting_.size(); ++b) waiting_[b] = plan_.buckets[b].params.size();
    std::lock_guard lock(mutex_);
    std::swap(last_timeline_, timeline_);  // (both keep their capacity)
    timeline_.clear();
    next_launch_ = 0;
    queued_ = taken_ = completed_ = 0;
    steps_started_ = 0;
  }

  double since_start() const { return std::chrono::duration<double>(clock::now() - step_start_).count(); }

  // Buckets launch in bucket order, once a step, so the queue is the
  // buckets in [taken_, queued_).
  void launch(std::size_t b) {
    launched_at_[b] = since_start();
    if (overlapping()) {
      {
        std::lock_guard lock(mutex_);
        queued_ = b + 1;
      }
      wake_.notify_all();
      return;
    }
#if GRADCOMP_HAS_CUDA
    if constexpr (on_device) GRADCOMP_CUDA_TRY(cudaStreamWaitEvent(space_.stream, ready_events_[b].get(), 0));
#endif
    run(b);
  }

  // Reduces bucket b; an error is kept for finish() (every rank meets the
  // same one, and every rank still reduces the later buckets).
  void run(std::size_t b) {
    double const started = since_start();
    try {
      auto const& bucket = plan_.buckets[b];
      (*reducers_[b])(storage_.view().subspan(bucket.offset, bucket.size));
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    timeline_.push_back({b, launched_at_[b], started, since_start()});
    ++completed_;
  }

  // The next queued bucket, marked running (under the lock): one reduction
  // at a time, so each rank's collectives stay in bucket order.
  std::size_t take() {
    running_ = true;
    return taken_++;
  }

  void progress() {
    for (;;) {
      std::size_t b = 0;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || (taken_ != queued_ && !running_); });
        if (taken_ == queued_) return;  // stopping, nothing left
        b = take();
      }
      run(b);
      std::lock_guard lock(mutex_);
      running_ = false;
    }
  }

  detail::checkpoint_identity identity() const {
    int const size = groups_ ? groups_->size() : collective_->size(),
              rank = groups_ ? groups_->rank() : collective_->rank();
    return {checkpoint_kind::reducer, fingerprint(), static_cast<std::uint32_t>(size),
            static_cast<std::uint32_t>(rank)};
  }

  Collective* collective_;  // the world, or (hierarchical) this rank's node
  node_groups<Collective>* groups_ = nullptr;
  model_reducer_options options_;
  Space compute_;
  Space space_;
  bucket_plan plan_;
  buffer<Gradient, Space> storage_;
  std::vector<std::unique_ptr<bucket_reducer>> reducers_;

  // This step.
  std::vector<char> marked_;
  std::vector<std::size_t> waiting_;
  std::vector<double> launched_at_;  // bucket b's launch, in seconds from the step's start
  std::size_t next_launch_ = 0;
  int steps_started_ = 0;
  clock::time_point step_start_ = clock::now();

  // Shared with the progress thread.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::size_t queued_ = 0, taken_ = 0, completed_ = 0;  // buckets launched, taken to run, run
  bool running_ = false;                                // a bucket is being reduced (by either thread)
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<bucket_event> timeline_, last_timeline_;
  std::thread worker_;

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

}  // namespace gradcomp
