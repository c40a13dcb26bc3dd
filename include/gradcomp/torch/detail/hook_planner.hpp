// How the DDP hook plans `auto`: each bucket's choice and the planner's table
// behind it (ddp_hook_state::report), kept with the shapes it was made for
// (a bucket DDP rebuilt with other parameters is planned again). Host
// buckets are planned just before their first compressed step, over the
// whole group with the hook's lanes drained (before_step); device buckets on
// their lane when it builds them. Each bucket is weighed with its share of
// the iteration the hook timed during warm-up (handed), so that compression
// is priced against the whole step, not the reduction alone.
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/planning/planner.hpp>
#include <gradcomp/reducers/model/bucket_rules.hpp>
#include <gradcomp/torch/ddp_hook_options.hpp>

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Each planned bucket's choice and table, by index. Thread-safe: lanes plan
/// device buckets while the hook reads.
class hook_planner {
 public:
  using shapes = std::vector<std::vector<std::size_t>>;

  using clock = std::chrono::steady_clock;

  /// Plans with `options` (options_of's); their compute_seconds is each
  /// bucket's share of the timed iteration.
  explicit hook_planner(planner_options options) : options_(std::move(options)) {}

  /// The planner's options of a hook's: its compressor's candidates, and its
  /// steps factors checked, each keyed by its spec's own spelling (as the
  /// planner's rows name them).
  static planner_options options_of(ddp_hook_options const& o) {
    planner_options out;
    out.candidates = o.compressor.candidates();
    GRADCOMP_EXPECTS(o.auto_unknown_steps_factor > 0,
                     "gradcomp DDP hook: auto_unknown_steps_factor must be positive, not " +
                         std::to_string(o.auto_unknown_steps_factor));
    out.unknown_steps_factor = o.auto_unknown_steps_factor;
    for (auto const& [text, factor] : o.auto_steps_factor) {
      GRADCOMP_EXPECTS(factor > 0, "gradcomp DDP hook: the auto_steps_factor of '" + text + "' must be positive, not " +
                                       std::to_string(factor));
      out.steps_factor.insert_or_assign(compressor_spec::parse(text).str(), factor);
    }
    return out;
  }

  /// Times the iterations: called with each bucket DDP hands over (of
  /// `elements`, `last` of its iteration) at `now`. An iteration runs from
  /// its first bucket to the next one's: forward, backward, optimizer, and
  /// what its reductions did not hide (the warm-up's fp32 ones, so the
  /// estimate of the step's other work errs towards bf16). Allocates nothing.
  void handed(std::size_t elements, bool last, clock::time_point now) {
    std::lock_guard<std::mutex> const lock(mutex_);
    if (at_first_) {
      if (started_) iteration_ = {std::chrono::duration<double>(now - start_).count(), counted_};
      start_ = now, started_ = true, counted_ = 0;
    }
    counted_ += elements;
    at_first_ = last;
  }

  /// The planner's options for a bucket of `elements`: its share (by
  /// elements) of the last timed iteration as compute_seconds (0 before one
  /// was timed: without warm-up, the reductions are weighed alone).
  planner_options options_for(std::size_t elements) const {
    std::lock_guard<std::mutex> const lock(mutex_);
    planner_options out = options_;
    if (iteration_.elements > 0)
      out.compute_seconds =
          iteration_.seconds * static_cast<double>(elements) / static_cast<double>(iteration_.elements);
    return out;
  }

  /// Plans bucket `index` of tensors of these `extents` over `world`, after
  /// `drain()` has emptied the lanes, unless it takes `small` (`rules`) or is
  /// planned for these shapes already (then it allocates nothing: it runs
  /// at every step). Every rank hands over the same buckets in the same
  /// order and waits here, so the network is measured with nothing else on
  /// it: measured on a lane, beside the other lane's traffic and the ranks'
  /// backward passes, it once priced bf16 at a tenth of the link's rate.
  /// Its links are measured once: later buckets' plans price them from the
  /// first's (planner_options::measured), so each adds its rehearsal only.
  /// Collective over `world` where it plans.
  template <class G, class World, class Drain>
  void before_step(World& world, std::size_t index, shapes const& extents, bucket_rules const& rules, Drain&& drain) {
    std::size_t elements = 0;
    for (auto const& e : extents) elements += std::accumulate(e.begin(), e.end(), std::size_t{1}, std::multiplies<>{});
    if (!takes_compressor(extents, elements, rules) || choice(index, extents)) return;
    bucket_layout layout;
    for (auto const& e : extents) layout.add(e);
    drain();
    planner_options options = options_for(elements);
    {
      std::lock_guard<std::mutex> const lock(mutex_);
      options.measured = host_network_;
    }
    compression_plan const plan = plan_compression<G>(world, {layout}, host_space{}, options);
    keep(index, extents, plan);
    std::lock_guard<std::mutex> const lock(mutex_);
    host_network_ = plan.network;
  }

  /// The extents of the tensors of a bucket laid out as `layout`.
  static shapes extents_of(bucket_layout const& layout) {
    shapes out;
    for (auto const& t : layout.tensors()) out.push_back(t.shape);
    return out;
  }

  /// Keeps `plan` (of the one bucket of tensors of these `extents`) as bucket `index`'s.
  void keep(std::size_t index, shapes const& extents, compression_plan const& plan) {
    std::lock_guard<std::mutex> const lock(mutex_);
    kept_.insert_or_assign(index, kept{extents, plan.chosen(0), plan.table(index), plan.network});
  }
  /// The network measured for bucket `index`'s plan, where it was planned.
  std::optional<network_model> network(std::size_t index) const {
    std::lock_guard<std::mutex> const lock(mutex_);
    auto const found = kept_.find(index);
    if (found == kept_.end()) return std::nullopt;
    return found->second.network;
  }
  /// The choice kept for bucket `index`, where it was made for these `extents`.
  std::optional<compressor_spec> choice(std::size_t index, shapes const& extents) const {
    std::lock_guard<std::mutex> const lock(mutex_);
    auto const found = kept_.find(index);
    if (found == kept_.end() || found->second.extents != extents) return std::nullopt;
    return found->second.spec;
  }
  /// Every kept table, in index order.
  std::string report() const {
    std::lock_guard<std::mutex> const lock(mutex_);
    std::string out;
    for (auto const& [index, k] : kept_) out += k.table;
    return out;
  }

 private:
  struct kept {
    shapes extents;
    compressor_spec spec;
    std::string table;
    network_model network;
  };
  struct timed {
    double seconds = 0;
    std::size_t elements = 0;  // the model's: every bucket of the iteration
  };
  planner_options options_;
  mutable std::mutex mutex_;
  std::map<std::size_t, kept> kept_;
  network_model host_network_{.ranks = 0, .links = {}};  // every link the host buckets' plans measured
  timed iteration_;                                      // the last one timed
  clock::time_point start_;                              // of the iteration under way
  std::size_t counted_ = 0;                              // its elements so far
  bool started_ = false, at_first_ = true;
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
