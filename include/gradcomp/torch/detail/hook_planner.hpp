// How the DDP hook plans `auto`: each bucket's choice and the planner's table
// behind it (ddp_hook_state::report), kept with the shapes it was made for
// (a bucket DDP rebuilt with other parameters is planned again). Host
// buckets are planned just before their first compressed step, over the
// whole group with the hook's lanes drained (before_step); device buckets on
// their lane when it builds them.
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/compressors/choice.hpp>
#include <gradcomp/planning/planner.hpp>
#include <gradcomp/reducers/model/bucket_rules.hpp>

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Each planned bucket's choice and table, by index. Thread-safe: lanes plan
/// device buckets while the hook reads.
class hook_planner {
 public:
  using shapes = std::vector<std::vector<std::size_t>>;

  explicit hook_planner(compressor_choice const& choice) { options_.candidates = choice.candidates(); }

  /// The planner's options: the choice's candidates.
  planner_options const& options() const { return options_; }

  /// Plans bucket `index` of tensors of these `extents` over `world`, after
  /// `drain()` has emptied the lanes, unless it takes `small` (`rules`) or is
  /// planned for these shapes already (then it allocates nothing: it runs
  /// at every step). Every rank hands over the same buckets in the same
  /// order and waits here, so the network is measured with nothing else on
  /// it: measured on a lane, beside the other lane's traffic and the ranks'
  /// backward passes, it once priced bf16 at a tenth of the link's rate.
  /// Collective over `world` where it plans.
  template <class G, class World, class Drain>
  void before_step(World& world, std::size_t index, shapes const& extents, bucket_rules const& rules, Drain&& drain) {
    std::size_t elements = 0;
    for (auto const& e : extents) elements += std::accumulate(e.begin(), e.end(), std::size_t{1}, std::multiplies<>{});
    if (!takes_compressor(extents, elements, rules) || choice(index, extents)) return;
    bucket_layout layout;
    for (auto const& e : extents) layout.add(e);
    drain();
    keep(index, extents, plan_compression<G>(world, {layout}, host_space{}, options_));
  }

  /// Keeps `plan` (of the one bucket of tensors of these `extents`) as bucket `index`'s.
  void keep(std::size_t index, shapes const& extents, compression_plan const& plan) {
    std::lock_guard<std::mutex> const lock(mutex_);
    kept_.insert_or_assign(index, kept{extents, plan.chosen(0), plan.table(index)});
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
  };
  planner_options options_;
  mutable std::mutex mutex_;
  std::map<std::size_t, kept> kept_;
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
