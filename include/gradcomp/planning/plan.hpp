// What the planner (planner.hpp) weighs and answers: its options, each
// candidate's row on each bucket, each bucket's choice among them, and the
// plan with its network; the plan's report as text is detail/report.hpp's.
#pragma once

#include <gradcomp/compressors/choice.hpp>
#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/planning/network.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// What the planner weighs.
struct planner_options {
  /// The compressors it may choose among (bf16 is measured beside them
  /// either way: every row is compared with it).
  std::vector<compressor_spec> candidates = compressor_choice::default_candidates();
  /// Steps to a target relative to bf16's, by spec string: with it,
  /// candidates are ranked by predicted time to target.
  std::map<std::string, double> steps_factor;
  /// The steps factor of a candidate other than bf16 that steps_factor
  /// leaves out. 1 ranks it by step time alone (what the planner's
  /// validation measures); more prices its unknown convergence: at 2 it is
  /// chosen only where it would pay even if it needed twice bf16's steps
  /// (the DDP hook's `auto`, ddp_hook_options).
  double unknown_steps_factor = 1;
  /// Seconds of a step outside the planned buckets' reductions (forward and
  /// backward passes, the optimizer, the small buckets). Time to target is
  /// steps x the whole step: each bucket's score carries a share of this, by
  /// its elements, so that steps factors and min_gain weigh the whole step
  /// (0: the reductions alone). Buckets are scored one by one: a plan that
  /// mixes compressors is priced as if each bucket's factor applied to its
  /// share of the step. Each rank may give its own: the largest counts.
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
  /// Links measured before over the same group (an earlier plan's
  /// compression_plan::network, and node_network for two levels): a link
  /// found there is priced from it, not measured again, so that a caller
  /// that plans bucket by bucket measures the network once. The same on
  /// every rank (an earlier plan's is); empty: everything is measured.
  network_model measured{.ranks = 0, .links = {}};
  network_model measured_node{.ranks = 0, .links = {}};
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
  compressor_spec chosen(std::size_t b) const {
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
  /// verdict (detail/report.hpp). Buckets are numbered from `first_bucket`
  /// (a caller that plans its buckets one at a time passes the index).
  std::string table(std::size_t first_bucket = 0) const;
};

}  // namespace gradcomp

#include <gradcomp/planning/detail/report.hpp>  // compression_plan::table()
