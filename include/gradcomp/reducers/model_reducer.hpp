// A model's gradients, packed into buckets and reduced while the backward
// pass goes on: PyTorch DDP's bucketing and overlap, with a compressor per
// bucket.
#pragma once

#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// How a model_reducer packs and reduces a model's gradients.
struct model_reducer_options {
  /// The compressor of large buckets of matrices.
  compressor_spec compressor{};
  /// The compressor of small buckets and of 1-D tensors (bf16, no error
  /// feedback: PyTorch's min_compression_rate, CGX's layer_min_size).
  compressor_spec small{};
  /// Buckets of fewer elements take `small`.
  std::size_t min_compression_elements = std::size_t{1} << 16;
  /// 1-D tensors (biases, norms) go in buckets of their own, which take `small`.
  bool vectors_uncompressed = true;
  /// A bucket closes once it holds this many bytes of gradients, as stored
  /// (DDP's bucket_cap_mb: 25 MiB) ...
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// ... and the first bucket of each kind at this many (1 MiB), so the first
  /// reduction starts early in the backward pass.
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
  /// Non-finite policy, seed and warm-up of every bucket (each bucket's
  /// position is its `bucket`).
  allreducer_options reduce{};
  /// Host collectives: reduce on a progress thread while the caller goes on
  /// (the collective must then allow calls from another thread than the
  /// caller's: MPI_THREAD_SERIALIZED; local_group does). False: each bucket is
  /// reduced inside the mark_ready call that completes it. (On CUDA the
  /// reductions are enqueued on the collective's stream either way.)
  bool overlap = true;
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
/// reads the gradients. Construction is collective.
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
    return storage_.view().subspan(params_[p].offset, params_[p].size);
  }

  /// Parameter p's gradient is written: once every gradient of its bucket
  /// is, the bucket is reduced (and then every later bucket already whole).
  void mark_ready(std::size_t p) {
    check_parameter(p);
    GRADCOMP_EXPECTS(!marked_[p], "model_reducer: parameter " + std::to_string(p) + " was marked ready twice in one step");
    if (steps_started_ == 0) step_start_ = clock::now();
    steps_started_ = 1;
    marked_[p] = 1;
    std::size_t const b = params_[p].bucket;
    if (--waiting_[b] != 0) return;
#if GRADCOMP_HAS_CUDA
    if constexpr (on_device) GRADCOMP_CUDA_TRY(cudaEventRecord(ready_events_[b].get(), compute_.stream));
#endif
    while (next_launch_ < buckets_.size() && waiting_[next_launch_] == 0) launch(next_launch_++);
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
        if (!running_ && !queue_.empty()) {
          auto const job = take();
          lock.unlock();
          run(job.first, job.second);
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
    for (std::size_t p = 0; p < params_.size(); ++p)
      if (!marked_[p]) missing += (missing.empty() ? "" : ", ") + std::to_string(p);
    reset_step();
    if (error) std::rethrow_exception(error);
    GRADCOMP_EXPECTS(missing.empty(), "model_reducer: finish() before parameters " + missing +
                                          " were marked ready (their buckets were not reduced)");
  }

  /// Buckets, in the order they are reduced.
  std::size_t buckets() const { return buckets_.size(); }
  /// Bucket b's reduction (its compressor, layout, steps, wire bytes).
  any_allreducer<Collective, Space, Gradient> const& bucket(std::size_t b) const { return *reducers_[b]; }
  /// The parameters bucket b holds, in its layout's order.
  std::vector<std::size_t> const& parameters_of(std::size_t b) const { return buckets_[b].params; }
  /// The last step's reductions, bucket by bucket.
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
  std::vector<std::byte> save() {
    detail::checkpoint_writer w(identity());
    w.word(reducers_.size());
    for (auto& r : reducers_) {
      auto const blob = r->save();
      w.word(blob.size());
      w.raw(blob.data(), blob.size());
    }
    return std::move(w).finish();
  }

  /// Restores what save() wrote, on every rank together: if any rank's
  /// checkpoint or any bucket in it is unusable, or the ranks' steps differ,
  /// every rank throws checkpoint_error and no bucket changes.
  /// @note Collective; waits for the space.
  void restore(span<std::byte const> bytes) {
    std::vector<bucket_checkpoint> parsed;
    std::string failure;
    std::uint64_t steps = 0;
    try {
      detail::checkpoint_reader r(detail::open(bytes, identity()));
      std::uint64_t const count = r.word("the bucket count");
      if (count != reducers_.size())
        throw checkpoint_error("checkpoint: " + std::to_string(count) + " buckets where this model has " +
                               std::to_string(reducers_.size()));
      for (auto const& reducer : reducers_) {
        auto const blob = r.block("a bucket");
        parsed.push_back(reducer->parse_checkpoint(blob));
      }
      r.finish();
      steps = parsed.empty() ? 0 : parsed.front().steps;
    } catch (checkpoint_error const& e) {
      failure = e.what();
    }
    // One agreement for every bucket, over the world.
    expect_restorable(groups_ ? agreement(groups_->local, groups_->cross, space_, steps, 0, failure)
                              : agreement(*collective_, space_, steps, 0, failure),
                      failure);
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

  struct parameter {
    std::size_t bucket, offset, size;
  };
  struct bucket_plan {
    std::vector<std::size_t> params;
    std::size_t offset = 0, size = 0, last = 0;
    bool compressed = false;
  };

  using bucket_reducer = any_allreducer<Collective, Space, Gradient>;

  bool overlapping() const { return !on_device && options_.overlap; }

  template <class Make>
  void build(std::vector<shape> const& shapes, Make make) {
    plan(shapes);
    storage_ = buffer<Gradient, Space>(total_, space_);
    space_.fill_zero(storage_.data(), total_ * sizeof(Gradient));
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      bucket_layout layout;
      for (std::size_t p : buckets_[b].params) layout.add(shapes[p]);
      allreducer_options o = options_.reduce;
      o.bucket = b;
      reducers_.push_back(make(buckets_[b].compressed ? options_.compressor : options_.small, std::move(layout), o));
    }
    ready_events_.resize(buckets_.size());
    reset_step();
    if (overlapping()) worker_ = std::thread([this] { progress(); });
  }

  int world_size() const { return groups_ ? groups_->nodes() * groups_->ranks_per_node() : collective_->size(); }
  int world_rank() const {
    return groups_ ? groups_->cross.rank() * groups_->ranks_per_node() + groups_->local.rank() : collective_->rank();
  }

  void check_parameter(std::size_t p) const {
    GRADCOMP_EXPECTS(p < params_.size(), "model_reducer: parameter " + std::to_string(p) + " of " +
                                             std::to_string(params_.size()));
  }

  // Buckets in backward order by byte cap, 1-D tensors apart; then ordered by
  // when their last gradient is ready, and laid out in that order.
  void plan(std::vector<shape> const& shapes) {
    params_.resize(shapes.size());
    std::vector<bucket_plan> open(2), closed;
    std::size_t made[2] = {0, 0};
    auto close = [&](int kind) {
      if (open[kind].params.empty()) return;
      closed.push_back(std::move(open[kind]));
      open[kind] = {};
      ++made[kind];
    };
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      std::size_t n = 1;
      for (std::size_t extent : shapes[p]) n = detail::checked_mul(n, extent, "model_reducer: a tensor's size");
      int const kind = options_.vectors_uncompressed && shapes[p].size() <= 1 ? 1 : 0;
      open[kind].params.push_back(p);
      open[kind].size = detail::checked_add(open[kind].size, n, "model_reducer: a bucket's size");
      open[kind].last = p;
      params_[p].size = n;
      std::size_t const cap = made[kind] == 0 ? options_.first_bucket_cap_bytes : options_.bucket_cap_bytes;
      if (open[kind].size * sizeof(Gradient) >= cap) close(kind);
    }
    close(0);
    close(1);
    std::stable_sort(closed.begin(), closed.end(), [](auto const& a, auto const& b) { return a.last < b.last; });
    total_ = 0;
    for (std::size_t b = 0; b < closed.size(); ++b) {
      auto& bucket = closed[b];
      bucket.offset = total_;
      bool const vectors = options_.vectors_uncompressed && shapes[bucket.params.front()].size() <= 1;
      bucket.compressed = !vectors && bucket.size >= options_.min_compression_elements;
      std::size_t offset = total_;
      for (std::size_t p : bucket.params) {
        params_[p].bucket = b;
        params_[p].offset = offset;
        offset += params_[p].size;
      }
      total_ = detail::checked_add(total_, bucket.size, "model_reducer: the model's size");
    }
    buckets_ = std::move(closed);
  }

  void reset_step() {
    marked_.assign(params_.size(), 0);
    waiting_.resize(buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) waiting_[b] = buckets_[b].params.size();
    std::lock_guard lock(mutex_);
    last_timeline_ = std::move(timeline_);
    timeline_.clear();
    next_launch_ = 0;
    completed_ = 0;
    steps_started_ = 0;
  }

  double since_start() const { return std::chrono::duration<double>(clock::now() - step_start_).count(); }

  void launch(std::size_t b) {
    double const launched = since_start();
    if (overlapping()) {
      {
        std::lock_guard lock(mutex_);
        queue_.push_back({b, launched});
      }
      wake_.notify_all();
      return;
    }
#if GRADCOMP_HAS_CUDA
    if constexpr (on_device) GRADCOMP_CUDA_TRY(cudaStreamWaitEvent(space_.stream, ready_events_[b].get(), 0));
#endif
    run(b, launched);
  }

  // Reduces bucket b; an error is kept for finish() (every rank meets the
  // same one, and every rank still reduces the later buckets).
  void run(std::size_t b, double launched) {
    double const started = since_start();
    try {
      auto const& bucket = buckets_[b];
      (*reducers_[b])(storage_.view().subspan(bucket.offset, bucket.size));
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    std::lock_guard lock(mutex_);
    timeline_.push_back({b, launched, started, since_start()});
    ++completed_;
  }

  // The next queued bucket, marked running (under the lock): one reduction
  // at a time, so each rank's collectives stay in bucket order.
  std::pair<std::size_t, double> take() {
    auto const job = queue_.front();
    queue_.pop_front();
    running_ = true;
    return job;
  }

  void progress() {
    for (;;) {
      std::pair<std::size_t, double> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || (!queue_.empty() && !running_); });
        if (queue_.empty()) return;  // stopping, nothing left
        job = take();
      }
      run(job.first, job.second);
      std::lock_guard lock(mutex_);
      running_ = false;
    }
  }

  detail::checkpoint_identity identity() const {
    return {checkpoint_kind::reducer, fingerprint(), static_cast<std::uint32_t>(world_size()),
            static_cast<std::uint32_t>(world_rank())};
  }

  Collective* collective_;  // the world, or (hierarchical) this rank's node
  node_groups<Collective>* groups_ = nullptr;
  model_reducer_options options_;
  Space compute_;
  Space space_;
  std::vector<parameter> params_;
  std::vector<bucket_plan> buckets_;
  std::size_t total_ = 0;
  buffer<Gradient, Space> storage_;
  std::vector<std::unique_ptr<bucket_reducer>> reducers_;

  // This step.
  std::vector<char> marked_;
  std::vector<std::size_t> waiting_;
  std::size_t next_launch_ = 0;
  int steps_started_ = 0;
  clock::time_point step_start_ = clock::now();

  // Shared with the progress thread.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::pair<std::size_t, double>> queue_;
  std::size_t completed_ = 0;
  bool running_ = false;  // a bucket is being reduced (by either thread)
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
