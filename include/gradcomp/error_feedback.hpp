// Error-feedback policies: what a rank carries from one step to the next.
//
// With error feedback a rank compresses acc = g + e instead of g, and keeps
// e <- acc - C(acc), the part its own payload did not carry, for the next
// step. Compression error then delays information instead of losing it.
//
// A policy is a template parameter of the allreducer; its `ref` is a small
// copyable view handed to the compressor's kernels, so the add and the store
// are inlined into the passes that already read and write the gradient: no
// pass over memory of its own.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradcomp::error_feedback {

/// No error feedback: acc = g, nothing is kept.
struct none {
  /// Name for messages and reports.
  static constexpr std::string_view name = "none";
  /// False: compressors may skip residual bookkeeping entirely.
  static constexpr bool enabled = false;

  /// Kernel view: adds nothing, stores nothing.
  struct ref {
    /// acc for element i given its gradient g.
    GRADCOMP_HOST_DEVICE float accumulate(std::size_t, float g) const { return g; }
    /// Records element i's next residual.
    GRADCOMP_HOST_DEVICE void update(std::size_t, float, bool) const {}
  };

  /// Per-bucket state: none.
  template <class Space>
  class state {
   public:
    state(Space const&, std::size_t) {}
    ref view() const { return {}; }
    void commit() {}
    void reset() {}
  };
};

/// Residual error feedback: e <- acc - C(acc), with C(acc) what this rank
/// itself transmitted.
///
/// The residual is double-buffered: a step reads the previous residual and
/// writes the next one into the other buffer, and only a completed step
/// commits it. A step that fails (a non-finite gradient, a collective error)
/// leaves the residual exactly as it was. Compressors must write every
/// element's next residual (update) on every step. Memory: two
/// float buffers of the bucket's size.
struct residual {
  /// Name for messages and reports.
  static constexpr std::string_view name = "residual";
  /// True: compressors write the residual.
  static constexpr bool enabled = true;

  /// Kernel view of the two residual buffers.
  struct ref {
    float const* previous;  ///< e of the last committed step.
    float* next;            ///< e this step writes.

    /// acc = g + e for element i.
    GRADCOMP_HOST_DEVICE float accumulate(std::size_t i, float g) const { return g + previous[i]; }
    /// Records element i's next residual: `residual` (acc - what was sent)
    /// when its value was usable, else the previous residual, so a NaN never
    /// enters the state. A select on the bits: a ?: would let the compiler
    /// compute `residual` only when used, in a branch (floating point may
    /// trap, so it is not speculated), and the loop would not vectorize.
    GRADCOMP_HOST_DEVICE void update(std::size_t i, float residual, bool usable) const {
      std::uint32_t const keep = 0u - static_cast<std::uint32_t>(usable);  // all ones when usable
      next[i] = detail::bits_float((detail::float_bits(residual) & keep) | (detail::float_bits(previous[i]) & ~keep));
    }
  };

  /// Per-bucket state: the two buffers and which one is current.
  template <class Space>
  class state {
   public:
    /// Zeroed residuals for `elements` values.
    state(Space const& space, std::size_t elements)
        : buffers_{buffer<float, Space>(elements, space), buffer<float, Space>(elements, space)} {
      reset();
    }
    /// The view a step's kernels use.
    ref view() const { return {buffers_[current_].data(), buffers_[1 - current_].data()}; }
    /// Makes the residual written by this step the current one.
    void commit() { current_ = 1 - current_; }
    /// Zeroes the residual (e.g. after the caller skipped a step).
    void reset() {
      for (auto const& b : buffers_) b.space().fill_zero(b.data(), b.size() * sizeof(float));
    }
    /// The current residual.
    span<float const, typename Space::memory> current() const { return buffers_[current_].view(); }

   private:
    buffer<float, Space> buffers_[2];
    int current_ = 0;
  };
};

/// An error-feedback policy: names itself, hands kernels a `ref` with
/// accumulate / update, and keeps per-bucket `state<Space>`.
template <class E>
concept policy = requires(typename E::ref r, std::size_t i, float x) {
  { E::name } -> std::convertible_to<std::string_view>;
  { E::enabled } -> std::convertible_to<bool>;
  { r.accumulate(i, x) } -> std::same_as<float>;
  r.update(i, x, true);
};

static_assert(policy<none> && policy<residual>);

}  // namespace gradcomp::error_feedback
