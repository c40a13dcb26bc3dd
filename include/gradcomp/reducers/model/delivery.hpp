// How a model's buckets reach the ranks (the delivery: all-reduce or
// reduce-scatter) and over what (the world: one group, or node_groups in two
// levels), and what the model-level core needs of a world: its rank and
// size, one agreement over it, a split of it for each further lane, and a
// bucket's reducer built over it.
#pragma once

#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>
#include <gradcomp/reducers/any_reduce_scatterer.hpp>
#include <gradcomp/reducers/node_groups.hpp>
#include <gradcomp/reducers/options.hpp>

#include <memory>
#include <string>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Each bucket all-reduced: every rank gets the mean of the whole bucket
/// (any_allreducer; hierarchical_allreducer over node_groups).
struct all_reduce_delivery {
  template <class Collective, class Space, class Gradient>
  using reducer = any_allreducer<Collective, Space, Gradient>;
  static constexpr bool scatters = false;
  static constexpr char const* model_name = "model_reducer";
};

/// Each bucket reduce-scattered: every rank gets the mean of its shard of the
/// bucket (any_reduce_scatterer; hierarchical_reduce_scatterer over
/// node_groups), as a sharded optimizer's step (ZeRO-2, FSDP).
struct reduce_scatter_delivery {
  template <class Collective, class Space, class Gradient>
  using reducer = any_reduce_scatterer<Collective, Space, Gradient>;
  static constexpr bool scatters = true;
  static constexpr char const* model_name = "model_reduce_scatterer";
};

/// What a world is made of: a collective (flat), or node_groups of one (two levels).
template <class World>
struct world_traits {
  using collective = World;
  static constexpr bool two_levels = false;
};
template <class Collective>
struct world_traits<node_groups<Collective>> {
  using collective = Collective;
  static constexpr bool two_levels = true;
};

namespace detail::model {

template <class C>
int world_rank(C const& c) {
  return c.rank();
}
template <class C>
int world_size(C const& c) {
  return c.size();
}
template <class C>
int world_rank(node_groups<C> const& g) {
  return g.rank();
}
template <class C>
int world_size(node_groups<C> const& g) {
  return g.size();
}

/// One agreement over the whole world.
template <class C, class Space>
agreement agree_over(C& c, Space const& space, std::uint64_t a, std::uint64_t b, std::string const& failure) {
  return agreement(c, space, a, b, failure);
}
template <class C, class Space>
agreement agree_over(node_groups<C>& g, Space const& space, std::uint64_t a, std::uint64_t b,
                     std::string const& failure) {
  return agreement(g.local, g.cross, space, a, b, failure);
}

/// Whether a world can give more lanes: its collective can split.
template <class World>
inline constexpr bool splits = splittable<typename world_traits<World>::collective>;

/// A group of the same ranks whose collectives never meet the world's: one
/// more lane. Collective over the world.
template <class C>
C split_lane(C& c) requires splittable<C> {
  return c.split(0, c.rank());
}
template <class C>
node_groups<C> split_lane(node_groups<C>& g) requires splittable<C> {
  return {g.local.split(0, g.local.rank()), g.cross.split(0, g.cross.rank())};
}

}  // namespace detail::model

/// Builds bucket `options.bucket`'s reducer of `spec` for `layout` over a
/// lane's world: a function pointer, so that a reducer of device buckets can
/// be made in a .cu file while the rest is compiled by any compiler
/// (ddp_hook_device).
template <class Reducer, class World, class Space>
using bucket_maker = std::unique_ptr<Reducer> (*)(compressor_spec const& spec, World& world, bucket_layout layout,
                                                  Space const& space, allreducer_options const& options,
                                                  bool bf16_within_node);

/// The bucket_maker that constructs the reducer in the caller's translation
/// unit: over one group, or in two levels (bf16_within_node inside the node).
template <class Reducer, class World, class Space>
std::unique_ptr<Reducer> make_bucket(compressor_spec const& spec, World& world, bucket_layout layout,
                                     Space const& space, allreducer_options const& options, bool bf16_within_node) {
  if constexpr (world_traits<World>::two_levels)
    return std::make_unique<Reducer>(spec, world, std::move(layout), space,
                                     hierarchical_options{options, bf16_within_node});
  else
    return std::make_unique<Reducer>(spec, world, std::move(layout), space, options);
}

}  // namespace gradcomp
