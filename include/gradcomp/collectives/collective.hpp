// The collective concept: how ranks exchange data. gradcomp ships NCCL (the
// default on GPUs), MPI and an in-process backend (local_group); a user's own
// backend is any class with the members below.
#pragma once

#include <gradcomp/execution/host.hpp>
#include <gradcomp/span.hpp>
#include <gradcomp/types.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Where a buffer handed to a collective lives.
enum class memory_kind { host, device };

/// The memory_kind of a span's memory tag.
template <class Memory>
inline constexpr memory_kind memory_kind_of =
    std::same_as<Memory, device_memory> ? memory_kind::device : memory_kind::host;

/// A communicator for one rank of a group.
///
/// - rank() in [0, size()).
/// - all_reduce(send, recv, count, op): recv[i] = op over ranks of send[i];
///   send == recv is allowed (in place). Every rank receives bitwise the same
///   result.
/// - all_gather(send, recv, count): recv[r * count + i] = send of rank r.
/// - broadcast(buffer, count, root): every rank's buffer = root's buffer.
/// - accepts(kind): whether buffers of that memory kind may be passed.
///
/// Optional members, used where a backend has them (a wrapper of another
/// backend should forward them: examples/common/timed_collective.hpp):
/// - reduce_scatter(send, recv, count, op): see reduce_scattering.
/// - split(color, key): see splittable; split_node(): this rank's node as
///   the backend detects it (MPI's shared memory, NCCL's host names), for
///   split_nodes without ranks_per_node.
/// - check_async(): throws collective_error for a failure the backend found
///   asynchronously (NCCL: ncclCommGetAsyncError, aborting the
///   communicator); reducers call it after each step.
/// - stream(): the CUDA stream the calls are ordered on; a reducer's space
///   must run on the same one (checked at construction).
/// - agree(send, recv): the step's agreement word summed over a world larger
///   than this group (rail_collective: a rail agrees over every node), in
///   place of all_reduce of that one word.
/// - a default_space(C const&) overload found by argument-dependent lookup:
///   the execution space its buffers suit (nccl_communicator: its stream's
///   cuda_space); without one, the host.
///
/// Calls must be made by every rank in the same order with the same counts.
/// A backend may complete them asynchronously (NCCL orders them on a CUDA
/// stream); the host backends return when the data is in place. Each is a
/// template over the element types of gradcomp::wire_type. A failed
/// collective throws collective_error; a backend never leaves a rank waiting
/// forever on a peer that failed, where it can help it (local_group aborts
/// the group, NCCL aborts the communicator).
template <class C>
concept collective = requires(C& c, C const& cc, float const* send, float* recv, std::size_t n) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  { cc.accepts(memory_kind::host) } -> std::same_as<bool>;
  c.all_reduce(send, recv, n, reduce_op::sum);
  c.all_gather(send, recv, n);
  c.broadcast(recv, n, 0);
};

/// A collective that can also reduce-scatter (every gradcomp backend can;
/// the hierarchical path needs it):
/// - reduce_scatter(send, recv, count, op): send holds size() blocks of
///   count elements; recv = op over ranks of block rank() of their send.
///   recv may be send + rank() * count (in place; the rest of send may then
///   be overwritten). Element for element, the result is what all_reduce
///   would give the same block (bitwise in local_group).
template <class C>
concept reduce_scattering = collective<C> && requires(C& c, float const* send, float* recv, std::size_t n) {
  c.reduce_scatter(send, recv, n, reduce_op::sum);
};

/// A collective that can split into smaller groups (every gradcomp backend
/// can; the hierarchical path needs it):
/// - split(color, key): collective over this group; a new communicator of the
///   ranks that passed the same color, ranked by (key, rank): MPI_Comm_split's
///   rule.
template <class C>
concept splittable = collective<C> && requires(C& c) {
  { c.split(0, 0) } -> std::same_as<C>;
};

/// The execution space that suits a collective's buffers: the host unless
/// the collective's backend overloads default_space (NCCL: its CUDA stream).
template <class Collective>
host_space default_space(Collective const&) {
  return {};
}

/// The type default_space returns for Collective.
template <class Collective>
using default_space_t = decltype(default_space(std::declval<Collective const&>()));

namespace detail {
/// The step's agreement: every rank's status word summed over the group. A
/// collective that is one rail of a larger world (hierarchical) agrees over
/// the whole world instead, through its agree() member, so every rank of the
/// world commits or fails a step together.
template <class C>
void agree_sum(C& c, std::uint64_t const* send, std::uint64_t* recv) {
  if constexpr (requires { c.agree(send, recv); })
    c.agree(send, recv);
  else
    c.all_reduce(send, recv, 1, reduce_op::sum);
}
}  // namespace detail

}  // namespace gradcomp
