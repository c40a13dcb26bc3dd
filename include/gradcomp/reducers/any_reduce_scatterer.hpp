// A reduce_scatterer whose compressor is chosen at run time (compressor_spec),
// as any_allreducer is an allreducer's: one type for every compressor that
// can reduce-scatter, for sharded optimizers that take their compressor from
// a command line.
#pragma once

#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/hierarchical_reduce_scatterer.hpp>
#include <gradcomp/reducers/reduce_scatterer.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

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
/// a .cu file that includes <gradcomp/cuda.cuh>.
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
class any_reduce_scatterer {
 public:
  using memory = typename Space::memory;
  using gradient_type = Gradient;  ///< How the bucket's gradients are stored.

  /// The compressor `spec` names, for `layout`, on this rank of `collective`.
  any_reduce_scatterer(compressor_spec const& spec, Collective& collective, bucket_layout layout,
                       allreducer_options options = {})
      : any_reduce_scatterer(spec, collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  any_reduce_scatterer(compressor_spec const& spec, Collective& collective, bucket_layout layout, Space space,
                       allreducer_options options = {})
      : spec_(spec) {
    std::string const failure = detail::spec_failure(spec, collective.size(), detail::refuse_unshardable);
    expect_none_failed(agreement(collective, space, 0, 0, failure), failure, "any_reduce_scatterer",
                       "this compressor_spec");
    impl_ = visit_compressor(spec, collective.size(), [&](auto c, auto ef) -> std::unique_ptr<base> {
      if constexpr (detail::shards_by_elements<decltype(c)>) {
        using scatterer = reduce_scatterer<decltype(c), decltype(ef), Collective, Space, Gradient>;
        return std::make_unique<model<scatterer>>(collective.rank(), c, collective, std::move(layout), space, options);
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
      : spec_(spec) {
    std::string const failure = detail::spec_failure(spec, groups.nodes(), detail::refuse_unshardable);
    expect_none_failed(agreement(groups.local, groups.cross, space, 0, 0, failure), failure, "any_reduce_scatterer",
                       "this compressor_spec");
    int const own = groups.cross.rank() * groups.ranks_per_node() + groups.local.rank();
    impl_ = visit_compressor(spec, groups.nodes(), [&](auto c, auto ef) -> std::unique_ptr<base> {
      if constexpr (detail::shards_by_elements<decltype(c)>) {
        using scatterer = hierarchical_reduce_scatterer<decltype(c), decltype(ef), Collective, Space, Gradient>;
        return std::make_unique<model<scatterer>>(own, c, groups, std::move(layout), space, options);
      } else {
        return nullptr;  // (refused above)
      }
    });
  }

  /// See reduce_scatterer::operator().
  void operator()(span<Gradient, memory> gradient, span<Gradient, memory> shard) { impl_->step(gradient, shard); }
  /// See reduce_scatterer::synchronize(). @note Waits for the space.
  void synchronize() { impl_->synchronize(); }

  /// Where rank `rank`'s shard starts in the bucket.
  std::size_t shard_offset(int rank) const { return impl_->shard_offset(rank); }
  /// How many elements rank `rank`'s shard holds (the last may hold fewer, or none).
  std::size_t shard_size(int rank) const { return impl_->shard_size(rank); }
  /// Where this rank's shard starts.
  std::size_t shard_offset() const { return impl_->shard_offset(impl_->rank()); }
  /// How many elements this rank's shard holds.
  std::size_t shard_size() const { return impl_->shard_size(impl_->rank()); }

  /// @name Checkpoints (see reduce_scatterer)
  /// @{
  std::vector<std::byte> save() { return impl_->save(); }
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const { return impl_->parse(bytes); }
  void restore(bucket_checkpoint const& c) { impl_->apply(c); }
  /// Collective: every rank restores, or none.
  void restore(span<std::byte const> bytes) { impl_->restore(bytes); }
  /// @}

  /// The spec it was built from.
  compressor_spec const& spec() const { return spec_; }
  /// Bytes the last step put on the wire, per rank.
  std::size_t wire_bytes() const { return impl_->wire_bytes(); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return impl_->steps(); }
  /// The bucket.
  bucket_layout const& layout() const { return impl_->layout(); }
  /// The configuration's hash (see reduce_scatterer::fingerprint).
  std::uint64_t fingerprint() const { return impl_->fingerprint(); }

 private:
  struct base {
    virtual ~base() = default;
    virtual void step(span<Gradient, memory>, span<Gradient, memory>) = 0;
    virtual void synchronize() = 0;
    virtual int rank() const = 0;
    virtual std::size_t shard_offset(int) const = 0;
    virtual std::size_t shard_size(int) const = 0;
    virtual std::vector<std::byte> save() = 0;
    virtual bucket_checkpoint parse(span<std::byte const>) const = 0;
    virtual void apply(bucket_checkpoint const&) = 0;
    virtual void restore(span<std::byte const>) = 0;
    virtual std::size_t wire_bytes() const = 0;
    virtual std::uint64_t steps() const = 0;
    virtual bucket_layout const& layout() const = 0;
    virtual std::uint64_t fingerprint() const = 0;
  };

  template <class Scatterer>
  struct model final : base {
    template <class... A>
    explicit model(int rank, A&&... a) : s(std::forward<A>(a)...), own(rank) {}
    void step(span<Gradient, memory> g, span<Gradient, memory> shard) override { s(g, shard); }
    void synchronize() override { s.synchronize(); }
    int rank() const override { return own; }
    std::size_t shard_offset(int r) const override { return s.shard_offset(r); }
    std::size_t shard_size(int r) const override { return s.shard_size(r); }
    std::vector<std::byte> save() override { return s.save(); }
    bucket_checkpoint parse(span<std::byte const> b) const override { return s.parse_checkpoint(b); }
    void apply(bucket_checkpoint const& c) override { s.restore(c); }
    void restore(span<std::byte const> b) override { s.restore(b); }
    std::size_t wire_bytes() const override { return s.wire_bytes(); }
    std::uint64_t steps() const override { return s.steps(); }
    bucket_layout const& layout() const override { return s.layout(); }
    std::uint64_t fingerprint() const override { return s.fingerprint(); }
    Scatterer s;
    int own;
  };

  compressor_spec spec_;
  std::unique_ptr<base> impl_;
};

}  // namespace gradcomp
