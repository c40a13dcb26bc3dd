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
// harness). Local work and communication are added, not overlapped: a
// bucket's step runs its passes and its collectives one after the other.
// plan_sharded_compression plans buckets that are reduce-scattered instead
// (any_reduce_scatterer: a sharded optimizer's step); the weights'
// all-gather after it is the same for every candidate and is not priced.
// Over node_groups, both plan the two-level reducers: the dry run has two
// levels, and each level's calls are priced on that level's network.
#pragma once

#include <gradcomp/collectives/dry_run.hpp>
#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/planning/network.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>
#include <gradcomp/reducers/any_reduce_scatterer.hpp>
#include <gradcomp/reducers/bucket_plan.hpp>
#include <gradcomp/reducers/model_reducer_options.hpp>
#include <gradcomp/reducers/node_groups.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// What the planner weighs.
struct planner_options {
  /// The compressors it may choose among (bf16 is measured beside them
  /// either way: every row is compared with it).
  std::vector<compressor_spec> candidates = {compressor_spec::parse("bf16"), compressor_spec::parse("topkc"),
                                             compressor_spec::parse("powersgd")};
  /// Steps to a target relative to bf16's, by spec string (1 where absent):
  /// with it, candidates are ranked by predicted time to target.
  std::map<std::string, double> steps_factor;
  /// Seconds of a step outside the planned buckets' reductions (forward and
  /// backward passes, the optimizer, the small buckets). Time to target is
  /// steps x the whole step: each bucket's score carries a share of this, by
  /// its elements, so that steps factors and min_gain weigh the whole step
  /// (0: the reductions alone). Buckets are scored one by one: a plan that
  /// mixes compressors is priced as if each bucket's factor applied to its
  /// share of the step.
  double compute_seconds = 0;
  /// Where bf16 is a candidate, another is chosen over it only if predicted
  /// to save more than this fraction of bf16's score: a smaller gain is
  /// within the spread of the planner's validation, and compression's
  /// effect on convergence is not in a step's time.
  double min_gain = 0.1;
  /// Two levels (node_groups): the node's reduce-scatter in bf16 rather
  /// than fp32 (model_reducer_options::bf16_within_node).
  bool bf16_within_node = false;
  /// Timed steps of each candidate's local work (their median counts).
  int timed_steps = 5;
  /// How the network is measured.
  network_options network{};
};

/// One candidate on one bucket.
struct plan_row {
  std::string spec;            ///< The spec string (compressor_spec::str()).
  std::string description;     ///< The compressor and its lane, as any_allreducer says.
  bool allowed = true;         ///< Among the candidates (false: bf16, measured for comparison only).
  std::string refused;         ///< Why it cannot run here (empty: it can).
  double local = 0;            ///< Seconds of local work.
  double communication = 0;    ///< Predicted seconds of its calls (the slowest rank's).
  double factor = 1;           ///< Steps to target relative to bf16.
  std::size_t wire_bytes = 0;  ///< The most any rank sends (two levels: across nodes).
  /// This rank's calls of one step, as recorded (two levels: those across
  /// nodes; a rank's calls follow its shard, so they may differ by rank).
  std::vector<collective_call> calls;
  std::vector<collective_call> node_calls;  ///< Two levels: this rank's calls inside the node.
  /// Predicted seconds per step.
  double total() const { return local + communication; }
};

/// The planner's answer for one bucket.
struct bucket_choice {
  std::size_t elements = 0;
  std::vector<plan_row> rows;  ///< Every candidate, then bf16 if it was not one.
  std::size_t chosen = 0;      ///< Index into rows.
  std::size_t baseline = 0;    ///< bf16's row.
  double compute = 0;          ///< This bucket's share of planner_options::compute_seconds.
  /// What ranks the candidates: (the row's step + the bucket's share of the
  /// rest of a step) x the row's steps factor.
  double score(plan_row const& row) const { return (row.total() + compute) * row.factor; }
  /// Whether the chosen compressor beats bf16 here (by min_gain where bf16
  /// is a candidate: choose() keeps it otherwise).
  bool pays() const { return chosen != baseline && score(rows[chosen]) < score(rows[baseline]); }

  /// Sets `chosen`: the allowed row that can run with the lowest score (ties
  /// go to the earlier row), but bf16, where it is allowed and can run,
  /// unless that row saves more than `min_gain` of bf16's score.
  void choose(double min_gain) {
    bool found = false;
    for (std::size_t r = 0; r < rows.size(); ++r)
      if (rows[r].allowed && rows[r].refused.empty() && (!found || score(rows[r]) < score(rows[chosen])))
        chosen = r, found = true;
    GRADCOMP_EXPECTS(found, "plan_compression: no candidate can run on a bucket of " + std::to_string(elements) +
                                " elements here (" + rows.front().refused + ")");
    auto const& base = rows[baseline];
    if (base.allowed && base.refused.empty() && score(rows[chosen]) >= (1 - min_gain) * score(base)) chosen = baseline;
  }
};

/// The planner's answer: the measured network and each bucket's choice.
struct compression_plan {
  network_model network;                                ///< The group's (two levels: across nodes, one rank per node).
  network_model node_network{.ranks = 0, .links = {}};  ///< Two levels: inside a node (else none: no ranks).
  std::vector<bucket_choice> buckets;
  bool sharded = false;  ///< The buckets' steps are reduce-scatters (plan_sharded_compression).

  /// The chosen spec of bucket b.
  compressor_spec const chosen(std::size_t b) const {
    return compressor_spec::parse(buckets[b].rows[buckets[b].chosen].spec);
  }
  /// The predicted seconds of the steps of every bucket with compressor
  /// `spec` (a candidate's or bf16's spec string), or with each bucket's
  /// choice where `spec` is empty; negative where some bucket left it out.
  double predicted(std::string_view spec = {}) const {
    double sum = 0;
    for (auto const& c : buckets) {
      auto const row =
          spec.empty() ? c.rows.begin() + static_cast<std::ptrdiff_t>(c.chosen)
                       : std::find_if(c.rows.begin(), c.rows.end(), [&](plan_row const& r) { return r.spec == spec; });
      if (row == c.rows.end() || !row->refused.empty()) return -1;
      sum += row->total();
    }
    return sum;
  }
  /// The plan as text: the network's lines, then a table per bucket and a
  /// verdict.
  std::string table() const {
    char line[256];
    auto const links = [&](network_model const& model, std::string const& what) {
      std::string out = what + ", t = latency + bytes / bandwidth:\n";
      for (auto const& l : model.links) {
        double const bw = l.fit.seconds_per_byte > 0 ? 1.0 / l.fit.seconds_per_byte / 1e9 : 0.0;
        std::snprintf(line, sizeof line, "  %-14s %-9s latency %9.1f us, bandwidth %8.3f GB/s%s\n", name_of(l.op),
                      std::string(name_of(l.type)).c_str(), l.fit.latency * 1e6, bw, bw == 0 ? " (not seen)" : "");
        out += line;
      }
      return out;
    };
    std::string out =
        node_network.ranks == 0
            ? links(network, "Network (" + std::to_string(network.ranks) + " ranks)")
            : links(node_network, "Inside a node (" + std::to_string(node_network.ranks) + " ranks)") +
                  links(network, "Across nodes (" + std::to_string(network.ranks) + " nodes, a rank of each)");
    bool any_pays = false;
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      auto const& c = buckets[b];
      std::snprintf(line, sizeof line, "Bucket %zu (%zu elements%s):\n  %-28s %10s %10s %10s %12s %9s\n", b, c.elements,
                    sharded ? ", reduce-scattered" : "", "candidate", "local ms", "comm ms", "total ms", "wire bytes",
                    "vs bf16");
      out += line;
      for (std::size_t r = 0; r < c.rows.size(); ++r) {
        auto const& row = c.rows[r];
        if (!row.refused.empty()) {
          out += "  " + row.spec + ": left out, " + row.refused + "\n";
          continue;
        }
        std::snprintf(line, sizeof line, "  %-28s %10.3f %10.3f %10.3f %12zu %8.2fx%s%s\n", row.spec.c_str(),
                      row.local * 1e3, row.communication * 1e3, row.total() * 1e3, row.wire_bytes,
                      c.score(row) / c.score(c.rows[c.baseline]), row.allowed ? "" : " (reference)",
                      r == c.chosen ? "  <- chosen" : "");
        out += line;
      }
      any_pays |= c.pays();
    }
    // What each "vs bf16" weighed beside the rows' totals: the step's other work, steps factors.
    double compute = 0;
    std::map<std::string, double> factors;
    for (auto const& c : buckets) {
      compute += c.compute;
      for (auto const& row : c.rows)
        if (row.factor != 1) factors[row.spec] = row.factor;
    }
    bool const to_target = !factors.empty();
    if (to_target || compute > 0) {
      std::snprintf(line, sizeof line, "vs bf16: (total + the bucket's share of the step's other %.3f ms)",
                    compute * 1e3);
      out += line;
      char const* between = ", x steps to target: ";
      for (auto const& [spec, factor] : factors) {
        std::snprintf(line, sizeof line, "%s%s %.2f", between, spec.c_str(), factor);
        out += line;
        between = ", ";
      }
      out += "\n";
    }
    char const* what = to_target ? "time to target" : "step time, not convergence";
    out += any_pays ? std::string("Compression pays on some buckets here (predicted ") + what + ").\n"
                    : std::string(
                          "Compression does not pay here: none is predicted to save enough of bf16's time on "
                          "any bucket (") +
                          what + ").\n";
    return out;
  }
};

namespace detail {
/// A world's dry run, for rehearsals: one dry_run of the group's size, or
/// two levels of them (a node's and a rail's).
template <class Space, class Collective>
dry_run<Space> dry_world(Collective const& c, Space const& space) {
  return dry_run<Space>(c.rank(), c.size(), space);
}
template <class Space, class Collective>
node_groups<dry_run<Space>> dry_world(node_groups<Collective> const& g, Space const& space) {
  return {dry_world(g.local, space), dry_world(g.cross, space)};
}
template <class Space>
void clear_calls(dry_run<Space>& dry) {
  dry.clear();
}
template <class Space>
void clear_calls(node_groups<dry_run<Space>>& dry) {
  dry.local.clear(), dry.cross.clear();
}
template <class Space>
void keep_calls(plan_row& row, dry_run<Space> const& dry) {
  row.calls = dry.calls();
}
template <class Space>
void keep_calls(plan_row& row, node_groups<dry_run<Space>> const& dry) {
  row.calls = dry.cross.calls(), row.node_calls = dry.local.calls();
}

/// rehearse's timing of `step` (a call of `reduce` on a gradient), into `row`.
template <class Gradient, class Reducer, class Dry, class Space, class Step>
void time_steps(plan_row& row, Reducer& reduce, Dry& dry, bucket_layout const& layout, Space const& space, int steps,
                Step&& step) {
  row.description = reduce.description();
  std::size_t const d = layout.size();
  std::vector<Gradient> host(d);
  std::uint64_t state = 0x9e3779b97f4a7c15u;  // a fixed, varied gradient: nothing in it is special
  for (auto& g : host) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    g = Gradient(static_cast<float>(static_cast<std::int64_t>(state >> 40) - (1 << 23)) * 0x1.0p-23f);
  }
  buffer<Gradient, Space> gradient(d, space);
  std::vector<double> times;
  for (int s = 0; s < steps + 2; ++s) {
    space.from_host(gradient.data(), host.data(), d * sizeof(Gradient));
    space.synchronize();
    clear_calls(dry);
    auto const start = std::chrono::steady_clock::now();
    step(gradient.view());
    reduce.synchronize();
    if (s >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  row.local = times[times.size() / 2];
  keep_calls(row, dry);
  row.wire_bytes = reduce.wire_bytes();
}

/// The local work of `spec` on `layout` over `dry` (dry_world's) in `space`:
/// an any_allreducer's step, or any_reduce_scatterer's where `Sharded`, in
/// two levels where `dry` has them; the median of `steps` timed steps after
/// two warm ones, with the calls of the last. `refused` says why where it
/// cannot be built.
template <class Space, class Gradient, bool Sharded, class Dry>
plan_row rehearse(compressor_spec const& spec, bucket_layout const& layout, Dry& dry, Space const& space, int steps,
                  bool bf16_within_node = false) {
  using dry_collective = dry_run<Space>;
  using reducer = std::conditional_t<Sharded, any_reduce_scatterer<dry_collective, Space, Gradient>,
                                     any_allreducer<dry_collective, Space, Gradient>>;
  plan_row row;
  row.spec = spec.str();
  allreducer_options const options{.nonfinite = nonfinite_policy::propagate};
  auto const run = [&](reducer& reduce) {
    if constexpr (Sharded) {
      std::size_t const n = reduce.shard_size();
      buffer<Gradient, Space> shard(std::max<std::size_t>(n, 1), space);
      time_steps<Gradient>(row, reduce, dry, layout, space, steps,
                           [&](auto gradient) { reduce(gradient, shard.view().subspan(0, n)); });
    } else {
      time_steps<Gradient>(row, reduce, dry, layout, space, steps, [&](auto gradient) { reduce(gradient); });
    }
  };
  try {
    if constexpr (std::is_same_v<Dry, dry_collective>) {
      reducer reduce(spec, dry, layout, space, options);
      run(reduce);
    } else {
      reducer reduce(spec, dry, layout, space, hierarchical_options{options, bf16_within_node});
      run(reduce);
    }
  } catch (std::exception const& e) {
    row.refused = e.what();
  }
  return row;
}

/// rehearse on rank `rank` of a flat group of `ranks`.
template <class Space, class Gradient, bool Sharded = false>
plan_row rehearse(compressor_spec const& spec, bucket_layout const& layout, int rank, int ranks, Space const& space,
                  int steps) {
  dry_run<Space> dry(rank, ranks, space);
  return rehearse<Space, Gradient, Sharded>(spec, layout, dry, space, steps);
}

/// The largest of each value over the world, on every rank.
template <class Collective, class Space>
void agree_max(Collective& c, buffer<double, Space>& values) {
  c.all_reduce(values.data(), values.data(), values.size(), reduce_op::max);
}
template <class Collective, class Space>
void agree_max(node_groups<Collective>& g, buffer<double, Space>& values) {
  agree_max(g.local, values), agree_max(g.cross, values);
}
/// The same for host values (through the space, where the collective moves data).
template <class World, class Space>
void agree_max(World& world, Space const& space, std::vector<double>& values) {
  buffer<double, Space> moved(values.size(), space);
  space.from_host(moved.data(), values.data(), values.size() * sizeof(double));
  agree_max(world, moved);
  space.to_host(values.data(), moved.data(), values.size() * sizeof(double));
}

/// Operations and types a plan's calls use.
using seen_links = std::set<std::pair<collective_op, dtype>>;

/// Every link (operation and type) any rank of the world saw, on every rank.
template <class World, class Space>
void agree_links(World& world, Space const& space, seen_links& seen) {
  constexpr std::size_t types = 16;  // (room for every dtype)
  std::vector<double> flags(4 * types, 0.0);
  for (auto const& [op, type] : seen) flags[static_cast<std::size_t>(op) * types + static_cast<std::size_t>(type)] = 1;
  agree_max(world, space, flags);
  for (std::size_t i = 0; i < flags.size(); ++i)
    if (flags[i] != 0) seen.insert({static_cast<collective_op>(i / types), static_cast<dtype>(i % types)});
}

/// The networks a plan prices its calls on: the group's, or across nodes
/// and inside them (each measured on all nodes or rails at once, as a step
/// runs them, and agreed over the world).
template <class Collective, class Space>
void measure_world(compression_plan& plan, Collective& c, Space const& space, seen_links seen, seen_links const&,
                   network_options const& o) {
  agree_links(c, space, seen);
  plan.network = measure_network(c, space, {seen.begin(), seen.end()}, o);
}
template <class Collective, class Space>
void measure_world(compression_plan& plan, node_groups<Collective>& g, Space const& space, seen_links seen,
                   seen_links node_seen, network_options const& o) {
  agree_links(g, space, seen), agree_links(g, space, node_seen);
  plan.node_network = measure_network(g.local, space, {node_seen.begin(), node_seen.end()}, o, g.cross);
  plan.network = measure_network(g.cross, space, {seen.begin(), seen.end()}, o, g.local);
}

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
      row.factor = factor == options.steps_factor.end() ? 1.0 : factor->second;
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
  measure_world(result, world, space, seen, node_seen, options.network);
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
  agree_max(world, space, priced);
  double elements = 0;
  for (auto const& c : result.buckets) elements += static_cast<double>(c.elements);
  std::size_t k = 0;
  for (auto& c : result.buckets) {
    c.compute = elements > 0 ? options.compute_seconds * static_cast<double>(c.elements) / elements : 0.0;
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

/// Whether `text` asks the planner to choose: "auto" or "auto:of=...".
inline bool is_auto_spec(std::string_view text) { return text == "auto" || text.starts_with("auto:of="); }

/// The candidates of an automatic spec: "auto" (bf16, TopK-Chunked and
/// PowerSGD at their defaults) or "auto:of=bf16+topkc:fraction=0.01+thc"
/// ('+' between specs).
inline std::vector<compressor_spec> auto_candidates(std::string_view text) {
  GRADCOMP_EXPECTS(is_auto_spec(text), "auto_candidates: '" + std::string(text) + "' is not an automatic spec");
  if (text == "auto") return planner_options{}.candidates;
  std::string_view rest = text.substr(std::string_view("auto:of=").size());
  std::vector<compressor_spec> out;
  while (!rest.empty()) {
    std::size_t const plus = rest.find('+');
    out.push_back(compressor_spec::parse(rest.substr(0, plus)));
    rest = plus == std::string_view::npos ? std::string_view{} : rest.substr(plus + 1);
  }
  GRADCOMP_EXPECTS(!out.empty(), "auto_candidates: '" + std::string(text) + "' names no candidate");
  return out;
}

/// The compressor of one bucket (an any_allreducer's): `text` parsed where
/// it names one, with an empty plan; the planner's choice among its
/// candidates for `layout` where it is "auto" or "auto:of=..." (`planner`'s
/// candidates are then those). Collective over `world` (a collective, or
/// node_groups for two levels, `planner.bf16_within_node` as the reducer's)
/// where automatic, as plan_compression: every rank gets the same spec.
template <gradient_element Gradient = float, class World, class Space>
std::pair<compressor_spec, compression_plan> choose_compressor(World& world, std::string_view text,
                                                               bucket_layout const& layout, Space const& space,
                                                               planner_options planner = {}) {
  if (!is_auto_spec(text)) return {compressor_spec::parse(text), compression_plan{}};
  planner.candidates = auto_candidates(text);
  compression_plan plan = plan_compression<Gradient>(world, {layout}, space, planner);
  compressor_spec chosen = plan.chosen(0);
  return {std::move(chosen), std::move(plan)};
}

/// The planner's choice for a model_reducer: plans the large buckets of
/// matrices that `options`' bucket rules make of `shapes` (plan_buckets;
/// `Gradient` as the reducer stores them) and returns `options` with each
/// one's compressor chosen (model_reducer_options::compressors), and the
/// plan. Collective over `world`, the reducer's: a flat collective, or
/// node_groups for two levels (options.bf16_within_node as the reducer's),
/// as plan_compression.
template <gradient_element Gradient = float, class World, class Space>
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
  plan = plan_compression<Gradient>(world, layouts, space, planner);
  for (std::size_t b = 0; b < layouts.size(); ++b) options.compressors.push_back(plan.chosen(b));
  return {options, plan};
}

}  // namespace gradcomp
