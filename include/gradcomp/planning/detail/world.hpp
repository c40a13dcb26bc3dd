// How the planner's ranks agree before they choose: the largest of each
// value over the world (flat or two levels), the links any rank saw, and the
// network measured per level and agreed over the world.
#pragma once

#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/planning/network.hpp>
#include <gradcomp/planning/plan.hpp>
#include <gradcomp/reducers/node_groups.hpp>

#include <cstddef>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

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

/// The network of the links `seen` over `c` (agreed over `others` too):
/// those `known` has taken from it, the rest measured now. Every rank
/// measures the same: `known` is the same everywhere.
template <class Collective, class Space, class... Others>
network_model measure_rest(Collective& c, Space const& space, seen_links const& seen, network_model const& known,
                           network_options const& o, Others&... others) {
  GRADCOMP_EXPECTS(known.links.empty() || known.ranks == c.size(),
                   "plan_compression: the network measured before is of " + std::to_string(known.ranks) +
                       " ranks, this group of " + std::to_string(c.size()));
  std::vector<std::pair<collective_op, dtype>> wanted;
  for (auto const& [op, type] : seen)
    if (known.find(op, type) == nullptr) wanted.emplace_back(op, type);
  network_model now{.ranks = c.size(), .links = {}};
  if (!wanted.empty()) now = measure_network(c, space, wanted, o, others...);
  network_model out{.ranks = c.size(), .links = {}};
  for (auto const& [op, type] : seen) {
    auto const* l = known.find(op, type);
    out.links.push_back(l != nullptr ? *l : *now.find(op, type));
  }
  return out;
}

/// The networks a plan prices its calls on: the group's, or across nodes
/// and inside them (each measured on all nodes or rails at once, as a step
/// runs them, and agreed over the world), but for the links `known` has.
template <class Collective, class Space>
void measure_world(compression_plan& plan, Collective& c, Space const& space, seen_links seen, seen_links const&,
                   planner_options const& o) {
  agree_links(c, space, seen);
  plan.network = measure_rest(c, space, seen, o.measured, o.network);
}
template <class Collective, class Space>
void measure_world(compression_plan& plan, node_groups<Collective>& g, Space const& space, seen_links seen,
                   seen_links node_seen, planner_options const& o) {
  agree_links(g, space, seen), agree_links(g, space, node_seen);
  plan.node_network = measure_rest(g.local, space, node_seen, o.measured_node, o.network, g.cross);
  plan.network = measure_rest(g.cross, space, seen, o.measured, o.network, g.local);
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
