// Carving typed pieces out of one workspace allocation, and the two-call
// protocol that sizes it: the same code measures (over an empty span) and
// later carves, so the two cannot drift apart.
#pragma once

#include <gradcomp/detail/checked.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/span.hpp>

#include <cstddef>

namespace gradcomp::inline GRADCOMP_ABI {

/// Carves typed, aligned pieces out of one workspace allocation. Built over
/// an empty span it only measures: the two-call protocol that sizes the
/// workspace once, at construction, with the same code that later carves it.
template <class Memory>
class workspace_carver {
 public:
  /// Alignment of every piece: enough for vector loads on any device.
  static constexpr std::size_t alignment = 256;

  /// Carves `workspace`; an empty one measures only.
  explicit workspace_carver(span<std::byte, Memory> workspace = {}) : workspace_(workspace) {}

  /// The next `count` elements of T (a null view when only measuring).
  /// Sizes that overflow are rejected with invalid_argument.
  template <class T>
  span<T, Memory> take(std::size_t count) {
    offset_ = detail::checked_round_up(offset_, alignment, "workspace");
    T* p = measuring() ? nullptr : reinterpret_cast<T*>(workspace_.data() + offset_);
    offset_ = detail::checked_add(offset_, detail::checked_mul(count, sizeof(T), "workspace"), "workspace");
    if (!measuring() && offset_ > workspace_.size())
      throw error("workspace_carver: the workspace is smaller than the compressor asked for");
    return {p, count};
  }
  /// Bytes taken so far.
  std::size_t bytes() const { return offset_; }
  /// True when this carver only measures.
  bool measuring() const { return workspace_.data() == nullptr; }

 private:
  span<std::byte, Memory> workspace_;
  std::size_t offset_ = 0;
};

}  // namespace gradcomp
