// An allreducer whose compressor is chosen at run time (compressor_spec):
// one type for every compressor, so a model's buckets can each take their
// own, and a program can take its compressor from its command line.
#pragma once

#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/detail/any_reducer.hpp>
#include <gradcomp/reducers/hierarchical.hpp>

#include <memory>
#include <string>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// allreducer<C, EF, Collective, default aggregator, Space> for the C and EF
/// a compressor_spec names: the same steps, bits and errors, behind one
/// virtual call per step. Construction is collective, as allreducer's: if any
/// rank's spec or configuration is unusable, every rank throws.
///
/// Every compressor is compiled in, for gradients stored as `Gradient`
/// (float, bfloat16 or half): on the CUDA space, use it from a .cu file that
/// includes <gradcomp/cuda.cuh>.
///
/// Besides operator() it has the members every erased reducer has
/// (detail::any_reducer): synchronize(), the checkpoints (save(),
/// parse_checkpoint(), restore()), begin_at(), spec(), description() (the
/// compressor and its lane, e.g. "thc<uint8>"), wire_bytes(), steps(),
/// warming_up(), layout() and fingerprint().
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
class any_allreducer : public detail::any_reducer<typename Space::memory, Gradient,
                                                  detail::erased_allreduce<typename Space::memory, Gradient>> {
  using interface = detail::erased_allreduce<typename Space::memory, Gradient>;
  using base = detail::any_reducer<typename Space::memory, Gradient, interface>;
  template <class Reducer>
  using erased = detail::erased_allreducer<Reducer, typename Space::memory, Gradient>;

 public:
  using memory = typename Space::memory;

  /// The compressor `spec` names, for `layout`, on this rank of `collective`.
  any_allreducer(compressor_spec const& spec, Collective& collective, bucket_layout layout,
                 allreducer_options options = {})
      : any_allreducer(spec, collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  any_allreducer(compressor_spec const& spec, Collective& collective, bucket_layout layout, Space space,
                 allreducer_options options = {})
      : base(spec) {
    std::string const failure = detail::spec_failure(spec, collective.size(), [](auto) {});
    expect_none_failed(agreement(collective, space, 0, 0, failure), failure, "any_allreducer", "this compressor_spec");
    this->build(collective.size(), [&](auto c, auto ef) {
      using reducer = allreducer<decltype(c), decltype(ef), Collective, default_aggregator_t<decltype(c)>, Space>;
      return std::make_unique<erased<reducer>>(c, collective, std::move(layout), space, options);
    });
  }

  /// The compressor `spec` names, reduced in two levels over `groups`
  /// (hierarchical_allreducer; its lanes are sized for groups.nodes()).
  /// Collective over the world; a compressor that cannot be sharded
  /// (classic TopK) fails every rank with invalid_argument.
  any_allreducer(compressor_spec const& spec, node_groups<Collective>& groups, bucket_layout layout, Space space,
                 hierarchical_options options = {})
      : base(spec) {
    std::string const failure = detail::spec_failure(spec, groups.nodes(), [](auto c) {
      if constexpr (!detail::shards_in_two_levels<decltype(c)>)
        throw invalid_argument(std::string(decltype(c)::name) +
                               " cannot be sharded across a node's ranks; run it flat, over the world");
    });
    expect_none_failed(agreement(groups.local, groups.cross, space, 0, 0, failure), failure, "any_allreducer",
                       "this compressor_spec");
    this->build(groups.nodes(), [&](auto c, auto ef) -> std::unique_ptr<interface> {
      using C = decltype(c);
      if constexpr (detail::shards_in_two_levels<C>) {
        using reducer = hierarchical_allreducer<C, decltype(ef), Collective, Space, Gradient>;
        return std::make_unique<erased<reducer>>(c, groups, std::move(layout), space, options);
      } else {
        return nullptr;  // (refused above)
      }
    });
  }

  /// See allreducer::operator().
  void operator()(span<Gradient, memory> gradient) { this->impl_->step(gradient); }
};

}  // namespace gradcomp
