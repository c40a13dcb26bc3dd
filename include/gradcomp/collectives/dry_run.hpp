// dry_run: a collective that plays one rank of a group without a network.
// Each call leaves this rank's own data where the group's result would go
// (so a compressor's step runs whole, at its real cost, on a realistic
// amount of data) and records the call: the planner times a compressor's
// local work with it, and reads off the calls its step makes.
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// The collective operations, as a network sees them.
enum class collective_op : std::uint8_t { all_reduce, all_gather, reduce_scatter, broadcast };

/// Name of an operation, for tables and messages.
inline char const* name_of(collective_op op) {
  constexpr char const* names[] = {"all-reduce", "all-gather", "reduce-scatter", "broadcast"};
  return names[static_cast<int>(op)];
}

/// One call of a step: what it moves and in which type.
struct collective_call {
  collective_op op = collective_op::all_reduce;
  dtype type = dtype::float32;
  /// Elements each rank sends: the message (all-reduce, broadcast), its own
  /// part (all-gather), or the whole of its blocks (reduce-scatter).
  std::size_t count = 0;
  /// Bytes each rank sends, as count x the type's size.
  std::size_t bytes() const { return count * size_of(type); }
  friend bool operator==(collective_call const&, collective_call const&) = default;
};

/// Rank `rank` of a group of `size` over buffers of `Space`, with no one to
/// talk to (see the top of this header). Satisfies gradcomp::collective and
/// reduce_scattering. Not splittable: a split needs the other ranks.
template <class Space = host_space>
class dry_run {
 public:
  /// Rank `rank` of `size`, moving data with `space`.
  dry_run(int rank, int size, Space space = {}) : rank_(rank), size_(size), space_(space) {
    GRADCOMP_EXPECTS(size >= 1 && rank >= 0 && rank < size,
                     "dry_run: rank " + std::to_string(rank) + " of " + std::to_string(size) + " does not exist");
    calls_.reserve(64);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool accepts(memory_kind kind) const { return kind == memory_kind_of<typename Space::memory>; }
  /// The space data moves in.
  Space const& space() const { return space_; }

  /// recv = send (this rank's part of the sum).
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op) {
    record(collective_op::all_reduce, dtype_of_v<T>, count);
    if (send != recv) space_.copy(recv, send, count * sizeof(T));
  }
  /// Every rank's slot of recv = send.
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    record(collective_op::all_gather, dtype_of_v<T>, count);
    for (int r = 0; r < size_; ++r)
      if (send != recv + static_cast<std::size_t>(r) * count)
        space_.copy(recv + static_cast<std::size_t>(r) * count, send, count * sizeof(T));
  }
  /// recv = this rank's block of send.
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op) {
    record(collective_op::reduce_scatter, dtype_of_v<T>, count * static_cast<std::size_t>(size_));
    T const* mine = send + static_cast<std::size_t>(rank_) * count;
    if (mine != recv) space_.copy(recv, mine, count * sizeof(T));
  }
  /// Nothing moves.
  template <wire_type T>
  void broadcast(T*, std::size_t count, int) {
    record(collective_op::broadcast, dtype_of_v<T>, count);
  }

  /// The calls since the last clear().
  std::vector<collective_call> const& calls() const { return calls_; }
  /// Forgets the calls (keeps the room: recording allocates only past 64 calls).
  void clear() { calls_.clear(); }

 private:
  void record(collective_op op, dtype type, std::size_t count) { calls_.push_back({op, type, count}); }

  int rank_, size_;
  Space space_;
  std::vector<collective_call> calls_;
};

/// An allreducer over dry_run runs in its space.
template <class Space>
Space default_space(dry_run<Space> const& d) {
  return d.space();
}

static_assert(collective<dry_run<host_space>> && reduce_scattering<dry_run<host_space>>);

}  // namespace gradcomp
