// How the planner's ranks agree before they choose: the largest of each
// value over the world (flat or two levels), the links any rank saw, and the
// network measured per level and agreed over the world.
#pragma once

#include <gradcomp/execution.hpp>
#include <gradcomp/planning/network.hpp>
#include <gradcomp/planning/plan.hpp>
#include <gradcomp/reducers/node_groups.hpp>

#include <cstddef>
#include <set>
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

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
