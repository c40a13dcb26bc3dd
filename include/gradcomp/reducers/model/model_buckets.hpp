// The model-level core: a model's buckets, each reduced by a reducer of its
// own, in the order they are submitted, on lanes, with one checkpoint for
// them all. model_reducer, model_reduce_scatterer and the DDP hook are thin
// adapters over it: they differ in where the buckets come from (a plan, or
// handed over from outside) and where the gradients live, not in how a
// bucket is reduced.
#pragma once

#include <gradcomp/reducers/model/bucket_rules.hpp>
#include <gradcomp/reducers/model/delivery.hpp>
#include <gradcomp/reducers/model/detail/envelope.hpp>
#include <gradcomp/reducers/model/options.hpp>
#include <gradcomp/reducers/model/scheduler.hpp>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A model's buckets over `World` (a collective, or node_groups of one),
/// each reduced through `Delivery` (all_reduce_delivery or
/// reduce_scatter_delivery) by the reducer its compressor_spec names, in
/// `Space`, gradients stored as `Gradient`.
///
/// Buckets come from a plan (build(), at construction of the adapter: every
/// rank builds the same buckets in the same order), or are handed over from
/// outside by index with their parameters (submit_handed(), DDP's buckets):
/// a bucket is then built at its first step, on its lane, and built again
/// when its parameters change (DDP rebuilds its buckets after the first
/// iteration). During the warm-up (options.reduce.warmup_steps) a
/// handed-over bucket is reduced by the warm-up's own step, the fp32 mean,
/// and its compressor is chosen and built at its first step after it (so on
/// DDP's final buckets where the warm-up is 2 or more); a compressor built
/// after the model's first steps starts where the model is (warm-up steps
/// keep no state).
///
/// Bucket b is reduced on lane b mod options.lanes, over that lane's split of
/// the world, so every rank's lane sees the same reductions in the same
/// order, and the results are the same for any number of lanes.
template <class Delivery, class World, class Space, gradient_element Gradient>
class model_buckets {
 public:
  using collective_type = typename world_traits<World>::collective;
  using reducer = typename Delivery::template reducer<collective_type, Space, Gradient>;
  using memory = typename Space::memory;
  using gradient_span = span<Gradient, memory>;
  /// How gradients are stored.
  static constexpr dtype gradient_dtype = dtype_of_v<Gradient>;
  using maker = bucket_maker<reducer, World, Space>;
  using shape = std::vector<std::size_t>;
  /// The compressor of a bucket being built, by its index and layout, over
  /// its lane's world (collective there; the planner's choice). Unset: the
  /// options' compressor where takes_compressor, else `small`.
  using chooser = std::function<compressor_spec(std::size_t index, bucket_layout const&, World& lane)>;
  /// Told when a reduction submitted with a tag has run: the tag, and what
  /// it threw (null where it did not). Called on the thread that ran it.
  using completion = std::function<void(void* tag, std::exception_ptr error)>;

  /// Buckets over `world` (lane 0; the others split from it: collective),
  /// their reducers made by `make` in `space`; `who` names the adapter in
  /// errors ("model_reducer", "gradcomp DDP hook").
  model_buckets(char const* who, World& world, model_reducer_options options, Space space, maker make,
                chooser choose = {}, completion done = {})
      : who_(who),
        world_(&world),
        options_(std::move(options)),
        space_(space),
        make_(make),
        choose_(std::move(choose)),
        done_(std::move(done)),
        scheduler_(lane_count(), on_host && options_.overlap, [this](job& j, int lane) { run(j, lane); }) {
    if constexpr (detail::model::splits<World>)
      for (int k = 1; k < scheduler_.lanes(); ++k)
        lanes_.push_back(std::make_unique<World>(detail::model::split_lane(world)));
    else
      GRADCOMP_EXPECTS(scheduler_.lanes() == 1, std::string(who_) + ": " + std::to_string(scheduler_.lanes()) +
                                                    " lanes need a collective that can split (split(color, key))");
  }
  model_buckets(model_buckets const&) = delete;
  model_buckets& operator=(model_buckets const&) = delete;

  /// @name Buckets from a plan
  /// @{

  /// Builds bucket `index` (the next one) for `layout` with `spec`, now, over
  /// its lane's world: collective there.
  void build(std::size_t index, bucket_layout const& layout, compressor_spec const& spec) {
    entry& e = slot(index);
    e.layout = layout;
    e.spec = spec;
    e.planned = true;
    make(e, index, lane_of(index), 0);
  }

  /// Reduces built bucket `index` (a reduce-scatter: into `shard`, this
  /// rank's shard of it), on its lane: queued where the lanes have threads,
  /// else now. finish() waits for it and rethrows what it threw.
  void submit(std::size_t index, gradient_span gradient, gradient_span shard = {}) {
    GRADCOMP_EXPECTS(index < buckets_.size() && buckets_[index],
                     std::string(who_) + ": no bucket " + std::to_string(index));
    enqueue(index, gradient, shard, nullptr);
  }
  /// @}

  /// @name Buckets handed over from outside
  /// @{

  /// Reduces bucket `index` as it is handed over (DDP's): `gradient` holds the
  /// values of the model's parameters `positions` (empty where unknown: the
  /// bucket is then known by its index and shapes), of `shapes`, in that
  /// order.
  /// Built at its first step on its lane (and again where its parameters
  /// changed). Where they are exactly those of several loaded buckets (a
  /// loaded state in a fresh DDP, whose first buckets are not the saved
  /// ones), each of those is reduced over its own parameters, gathered in its
  /// own order, so a resumed run reduces as the saved one did. `tag` is
  /// handed to the completion when it has run.
  void submit_handed(std::size_t index, gradient_span gradient, std::vector<std::size_t> const& positions,
                     std::vector<shape> const& shapes, void* tag) {
    GRADCOMP_EXPECTS(positions.empty() || positions.size() == shapes.size(),
                     std::string(who_) + ": " + std::to_string(positions.size()) + " positions for " +
                         std::to_string(shapes.size()) + " shapes");
    if (auto const pieces = loaded_pieces(index, positions); !pieces.empty())
      return reduce_pieces(pieces, gradient, positions, shapes, tag);
    index = holder_of(index, positions);
    entry& e = slot(index);
    bool const laid_out = !e.layout.tensors().empty();  // (a loaded bucket is not, until it comes)
    if (e.positions != positions || (laid_out && !same_shapes(e.layout, shapes))) {
      e.positions = positions;
      e.layout = {};
      e.reduce.reset();
      e.loaded = {};
      e.spec = {};
    }
    if (e.layout.tensors().empty())
      for (auto const& s : shapes) e.layout.add(s);
    GRADCOMP_EXPECTS(e.layout.size() == gradient.size(), std::string(who_) + ": bucket " + std::to_string(index) +
                                                             " holds " + std::to_string(gradient.size()) +
                                                             " values but its parameters " +
                                                             std::to_string(e.layout.size()));
    enqueue(index, gradient, {}, tag);
  }
  /// @}

  /// Waits for every reduction submitted so far.
  void drain() { scheduler_.drain(); }

  /// Ends a step: waits for its reductions, counts it, and rethrows the first
  /// error one raised (every rank raises the same).
  void finish() {
    drain();
    end_step();
    std::exception_ptr error;
    {
      std::lock_guard lock(mutex_);
      error = std::exchange(error_, nullptr);
    }
    if (error) std::rethrow_exception(error);
  }

  /// Counts a step whose reductions may still run (DDP's last bucket is submitted).
  void end_step() {
    ++steps_;
    started_ = false;
  }

  /// Steps (iterations) counted.
  std::uint64_t steps() const { return steps_; }
  /// Where the model is, where the adapter counts its steps (DDP's
  /// iterations, over several cores): the steps a bucket built from now on
  /// has been warming up for, and what save() records.
  void set_steps(std::uint64_t steps) {
    steps_ = steps;
    started_ = false;
  }
  /// The options.
  model_reducer_options const& options() const { return options_; }
  /// The world (lane 0's).
  World& world() { return *world_; }
  /// The adapter's name, as errors give it.
  char const* who() const { return who_; }
  /// The execution space.
  Space const& space() const { return space_; }
  /// The number of lanes.
  int lanes() const { return scheduler_.lanes(); }
  /// One more than the largest bucket index seen.
  std::size_t size() const { return buckets_.size(); }
  /// Bucket `index`'s reducer, or null where it is not built (yet).
  reducer const* bucket(std::size_t index) const {
    return index < buckets_.size() && buckets_[index] ? buckets_[index]->reduce.get() : nullptr;
  }
  /// The compressor bucket `index` was built with, where its compressor is
  /// built (not while a handed-over bucket warms up).
  compressor_spec const* spec_of(std::size_t index) const {
    return bucket(index) && !buckets_[index]->warming ? &buckets_[index]->spec : nullptr;
  }
  /// Bytes the last step of every built bucket put on the wire.
  std::size_t wire_bytes() const {
    std::size_t total = 0;
    for (auto const& e : buckets_)
      if (e && e->reduce) total += e->reduce->wire_bytes();
    return total;
  }
  /// The last reduction of every bucket, in the order they started.
  std::vector<bucket_event> timeline() const {
    std::vector<bucket_event> out;
    std::lock_guard lock(mutex_);
    for (auto const& e : buckets_)
      if (e && e->ran) out.push_back(e->event);
    std::sort(out.begin(), out.end(), [](auto const& a, auto const& b) { return a.started < b.started; });
    return out;
  }

  /// @name Checkpoints: every bucket's state in one envelope
  /// @{

  /// This rank's state: the steps counted, and every bucket's checkpoint
  /// with its index, compressor and parameters (a loaded one not yet applied
  /// as it was loaded). @note Waits for the reductions.
  std::vector<std::byte> save();

  /// Restores what save() wrote into the buckets built from a plan, on every
  /// rank together: if any rank's envelope or any bucket in it is unusable,
  /// or the ranks' steps differ, every rank throws checkpoint_error and no
  /// bucket changes. `failure`: why this rank cannot restore where the
  /// adapter found it (in a part of its state of its own), agreed as the
  /// rest. @note Collective; waits for the space.
  void restore(span<std::byte const> bytes, std::string failure = {});

  /// Loads what save() wrote in place of the buckets handed over so far, on
  /// every rank together (an unusable envelope, or ranks of different steps,
  /// fail every rank with checkpoint_error, changing nothing): each bucket
  /// restores its checkpoint when it is built, one of another configuration
  /// failing every rank with gradcomp's message then. @note Collective.
  void load(span<std::byte const> bytes);

  /// The hash of what every rank's checkpoint must agree on: the
  /// compressors, the bucket rules and the reducers' options (not the lanes).
  std::uint64_t fingerprint() const { return detail::model::fingerprint_of(options_); }
  /// @}

 private:
  static constexpr bool on_host = std::is_same_v<memory, host_memory>;
  using clock = std::chrono::steady_clock;

  struct entry {
    std::vector<std::size_t> positions;  // handed over: the model's parameters it holds, in its order
    bucket_layout layout;
    compressor_spec spec;
    std::unique_ptr<reducer> reduce;
    detail::model::saved_bucket loaded;  // a loaded checkpoint, applied when the bucket is built
    bucket_event event{};                // its last reduction
    bool ran = false;
    bool planned = false;  // built from a plan, with the spec it was given
    bool warming = false;  // handed over, reduced by the warm-up's fp32 step until its compressor is built
  };
  struct job {
    entry* bucket = nullptr;
    std::size_t index = 0;
    gradient_span gradient{}, shard{};
    std::uint64_t step = 0;  // the model's step it belongs to
    double launched = 0;
    void* tag = nullptr;
  };

  int lane_count() const {
    GRADCOMP_EXPECTS(options_.lanes >= 1,
                     std::string(who_) + ": lanes must be 1 or more, not " + std::to_string(options_.lanes));
    return on_host ? options_.lanes : 1;
  }
  int lane_of(std::size_t index) const { return static_cast<int>(index % static_cast<std::size_t>(lanes())); }
  World& world_of(int lane) { return lane == 0 ? *world_ : *lanes_[static_cast<std::size_t>(lane - 1)]; }

  entry& slot(std::size_t index) {
    if (index >= buckets_.size()) buckets_.resize(index + 1);
    if (!buckets_[index]) buckets_[index] = std::make_unique<entry>();
    return *buckets_[index];
  }

  static bool same_shapes(bucket_layout const& layout, std::vector<shape> const& shapes) {
    if (layout.tensors().size() != shapes.size()) return false;
    for (std::size_t t = 0; t < shapes.size(); ++t)
      if (layout.tensors()[t].shape != shapes[t]) return false;
    return true;
  }

  double since_start() const { return std::chrono::duration<double>(clock::now() - step_start_).count(); }

  void enqueue(std::size_t index, gradient_span gradient, gradient_span shard, void* tag) {
    if (!started_) step_start_ = clock::now(), started_ = true;
    job j{buckets_[index].get(), index, gradient, shard, steps_, since_start(), tag};
    scheduler_.submit(lane_of(index), j);
  }

  // Builds e (bucket `index`) over lane `lane`'s world, at the model's step
  // `step`: collective there. A loaded checkpoint is restored into it; a
  // bucket built during the warm-up starts where the model is in it.
  void make(entry& e, std::size_t index, int lane, std::uint64_t step) {
    World& world = world_of(lane);
    bool const loaded = !e.loaded.bytes.empty();
    allreducer_options o = options_.reduce;
    o.bucket = index;
    // A handed-over bucket's layout is final only after the framework's first
    // steps (DDP rebuilds its buckets): during the warm-up it is reduced by
    // the warm-up's own step, the fp32 mean, and its compressor is chosen and
    // built at its first step after it.
    e.warming = !e.planned && !loaded && step < o.warmup_steps;
    if (e.warming) {
      e.spec = compressor_spec::parse("fp32:ef=off");
      o.warmup_steps = 0;
    } else if (e.planned) {
      // the spec it was given
    } else if (loaded && !e.loaded.spec.empty()) {
      e.spec = compressor_spec::parse(e.loaded.spec);  // the saved choice, not made again
    } else if (choose_) {
      e.spec = choose_(index, e.layout, world);
    } else {
      e.spec = takes_compressor(e.layout, options_) ? options_.compressor.spec() : options_.small;
    }
    e.reduce = make_(e.spec, world, e.layout, space_, o, options_.bf16_within_node);
    if (loaded) {
      auto const saved = std::exchange(e.loaded, {});
      e.reduce->restore(span<std::byte const>(saved.bytes.data(), saved.bytes.size()));
    } else if (step > 0 && !e.warming) {
      e.reduce->begin_at(std::min(step, o.warmup_steps));
    }
  }

  // Runs a job on its lane: builds its bucket first where it is not built.
  void run(job& j, int lane) {
    double const started = since_start();
    std::exception_ptr error;
    try {
      entry& e = *j.bucket;
      if (!e.reduce || (e.warming && j.step >= options_.reduce.warmup_steps)) make(e, j.index, lane, j.step);
      if constexpr (Delivery::scatters)
        (*e.reduce)(j.gradient, j.shard);
      else
        (*e.reduce)(j.gradient);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      j.bucket->event = {j.index, j.launched, started, since_start()};
      j.bucket->ran = true;
      if (error && !j.tag && !error_) error_ = error;
    }
    if (j.tag && done_) done_(j.tag, error);
  }

  // Handed-over buckets' routing (detail/handed.hpp): the bucket that holds
  // exactly these parameters; the loaded buckets that together are them;
  // those reduced one by one, each gathered in its own order.
  std::size_t holder_of(std::size_t index, std::vector<std::size_t> const& positions) const;
  std::vector<std::size_t> loaded_pieces(std::size_t index, std::vector<std::size_t> const& positions) const;
  void reduce_pieces(std::vector<std::size_t> const& pieces, gradient_span gradient,
                     std::vector<std::size_t> const& positions, std::vector<shape> const& shapes, void* tag);

  void agree_restorable(std::uint64_t steps, std::string const& failure) {
    expect_restorable(detail::model::agree_over(*world_, space_, steps, 0, failure), failure);
  }

  detail::checkpoint_identity identity() const {
    return {checkpoint_kind::reducer, fingerprint(), static_cast<std::uint32_t>(detail::model::world_size(*world_)),
            static_cast<std::uint32_t>(detail::model::world_rank(*world_))};
  }

  char const* who_;
  World* world_;
  std::vector<std::unique_ptr<World>> lanes_;  // lanes 1, 2, ...: splits of the world
  model_reducer_options options_;
  Space space_;
  maker make_;
  chooser choose_;
  completion done_;
  std::vector<std::unique_ptr<entry>> buckets_;  // by index (entries stay where they are: jobs point at them)
  std::uint64_t steps_ = 0;
  bool started_ = false;
  clock::time_point step_start_ = clock::now();
  mutable std::mutex mutex_;  // the events and the first error, written on the lanes
  std::exception_ptr error_;
  model_scheduler<job> scheduler_;  // last: its threads stop before the rest goes
};

}  // namespace gradcomp

#include <gradcomp/reducers/model/detail/checkpoint.hpp>  // save(), restore(), load()
#include <gradcomp/reducers/model/detail/handed.hpp>      // the handed-over buckets' routing
