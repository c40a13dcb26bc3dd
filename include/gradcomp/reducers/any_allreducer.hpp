// An allreducer whose compressor is chosen at run time (compressor_spec):
// one type for every compressor, so a model's buckets can each take their
// own, and a program can take its compressor from its command line.
#pragma once

#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/hierarchical.hpp>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// allreducer<C, EF, Collective, default aggregator, Space> for the C and EF
/// a compressor_spec names: the same steps, bits and errors, behind one
/// virtual call per step. Construction is collective, as allreducer's: if any
/// rank's spec or configuration is unusable, every rank throws.
///
/// Every compressor is compiled in, for gradients stored as `Gradient`
/// (float, bfloat16 or half): on the CUDA space, use it from a .cu file that
/// includes <gradcomp/cuda.cuh>.
template <class Collective, class Space = default_space_t<Collective>, gradient_element Gradient = float>
class any_allreducer {
 public:
  using memory = typename Space::memory;
  using gradient_type = Gradient;  ///< How the bucket's gradients are stored.

  /// The compressor `spec` names, for `layout`, on this rank of `collective`.
  any_allreducer(compressor_spec const& spec, Collective& collective, bucket_layout layout,
                 allreducer_options options = {})
      : any_allreducer(spec, collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  any_allreducer(compressor_spec const& spec, Collective& collective, bucket_layout layout, Space space,
                 allreducer_options options = {})
      : spec_(spec) {
    std::string const failure = detail::spec_failure(spec, collective.size(), [](auto) {});
    expect_none_failed(agreement(collective, space, 0, 0, failure), failure, "any_allreducer", "this compressor_spec");
    impl_ = visit_compressor(spec, collective.size(), [&](auto c, auto ef) -> std::unique_ptr<base> {
      using reducer = allreducer<decltype(c), decltype(ef), Collective, default_aggregator_t<decltype(c)>, Space>;
      return std::make_unique<model<reducer>>(describe(c), c, collective, std::move(layout), space, options);
    });
  }

  /// The compressor `spec` names, reduced in two levels over `groups`
  /// (hierarchical_allreducer; its lanes are sized for groups.nodes()).
  /// Collective over the world; a compressor that cannot be sharded
  /// (classic TopK) fails every rank with invalid_argument.
  any_allreducer(compressor_spec const& spec, node_groups<Collective>& groups, bucket_layout layout, Space space,
                 hierarchical_options options = {})
      : spec_(spec) {
    std::string const failure = detail::spec_failure(spec, groups.nodes(), [](auto c) {
      if constexpr (!detail::shards_in_two_levels<decltype(c)>)
        throw invalid_argument(std::string(decltype(c)::name) +
                               " cannot be sharded across a node's ranks; run it flat, over the world");
    });
    expect_none_failed(agreement(groups.local, groups.cross, space, 0, 0, failure), failure, "any_allreducer",
                       "this compressor_spec");
    impl_ = visit_compressor(spec, groups.nodes(), [&](auto c, auto ef) -> std::unique_ptr<base> {
      using C = decltype(c);
      if constexpr (detail::shards_in_two_levels<C>) {
        using reducer = hierarchical_allreducer<C, decltype(ef), Collective, Space, Gradient>;
        return std::make_unique<model<reducer>>(describe(c), c, groups, std::move(layout), space, options);
      } else {
        return nullptr;  // (refused above)
      }
    });
  }

  /// See allreducer::operator().
  void operator()(span<Gradient, memory> gradient) { impl_->step(gradient); }
  /// See allreducer::synchronize(). @note Waits for the space.
  void synchronize() { impl_->synchronize(); }
  /// See allreducer::save(). @note Waits for the space.
  std::vector<std::byte> save() { return impl_->save(); }
  /// See allreducer::parse_checkpoint().
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const { return impl_->parse(bytes); }
  /// See allreducer::restore(bucket_checkpoint const&). @note Waits for the space.
  void restore(bucket_checkpoint const& c) { impl_->apply(c); }
  /// See allreducer::restore(span). @note Collective; waits for the space.
  void restore(span<std::byte const> bytes) { impl_->restore(bytes); }

  /// The spec it was built from.
  compressor_spec const& spec() const { return spec_; }
  /// The compressor and its lane or wire type, e.g. "thc<uint8>", "topkc<bf16>".
  std::string const& description() const { return impl_->description(); }
  /// Bytes the last step put on the wire.
  std::size_t wire_bytes() const { return impl_->wire_bytes(); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return impl_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return impl_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return impl_->layout(); }
  /// The configuration's hash (see allreducer::fingerprint).
  std::uint64_t fingerprint() const { return impl_->fingerprint(); }

 private:
  struct base {
    virtual ~base() = default;
    virtual void step(span<Gradient, memory>) = 0;
    virtual void synchronize() = 0;
    virtual std::vector<std::byte> save() = 0;
    virtual bucket_checkpoint parse(span<std::byte const>) const = 0;
    virtual void apply(bucket_checkpoint const&) = 0;
    virtual void restore(span<std::byte const>) = 0;
    virtual std::string const& description() const = 0;
    virtual std::size_t wire_bytes() const = 0;
    virtual std::uint64_t steps() const = 0;
    virtual bool warming_up() const = 0;
    virtual bucket_layout const& layout() const = 0;
    virtual std::uint64_t fingerprint() const = 0;
  };

  template <class C>
  static std::string describe(C const&) {
    return std::string(C::name) + lane_of<C>::suffix();
  }

  template <class Reducer>
  struct model final : base {
    template <class... A>
    explicit model(std::string description, A&&... a) : r(std::forward<A>(a)...), text(std::move(description)) {}
    void step(span<Gradient, memory> g) override { r(g); }
    void synchronize() override { r.synchronize(); }
    std::vector<std::byte> save() override { return r.save(); }
    bucket_checkpoint parse(span<std::byte const> b) const override { return r.parse_checkpoint(b); }
    void apply(bucket_checkpoint const& c) override { r.restore(c); }
    void restore(span<std::byte const> b) override { r.restore(b); }
    std::string const& description() const override { return text; }
    std::size_t wire_bytes() const override { return r.wire_bytes(); }
    std::uint64_t steps() const override { return r.steps(); }
    bool warming_up() const override { return r.warming_up(); }
    bucket_layout const& layout() const override { return r.layout(); }
    std::uint64_t fingerprint() const override { return r.fingerprint(); }
    Reducer r;
    std::string text;
  };

  // A compressor's lane or wire type, for its description: "<int8>" (none
  // for fp32, fp16, bf16, whose names say it).
  template <class C>
  struct lane_of {
    static std::string suffix() { return ""; }
  };
  template <template <class...> class T, class X, class... Rest>
  struct lane_of<T<X, Rest...>> {
    static std::string suffix() {
      if constexpr (std::is_same_v<T<X, Rest...>, cast<X>>) return "";
      std::string_view const n = name_of(dtype_of_v<X>);
      std::string out(1, '<');  // (appended, not +: GCC 12 warns falsely on a chain of string +)
      out.append(n == "float32" ? "fp32" : n == "bfloat16" ? "bf16" : n == "float16" ? "fp16" : n);
      out.push_back('>');
      return out;
    }
  };

  compressor_spec spec_;
  std::unique_ptr<base> impl_;
};

}  // namespace gradcomp
