// The planner: does compression pay on this network, and with which
// compressor, bucket by bucket? It predicts the time of one step of each
// candidate on each of the user's buckets, before training:
//
//   predicted = local work + the step's collective calls on the network
//
// - local work: the candidate's own step (any_allreducer) run on scratch
//   copies of the real bucket layouts, in the same space, over a dry_run
//   collective of the real group's size (every call keeps this rank's data:
//   the step runs whole, nothing waits for a peer), warm, the median of a
//   few timed steps, the slowest rank's;
// - the calls: those the dry run recorded (so the agreement's 8 bytes, THC's
//   norms, PowerSGD's two messages, classic TopK's all-gather that grows with
//   n are all there), each priced by the line measure_network fit through
//   the backend's own calls of that operation and type.
//
// It predicts step time, not convergence: a compressor that needs more steps
// to reach a target is only ranked by time to target when given its steps
// factor (planner_options::steps_factor, e.g. from the time-to-accuracy
// harness, or unknown_steps_factor for every candidate without one). Local
// work and communication are added, not overlapped: a bucket's step runs
// its passes and its collectives one after the other.
// plan_sharded_compression plans buckets that are reduce-scattered instead
// (any_reduce_scatterer: a sharded optimizer's step); the weights'
// all-gather after it is the same for every candidate and is not priced.
// Over node_groups, both plan the two-level reducers: the dry run has two
// levels, and each level's calls are priced on that level's network.
//
// plan.hpp holds what a plan is, detail/report.hpp its text,
// detail/rehearsal.hpp the rehearsal, detail/world.hpp the ranks' agreement;
// this header the algorithm and its entry points.
#pragma once

#include <gradcomp/compressors/choice.hpp>
#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/planning/detail/rehearsal.hpp>
#include <gradcomp/planning/detail/world.hpp>
#include <gradcomp/planning/network.hpp>
#include <gradcomp/planning/plan.hpp>
#include <gradcomp/reducers/model/bucket_rules.hpp>
#include <gradcomp/reducers/model/delivery.hpp>
#include <gradcomp/reducers/model/options.hpp>
#include <gradcomp/reducers/node_groups.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

namespace detail {
/// plan_compression, or plan_sharded_compression where `Sharded`, over a
/// flat `world` or one in two levels (node_groups).
template <bool Sharded, class Gradient, class World, class Space>
compression_plan plan(World& world, std::vector<bucket_layout> const& layouts, Space const& space,
                      planner_options const& options) {
  GRADCOMP_EXPECTS(!options.candidates.empty() && options.timed_steps >= 1,
                   "plan_compression: no candidates, or no timed steps");
  GRADCOMP_EXPECTS(options.min_gain >= 0 && options.min_gain < 1,
                   "plan_compression: min_gain " + std::to_string(options.min_gain) + " is not in [0, 1)");
  GRADCOMP_EXPECTS(options.compute_seconds >= 0, "plan_compression: negative compute_seconds");
  for (auto const& [spec, factor] : options.steps_factor)
    GRADCOMP_EXPECTS(factor > 0, "plan_compression: the steps factor of '" + spec + "' is not positive");
  GRADCOMP_EXPECTS(
      options.unknown_steps_factor > 0,
      "plan_compression: unknown_steps_factor " + std::to_string(options.unknown_steps_factor) + " is not positive");
  std::vector<compressor_spec> specs = options.candidates;
  auto const baseline_spec = compressor_spec::parse("bf16");
  auto const is_baseline = [&](compressor_spec const& s) { return s.str() == baseline_spec.str(); };
  bool const bf16_allowed = std::any_of(specs.begin(), specs.end(), is_baseline);
  if (!bf16_allowed) specs.push_back(baseline_spec);
  compression_plan result;
  result.sharded = Sharded;
  seen_links seen, node_seen;
  auto dry = dry_world(world, space);
  for (auto const& layout : layouts) {
    bucket_choice c;
    c.elements = layout.size();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      plan_row row = rehearse<Space, Gradient, Sharded>(specs[i], layout, dry, space, options.timed_steps,
                                                        options.bf16_within_node);
      row.allowed = i < options.candidates.size();
      auto const factor = options.steps_factor.find(row.spec);
      row.factor = factor != options.steps_factor.end() ? factor->second
                   : is_baseline(specs[i])              ? 1.0
                                                        : options.unknown_steps_factor;
      for (auto const& call : row.calls) seen.insert({call.op, call.type});
      for (auto const& call : row.node_calls) node_seen.insert({call.op, call.type});
      if (is_baseline(specs[i])) c.baseline = c.rows.size();
      c.rows.push_back(std::move(row));
    }
    result.buckets.push_back(std::move(c));
  }
  // A rank's calls follow its shard of the bucket (two levels, sharded), so
  // ranks may see different links, price different calls, even fail alone:
  // every rank measures what any rank saw (measure_world), and each row
  // counts its slowest rank's local work and calls, and any rank's refusal.
  measure_world(result, world, space, seen, node_seen, options);
  std::vector<double> priced;  // each row's local work, communication, wire bytes and refusal
  for (auto& c : result.buckets)
    for (auto& row : c.rows) {
      double seconds = 0;
      if (row.refused.empty()) {
        for (auto const& call : row.calls) seconds += result.network.seconds(call);
        for (auto const& call : row.node_calls) seconds += result.node_network.seconds(call);
      }
      priced.insert(priced.end(), {row.refused.empty() ? row.local : 0.0, seconds, static_cast<double>(row.wire_bytes),
                                   row.refused.empty() ? 0.0 : 1.0});
    }
  priced.push_back(options.compute_seconds);  // each rank's own (a step it timed): the largest counts
  agree_max(world, space, priced);
  double const compute_seconds = priced.back();
  double elements = 0;
  for (auto const& c : result.buckets) elements += static_cast<double>(c.elements);
  std::size_t k = 0;
  for (auto& c : result.buckets) {
    c.compute = elements > 0 ? compute_seconds * static_cast<double>(c.elements) / elements : 0.0;
    for (auto& row : c.rows) {
      double const* const agreed = &priced[4 * k++];
      row.local = agreed[0];
      row.communication = agreed[1];
      row.wire_bytes = static_cast<std::size_t>(agreed[2]);
      if (agreed[3] != 0 && row.refused.empty()) row.refused = "another rank cannot run it here";
    }
    c.choose(options.min_gain);
  }
  return result;
}
}  // namespace detail

/// Plans the buckets `layouts` of this rank of `collective` in `space` (see
/// the top of this header): every candidate's local work on every bucket,
/// the network for the calls they make, and each bucket's choice among the
/// candidates (bucket_choice::choose: the fastest predicted step, times its
/// steps factor, bf16 unless another saves planner_options::min_gain).
/// Collective: every rank calls it with the same layouts and options, and
/// every rank gets bitwise the same plan (its numbers, choices and table;
/// each row's recorded calls are the rank's own).
/// @note Waits for the space, and takes about a second per (candidate,
/// bucket) pair at most.
template <gradient_element Gradient = float, class Collective, class Space>
compression_plan plan_compression(Collective& collective, std::vector<bucket_layout> const& layouts, Space const& space,
                                  planner_options const& options = {}) {
  return detail::plan<false, Gradient>(collective, layouts, space, options);
}

/// plan_compression for buckets reduced in two levels over `groups`
/// (hierarchical_allreducer; planner_options::bf16_within_node as its
/// option): calls inside the node are priced on the node's network, those
/// across nodes on the rails' (compression_plan::node_network, network),
/// each measured on every node or rail at once, as a step runs them. A
/// compressor that cannot be sharded in a node (classic TopK) is left out
/// with why. Collective over the world.
template <gradient_element Gradient = float, class Collective, class Space>
compression_plan plan_compression(node_groups<Collective>& groups, std::vector<bucket_layout> const& layouts,
                                  Space const& space, planner_options const& options = {}) {
  return detail::plan<false, Gradient>(groups, layouts, space, options);
}

/// plan_compression for buckets that are reduce-scattered
/// (any_reduce_scatterer, as a sharded optimizer's step): a candidate that
/// cannot reduce-scatter (PowerSGD, classic TopK) is left out with why.
template <gradient_element Gradient = float, reduce_scattering Collective, class Space>
compression_plan plan_sharded_compression(Collective& collective, std::vector<bucket_layout> const& layouts,
                                          Space const& space, planner_options const& options = {}) {
  return detail::plan<true, Gradient>(collective, layouts, space, options);
}

/// plan_sharded_compression in two levels over `groups`
/// (hierarchical_reduce_scatterer), priced as plan_compression's two levels.
template <gradient_element Gradient = float, reduce_scattering Collective, class Space>
compression_plan plan_sharded_compression(node_groups<Collective>& groups, std::vector<bucket_layout> const& layouts,
                                          Space const& space, planner_options const& options = {}) {
  return detail::plan<true, Gradient>(groups, layouts, space, options);
}

/// The compressor of one bucket (an any_allreducer's): the choice's spec
/// where it is fixed, with an empty plan; the planner's choice among its
/// candidates for `layout` where it is automatic (`planner`'s candidates are
/// then those). Collective over `world` (a collective, or node_groups for
/// two levels, `planner.bf16_within_node` as the reducer's) where automatic,
/// as plan_compression: every rank gets the same spec.
template <gradient_element Gradient = float, class World, class Space>
std::pair<compressor_spec, compression_plan> choose_compressor(World& world, compressor_choice const& choice,
                                                               bucket_layout const& layout, Space const& space,
                                                               planner_options planner = {}) {
  if (!choice.is_automatic()) return {choice.spec(), compression_plan{}};
  planner.candidates = choice.candidates();
  compression_plan plan = plan_compression<Gradient>(world, {layout}, space, planner);
  compressor_spec chosen = plan.chosen(0);
  return {std::move(chosen), std::move(plan)};
}

/// The planner's choice for a model_reducer (or, with
/// reduce_scatter_delivery, a model_reduce_scatterer): plans the large
/// buckets of matrices that `options`' bucket rules make of `shapes`
/// (plan_buckets; `Gradient` as the reducer stores them) and returns
/// `options` with each one's compressor chosen
/// (model_reducer_options::compressors), and the plan: among the options'
/// candidates where its compressor is `auto`, else `planner`'s. Collective over
/// `world`, the reducer's: a flat collective, or node_groups for two levels
/// (options.bf16_within_node as the reducer's), as plan_compression (or
/// plan_sharded_compression).
template <gradient_element Gradient = float, class Delivery = all_reduce_delivery, class World, class Space>
std::pair<model_reducer_options, compression_plan> choose_compressors(
    World& world, std::vector<std::vector<std::size_t>> const& shapes, model_reducer_options options,
    Space const& space, planner_options planner = {}) {
  bucket_plan const buckets = plan_buckets(shapes, sizeof(Gradient), options);
  std::vector<bucket_layout> layouts;
  for (auto const& b : buckets.buckets) {
    if (!b.compressed) continue;
    layouts.emplace_back();
    for (std::size_t p : b.params) layouts.back().add(shapes[p]);
  }
  compression_plan plan;
  options.compressors.clear();
  if (layouts.empty()) return {options, plan};
  planner.bf16_within_node = options.bf16_within_node;
  if (options.compressor.is_automatic()) planner.candidates = options.compressor.candidates();
  if constexpr (Delivery::scatters)
    plan = plan_sharded_compression<Gradient>(world, layouts, space, planner);
  else
    plan = plan_compression<Gradient>(world, layouts, space, planner);
  for (std::size_t b = 0; b < layouts.size(); ++b) options.compressors.push_back(plan.chosen(b));
  return {options, plan};
}

}  // namespace gradcomp
