// A reduce_scatterer whose compressor is chosen at run time (compressor_spec),
// as any_allreducer is an allreducer's: one type for every compressor that
// can reduce-scatter, for sharded optimizers that take their compressor from
// a command line.
#pragma once

#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/detail/any_reducer.hpp>
#include <gradcomp/reducers/hierarchical_reduce_scatterer.hpp>
#include <gradcomp/reducers/reduce_scatterer.hpp>

#include <memory>
#include <string>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

namespace detail {
/// For spec_failure: throws for a compressor whose bucket cannot be cut into
/// shards.
inline constexpr auto refuse_unshardable = [](auto c) {
  if constexpr (!shards_by_elements<decltype(c)>)
    throw invalid_argument(std::string(decltype(c)::name) +
                           " cannot reduce-scatter (its payload does not sum element by element, or needs "
                           "the tensors' shapes); use an all-reduce");
};
}  // namespace detail

/// reduce_scatterer<C, EF, Collective, Space, Gradient> for the C and EF a
/// compressor_spec names (or hierarchical_reduce_scatterer's, over two
/// levels): the same shards, bits and errors, behind one
/// virtual call per step. Construction is collective: if any rank's spec or
/// configuration is unusable, or the spec names a compressor that cannot
/// reduce-scatter (PowerSGD, classic TopK), every rank throws
/// invalid_argument.
///
/// Every compressor that can is compiled in: on the CUDA space, use it from
/// a .cu file that includes <gradcomp/cuda.cuh>. Besides its step and shards
/// it has the members every erased reducer has, as any_allreducer.
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
class any_reduce_scatterer
    : public detail::any_reducer<typename Space::memory, Gradient,
                                 detail::erased_reduce_scatter<typename Space::memory, Gradient>> {
  using interface = detail::erased_reduce_scatter<typename Space::memory, Gradient>;
  using base = detail::any_reducer<typename Space::memory, Gradient, interface>;
  template <class Reducer>
  using erased = detail::erased_scatterer<Reducer, typename Space::memory, Gradient>;

 public:
  using memory = typename Space::memory;

  /// The compressor `spec` names, for `layout`, on this rank of `collective`.
  any_reduce_scatterer(compressor_spec const& spec, Collective& collective, bucket_layout layout,
                       allreducer_options options = {})
      : any_reduce_scatterer(spec, collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  any_reduce_scatterer(compressor_spec const& spec, Collective& collective, bucket_layout layout, Space space,
                       allreducer_options options = {})
      : base(spec) {
    std::string const failure = detail::spec_failure(spec, collective.size(), detail::refuse_unshardable);
    expect_none_failed(agreement(collective, space, 0, 0, failure), failure, "any_reduce_scatterer",
                       "this compressor_spec");
    this->build(collective.size(), [&](auto c, auto ef) -> std::unique_ptr<interface> {
      if constexpr (detail::shards_by_elements<decltype(c)>) {
        using scatterer = reduce_scatterer<decltype(c), decltype(ef), Collective, Space, Gradient>;
        return std::make_unique<erased<scatterer>>(collective.rank(), c, collective, std::move(layout), space, options);
      } else {
        return nullptr;  // (refused above)
      }
    });
  }

  /// The compressor `spec` names, reduce-scattered in two levels over
  /// `groups` (hierarchical_reduce_scatterer; its lanes are sized for
  /// groups.nodes()). Ranks are counted node by node in shard_offset(rank).
  /// Collective over the world.
  any_reduce_scatterer(compressor_spec const& spec, node_groups<Collective>& groups, bucket_layout layout, Space space,
                       hierarchical_options options = {})
      : base(spec) {
    std::string const failure = detail::spec_failure(spec, groups.nodes(), detail::refuse_unshardable);
    expect_none_failed(agreement(groups.local, groups.cross, space, 0, 0, failure), failure, "any_reduce_scatterer",
                       "this compressor_spec");
    int const own = groups.cross.rank() * groups.ranks_per_node() + groups.local.rank();
    this->build(groups.nodes(), [&](auto c, auto ef) -> std::unique_ptr<interface> {
      if constexpr (detail::shards_by_elements<decltype(c)>) {
        using scatterer = hierarchical_reduce_scatterer<decltype(c), decltype(ef), Collective, Space, Gradient>;
        return std::make_unique<erased<scatterer>>(own, c, groups, std::move(layout), space, options);
      } else {
        return nullptr;  // (refused above)
      }
    });
  }

  /// See reduce_scatterer::operator().
  void operator()(span<Gradient, memory> gradient, span<Gradient, memory> shard) { this->impl_->step(gradient, shard); }

  /// Where rank `rank`'s shard starts in the bucket.
  std::size_t shard_offset(int rank) const { return this->impl_->shard(rank).first; }
  /// How many elements rank `rank`'s shard holds (the last may hold fewer, or none).
  std::size_t shard_size(int rank) const { return this->impl_->shard(rank).count; }
  /// Where this rank's shard starts.
  std::size_t shard_offset() const { return shard_offset(this->impl_->rank()); }
  /// How many elements this rank's shard holds.
  std::size_t shard_size() const { return shard_size(this->impl_->rank()); }
};

}  // namespace gradcomp
