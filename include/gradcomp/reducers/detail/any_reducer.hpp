// The one type erasure behind any_allreducer and any_reduce_scatterer: a
// bucket's reducer of whichever compressor a compressor_spec names, behind
// one virtual call per step (each kind's own step), and what both show of it.
#pragma once

#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/reducers/options.hpp>
#include <gradcomp/types.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// What every erased bucket reducer has, whichever way it delivers.
template <class Memory, class Gradient>
struct erased_reducer {
  virtual ~erased_reducer() = default;
  virtual void synchronize() = 0;
  virtual std::vector<std::byte> save() = 0;
  virtual bucket_checkpoint parse(span<std::byte const>) const = 0;
  virtual void apply(bucket_checkpoint const&) = 0;
  virtual void restore(span<std::byte const>) = 0;
  virtual void begin_at(std::uint64_t steps) = 0;
  virtual std::size_t wire_bytes() const = 0;
  virtual std::uint64_t steps() const = 0;
  virtual bool warming_up() const = 0;
  virtual bucket_layout const& layout() const = 0;
  virtual std::uint64_t fingerprint() const = 0;
};

/// An erased all-reduce reducer: its step.
template <class Memory, class Gradient>
struct erased_allreduce : erased_reducer<Memory, Gradient> {
  virtual void step(span<Gradient, Memory> gradient) = 0;
};

/// An erased reduce-scatter reducer: its step and its shards (`rank` counted
/// node by node in two levels).
template <class Memory, class Gradient>
struct erased_reduce_scatter : erased_reducer<Memory, Gradient> {
  virtual void step(span<Gradient, Memory> gradient, span<Gradient, Memory> shard) = 0;
  virtual element_range shard(int rank) const = 0;
  virtual int rank() const = 0;
};

/// `Reducer` behind `Interface`: the members every erased reducer has.
template <class Reducer, class Interface>
class erased_common : public Interface {
 public:
  template <class... Args>
  explicit erased_common(Args&&... args) : r_(std::forward<Args>(args)...) {}

  void synchronize() override { r_.synchronize(); }
  std::vector<std::byte> save() override { return r_.save(); }
  bucket_checkpoint parse(span<std::byte const> b) const override { return r_.parse_checkpoint(b); }
  void apply(bucket_checkpoint const& c) override { r_.restore(c); }
  void restore(span<std::byte const> b) override { r_.restore(b); }
  void begin_at(std::uint64_t steps) override { r_.begin_at(steps); }
  std::size_t wire_bytes() const override { return r_.wire_bytes(); }
  std::uint64_t steps() const override { return r_.steps(); }
  bool warming_up() const override { return r_.warming_up(); }
  bucket_layout const& layout() const override { return r_.layout(); }
  std::uint64_t fingerprint() const override { return r_.fingerprint(); }

 protected:
  Reducer r_;
};

/// An all-reduce `Reducer` behind erased_allreduce.
template <class Reducer, class Memory, class Gradient>
class erased_allreducer final : public erased_common<Reducer, erased_allreduce<Memory, Gradient>> {
  using base = erased_common<Reducer, erased_allreduce<Memory, Gradient>>;

 public:
  using base::base;
  void step(span<Gradient, Memory> g) override { this->r_(g); }
};

/// A reduce-scatter `Reducer` behind erased_reduce_scatter; `rank` is this
/// rank's place in its shards.
template <class Reducer, class Memory, class Gradient>
class erased_scatterer final : public erased_common<Reducer, erased_reduce_scatter<Memory, Gradient>> {
  using base = erased_common<Reducer, erased_reduce_scatter<Memory, Gradient>>;

 public:
  template <class... Args>
  explicit erased_scatterer(int rank, Args&&... args) : base(std::forward<Args>(args)...), rank_(rank) {}
  void step(span<Gradient, Memory> g, span<Gradient, Memory> shard) override { this->r_(g, shard); }
  element_range shard(int rank) const override { return {this->r_.shard_offset(rank), this->r_.shard_size(rank)}; }
  int rank() const override { return rank_; }

 private:
  int rank_;
};

/// A compressor's lane or wire type, for a description: "<int8>" (none for
/// fp32, fp16, bf16, whose names say it).
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

/// What any_allreducer and any_reduce_scatterer share: the spec, the erased
/// reducer (behind `Interface`: erased_allreduce or erased_reduce_scatter),
/// and the members that do not depend on how a step delivers.
template <class Memory, class Gradient, class Interface>
class any_reducer {
 public:
  using memory = Memory;
  using gradient_type = Gradient;  ///< How the bucket's gradients are stored.

  /// Waits for every step enqueued so far, then throws if one failed (see
  /// allreducer::synchronize). @note Waits for the space.
  void synchronize() { impl_->synchronize(); }
  /// This rank's state (see allreducer::save). @note Waits for the space.
  std::vector<std::byte> save() { return impl_->save(); }
  /// Reads and checks a checkpoint without applying it (see allreducer::parse_checkpoint).
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const { return impl_->parse(bytes); }
  /// Applies a parsed checkpoint on this rank alone. @note Waits for the space.
  void restore(bucket_checkpoint const& c) { impl_->apply(c); }
  /// Restores what save() wrote on every rank together, or on none.
  /// @note Collective; waits for the space.
  void restore(span<std::byte const> bytes) { impl_->restore(bytes); }
  /// Counts `steps` warm-up steps as taken (see allreducer::begin_at).
  void begin_at(std::uint64_t steps) { impl_->begin_at(steps); }

  /// The spec it was built from.
  compressor_spec const& spec() const { return spec_; }
  /// The compressor and its lane or wire type, e.g. "thc<uint8>", "topkc<bf16>".
  std::string const& description() const { return description_; }
  /// Bytes the last step put on the wire, per rank.
  std::size_t wire_bytes() const { return impl_->wire_bytes(); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return impl_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return impl_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return impl_->layout(); }
  /// The configuration's hash (see allreducer::fingerprint).
  std::uint64_t fingerprint() const { return impl_->fingerprint(); }

 protected:
  explicit any_reducer(compressor_spec const& spec) : spec_(spec) {}

  /// Builds the reducer `make(c, ef)` returns for the compressor and error
  /// feedback `spec_` names for `ranks` ranks (a unique_ptr to an erased<>,
  /// or null where `refuse(c)` threw, which the caller has agreed on first).
  template <class Make>
  void build(int ranks, Make&& make) {
    impl_ = visit_compressor(spec_, ranks, [&](auto c, auto ef) -> std::unique_ptr<Interface> {
      description_ = std::string(decltype(c)::name) + lane_of<decltype(c)>::suffix();
      return make(c, ef);
    });
  }

  compressor_spec spec_;
  std::string description_;
  std::unique_ptr<Interface> impl_;
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
