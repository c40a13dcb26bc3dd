// The planner's rehearsal: a candidate's step run over a dry_run collective
// of the world's shape (one group, or two levels), its local work timed and
// its collective calls recorded (see planner.hpp).
#pragma once

#include <gradcomp/collectives/dry_run.hpp>
#include <gradcomp/planning/plan.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>
#include <gradcomp/reducers/any_reduce_scatterer.hpp>
#include <gradcomp/reducers/node_groups.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

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
  std::nth_element(times.begin(), times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2), times.end());
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

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
