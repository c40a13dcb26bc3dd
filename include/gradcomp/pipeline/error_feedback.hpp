// Error-feedback policies: what a rank carries from one step to the next.
//
// With error feedback a rank compresses acc = g + e instead of g, and keeps
// e <- acc - C(acc), the part its own payload did not carry, for the next
// step. Compression error then delays information instead of losing it.
//
// A policy is a template parameter of the allreducer. Its `ref` hands a
// step's passes the residual as two streams, previous() to read and next()
// to write, so the add and the store ride in the passes that already read
// and write the gradient: no pass over memory of its own. (Kernels that are
// not transforms take bind(): plain pointers.)
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI::error_feedback {

/// No error feedback: acc = g, nothing is kept.
struct none {
  /// Name for messages and reports.
  static constexpr std::string_view name = "none";
  /// False: compressors may skip residual bookkeeping entirely.
  static constexpr bool enabled = false;

  /// The residual's view for a step: zeros to read, nowhere to write.
  struct ref {
    /// e of the last committed step (from element `offset` on): zero.
    GRADCOMP_HOST_DEVICE zeros<float> previous(std::size_t /*offset*/ = 0) const { return {}; }
    /// Where this step's e goes: nowhere.
    GRADCOMP_HOST_DEVICE discard<float> next(std::size_t /*offset*/ = 0) const { return {}; }
    /// Plain accessors for kernels that index elements themselves.
    struct bound {
      /// No residual to read: acc is g itself.
      static constexpr bool keeps_residual = false;
      /// acc for element i given its gradient g.
      GRADCOMP_HOST_DEVICE float accumulate(std::size_t, float g) const { return g; }
      /// Records element i's next residual: nothing.
      GRADCOMP_HOST_DEVICE void update(std::size_t, float) const {}
    };
    /// The accessors (once per thread).
    GRADCOMP_HOST_DEVICE bound bind() const { return {}; }
  };

  /// Per-bucket state: none.
  template <class Space>
  class state {
   public:
    state(Space const&, std::size_t) {}
    ref view() const { return {}; }
    /// The word the step's commit flips: none.
    std::uint32_t* side() const { return nullptr; }
    void reset() {}
    /// Nothing to restore.
    void assign(float const*) {}
  };
};

/// Residual error feedback: e <- acc - C(acc), with C(acc) what this rank
/// itself transmitted.
///
/// The residual is double-buffered, and which buffer is current is a word in
/// the space's memory: a step reads the current buffer and writes the other
/// one, and the step's commit flips the word only when every rank agreed the
/// step was good. So a step that fails (a bad value on any rank, a
/// collective error) leaves the residual exactly as it was, and on a GPU the
/// choice is made on the device, without the host looking, in a CUDA Graph
/// too. Compressors write every element's next residual on every step.
/// Memory: two float buffers of the bucket's size.
struct residual {
  /// Name for messages and reports.
  static constexpr std::string_view name = "residual";
  /// True: compressors write the residual.
  static constexpr bool enabled = true;

  /// The residual's view for a step.
  struct ref {
    float* buffers[2];             ///< The two sides.
    std::uint32_t const* current;  ///< Which side holds the committed residual.

    /// e of the last committed step, to read (from element `offset` on).
    GRADCOMP_HOST_DEVICE selected<float const> previous(std::size_t offset = 0) const {
      return {{buffers[0], buffers[1]}, current, 0, offset};
    }
    /// Where this step's e goes (from element `offset` on).
    GRADCOMP_HOST_DEVICE selected<float> next(std::size_t offset = 0) const {
      return {{buffers[0], buffers[1]}, current, 1, offset};
    }

    /// Plain accessors for kernels that index elements themselves.
    struct bound {
      /// A residual to read: kernels may load `previous` as vectors.
      static constexpr bool keeps_residual = true;
      float const* previous;  ///< e of the last committed step.
      float* next;            ///< e this step writes.
      /// acc = g + e for element i.
      GRADCOMP_HOST_DEVICE float accumulate(std::size_t i, float g) const { return g + previous[i]; }
      /// Records element i's next residual.
      GRADCOMP_HOST_DEVICE void update(std::size_t i, float residual) const { next[i] = residual; }
    };
    /// The accessors (once per thread: reads the side word).
    GRADCOMP_HOST_DEVICE bound bind() const { return {previous().resolve(), next().resolve()}; }
  };

  /// Per-bucket state: the two buffers and the side word.
  template <class Space>
  class state {
   public:
    /// Zeroed residuals for `elements` values.
    state(Space const& space, std::size_t elements)
        : buffers_{buffer<float, Space>(elements, space), buffer<float, Space>(elements, space)}, side_(1, space) {
      reset();
    }
    /// The view a step's passes use.
    ref view() const { return {{buffers_[0].data(), buffers_[1].data()}, side_.data()}; }
    /// The word a step's commit flips.
    std::uint32_t* side() const { return side_.data(); }
    /// Zeroes the residual (asynchronously on a device stream).
    void reset() {
      for (auto const& b : buffers_) b.space().fill_zero(b.data(), b.size() * sizeof(float));
      side_.space().fill_zero(side_.data(), sizeof(std::uint32_t));
    }
    /// Makes `values` (host memory, one per element) the committed residual.
    /// @note On a device, waits for the copy.
    void assign(float const* values) {
      auto const& b = buffers_[0];
      if (b.size() > 0) b.space().from_host(b.data(), values, b.size() * sizeof(float));
      side_.space().fill_zero(side_.data(), sizeof(std::uint32_t));
    }
    /// The current residual.
    /// @note On a device, waits for the stream (it reads the side word).
    span<float const, typename Space::memory> current() const {
      std::uint32_t side = 0;
      side_.space().to_host(&side, side_.data(), sizeof side);
      return buffers_[side & 1u].view();
    }

   private:
    buffer<float, Space> buffers_[2];
    buffer<std::uint32_t, Space> side_;
  };
};

/// An error-feedback policy: names itself, hands a step a `ref` with
/// previous()/next() streams and bind(), and keeps per-bucket `state<Space>`.
template <class E>
concept policy = requires(typename E::ref r, std::size_t i, float x) {
  { E::name } -> std::convertible_to<std::string_view>;
  { E::enabled } -> std::convertible_to<bool>;
  r.previous();
  r.next();
  { r.bind().accumulate(i, x) } -> std::same_as<float>;
  r.bind().update(i, x);
};

static_assert(policy<none> && policy<residual>);

}  // namespace gradcomp::error_feedback
