// single_rank: the world of one rank. Lets training code written for many
// ranks run unchanged in one process, and lets benchmarks time a
// compressor's local work without any communication.
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/types.hpp>

#include <string>

namespace gradcomp::inline GRADCOMP_ABI {

/// Rank 0 of 1, over buffers of execution space `Space`; satisfies
/// gradcomp::collective. Reductions over one rank copy (or, in place, do
/// nothing), ordered like the space's other work.
template <class Space = host_space>
class single_rank {
 public:
  /// A world of one, moving data with `space`.
  explicit single_rank(Space space = {}) : space_(space) {}

  /// Always 0.
  int rank() const { return 0; }
  /// Always 1.
  int size() const { return 1; }
  /// The memory of Space.
  bool accepts(memory_kind kind) const { return kind == memory_kind_of<typename Space::memory>; }
  /// The space data moves in.
  Space const& space() const { return space_; }

  /// recv = send.
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op) {
    if (send != recv) space_.copy(recv, send, count * sizeof(T));
  }
  /// recv = send.
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    if (send != recv) space_.copy(recv, send, count * sizeof(T));
  }
  /// recv = send.
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op) {
    if (send != recv) space_.copy(recv, send, count * sizeof(T));
  }
  /// Itself: a group of one splits into itself.
  single_rank split(int, int) const { return *this; }
  /// Nothing to send; root must be 0.
  template <wire_type T>
  void broadcast(T*, std::size_t, int root) {
    GRADCOMP_EXPECTS(root == 0, "single_rank: broadcast root " + std::to_string(root) + " is not rank 0");
  }

 private:
  Space space_;
};

/// An allreducer over single_rank runs in its space.
template <class Space>
Space default_space(single_rank<Space> const& world) {
  return world.space();
}

static_assert(collective<single_rank<host_space>>);
static_assert(reduce_scattering<single_rank<host_space>> && splittable<single_rank<host_space>>);

}  // namespace gradcomp
