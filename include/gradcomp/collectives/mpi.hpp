// MPI backend (component gradcomp::mpi): one process per rank.
//
// Without <mpi.h> on the include path (no gradcomp::mpi linked) this header
// still compiles, and declares mpi_communicator without defining it: code
// that uses it fails to compile there, on an incomplete type.
#pragma once

#include <gradcomp/config.hpp>

#if !__has_include(<mpi.h>)
namespace gradcomp::inline GRADCOMP_ABI {
class mpi_communicator;  // defined where <mpi.h> is found: link gradcomp::mpi
}  // namespace gradcomp
#else

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/detail/reduce.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/types.hpp>

// gradcomp uses MPI's C API only; skip the deprecated C++ bindings.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Wraps an MPI communicator; satisfies gradcomp::collective. It does not
/// own a communicator it is given; one that split() made is freed with the
/// last copy.
///
/// Host buffers always; device buffers only when the caller declares the MPI
/// library CUDA-aware. fp16 and bf16 have no MPI datatype: they travel as
/// 16-bit words with user-defined operators that accumulate in float.
/// Collectives block until the data is in place.
class mpi_communicator {
 public:
  /// Uses `comm` (MPI must be initialized); `cuda_aware` declares that the
  /// MPI library accepts device pointers.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, bool cuda_aware = false)
      : comm_(comm), cuda_aware_(cuda_aware) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  /// This process's rank in the communicator.
  int rank() const { return rank_; }
  /// Number of ranks.
  int size() const { return size_; }
  /// Host memory; device memory when declared CUDA-aware.
  bool accepts(memory_kind kind) const { return kind == memory_kind::host || cuda_aware_; }
  /// The wrapped communicator.
  MPI_Comm native() const { return comm_; }

  /// How a collective waits: 0 (the default) calls MPI's blocking
  /// collective, which spins until it is done; a positive interval starts the
  /// non-blocking one (MPI_Iallreduce and friends) and tests it every
  /// `interval`, sleeping in between, so a thread that waits (a reducer's
  /// progress thread) leaves the cores to the computation it overlaps.
  void set_poll_interval(std::chrono::microseconds interval) { poll_ = interval; }
  /// See set_poll_interval.
  std::chrono::microseconds poll_interval() const { return poll_; }

  /// recv = op over ranks of send; send may equal recv.
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    void const* source = send == recv ? MPI_IN_PLACE : static_cast<void const*>(send);
    int const n = checked_count(count);
    if (poll_.count() == 0)
      return check(MPI_Allreduce(source, recv, n, datatype<T>(), operation<T>(op), comm_), "MPI_Allreduce");
    MPI_Request request;
    check(MPI_Iallreduce(source, recv, n, datatype<T>(), operation<T>(op), comm_, &request), "MPI_Iallreduce");
    wait(request, "MPI_Iallreduce");
  }

  /// recv[r * count + i] = send[i] of rank r.
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    if (count == 0) return;
    void const* source = send == recv + count * rank_ ? MPI_IN_PLACE : static_cast<void const*>(send);
    int const n = checked_count(count);
    if (poll_.count() == 0)
      return check(MPI_Allgather(source, n, datatype<T>(), recv, n, datatype<T>(), comm_), "MPI_Allgather");
    MPI_Request request;
    check(MPI_Iallgather(source, n, datatype<T>(), recv, n, datatype<T>(), comm_, &request), "MPI_Iallgather");
    wait(request, "MPI_Iallgather");
  }

  /// buffer = root's buffer on every rank.
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    if (count == 0) return;
    int const n = checked_count(count);
    if (poll_.count() == 0) return check(MPI_Bcast(buffer, n, datatype<T>(), root, comm_), "MPI_Bcast");
    MPI_Request request;
    check(MPI_Ibcast(buffer, n, datatype<T>(), root, comm_, &request), "MPI_Ibcast");
    wait(request, "MPI_Ibcast");
  }

  /// recv = op over ranks of block rank() of send (size() blocks of count);
  /// recv may be send + rank() * count (in place, host buffers: the rest of
  /// send is then overwritten).
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    int const n = checked_count(count);
    std::size_t const mine = count * static_cast<std::size_t>(rank_);
    bool const in_place = send + mine == recv;
    T* whole = recv - mine;  // in place, MPI leaves the result in the buffer's first block
    void const* source = in_place ? MPI_IN_PLACE : static_cast<void const*>(send);
    T* target = in_place ? whole : recv;
    if (poll_.count() == 0) {
      check(MPI_Reduce_scatter_block(source, target, n, datatype<T>(), operation<T>(op), comm_),
            "MPI_Reduce_scatter_block");
    } else {
      MPI_Request request;
      check(MPI_Ireduce_scatter_block(source, target, n, datatype<T>(), operation<T>(op), comm_, &request),
            "MPI_Ireduce_scatter_block");
      wait(request, "MPI_Ireduce_scatter_block");
    }
    if (in_place && mine != 0) std::memmove(recv, whole, count * sizeof(T));
  }

  /// MPI_Comm_split: the ranks that pass the same color, ranked by (key,
  /// rank). Collective.
  mpi_communicator split(int color, int key) const {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
    return owning(out);
  }

  /// The ranks that share this node's memory (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED), ranked as here. Collective.
  mpi_communicator split_node() const {
    MPI_Comm out = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out), "MPI_Comm_split_type");
    return owning(out);
  }

  /// Ends every process of the communicator (MPI has no gentler way to free
  /// peers blocked in a collective).
  [[noreturn]] void abort(int code = 1) const {
    MPI_Abort(comm_, code);
    std::abort();
  }

 private:
  static void check(int status, char const* call) {
    if (status == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(status, text, &length);
    throw collective_error(std::string(call) + " failed: " + std::string(text, length));
  }

  static int checked_count(std::size_t count) {
    if (count > static_cast<std::size_t>(INT_MAX))
      throw invalid_argument("mpi_communicator: " + std::to_string(count) +
                             " elements exceed MPI's int count; split the buffer");
    return static_cast<int>(count);
  }

  template <class T>
  static MPI_Datatype datatype() {
    constexpr dtype type = dtype_of_v<T>;
    if constexpr (type == dtype::float32)
      return MPI_FLOAT;
    else if constexpr (type == dtype::float64)
      return MPI_DOUBLE;
    else if constexpr (type == dtype::float16 || type == dtype::bfloat16)
      return MPI_UINT16_T;
    else if constexpr (type == dtype::int8)
      return MPI_INT8_T;
    else if constexpr (type == dtype::uint8)
      return MPI_UINT8_T;
    else if constexpr (type == dtype::int32)
      return MPI_INT32_T;
    else if constexpr (type == dtype::uint32)
      return MPI_UINT32_T;
    else if constexpr (type == dtype::int64)
      return MPI_INT64_T;
    else
      return MPI_UINT64_T;
  }

  // The 16-bit float operators: combine in float, round once per pair.
  template <class T, reduce_op Op>
  static void combine16(void* in, void* inout, int* len, MPI_Datatype*) {
    auto const* a = static_cast<T const*>(in);
    auto* b = static_cast<T*>(inout);
    for (int i = 0; i < *len; ++i) b[i] = T(detail::combine(static_cast<float>(a[i]), static_cast<float>(b[i]), Op));
  }

  template <class T>
  static MPI_Op operation(reduce_op op) {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
      // Created on first use (MPI is initialized by then) and kept for the
      // life of the process, like MPI's own operators.
      static MPI_Op const ops[3] = {make_op<combine16<T, reduce_op::sum> >(), make_op<combine16<T, reduce_op::max> >(),
                                    make_op<combine16<T, reduce_op::min> >()};
      return ops[static_cast<int>(op)];
    } else {
      return op == reduce_op::sum ? MPI_SUM : op == reduce_op::max ? MPI_MAX : MPI_MIN;
    }
  }

  template <MPI_User_function* F>
  static MPI_Op make_op() {
    MPI_Op op;
    check(MPI_Op_create(F, /*commute=*/1, &op), "MPI_Op_create");
    return op;
  }

  void wait(MPI_Request& request, char const* call) const {
    for (;;) {
      int done = 0;
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), call);
      if (done) return;
      std::this_thread::sleep_for(poll_);
    }
  }

  mpi_communicator owning(MPI_Comm comm) const {
    mpi_communicator c(comm, cuda_aware_);
    c.poll_ = poll_;
    c.owner_ = std::shared_ptr<void>(nullptr, [comm](void*) mutable {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm);
    });
    return c;
  }

  MPI_Comm comm_;
  bool cuda_aware_;
  std::shared_ptr<void> owner_;  // frees a communicator split() made
  std::chrono::microseconds poll_{0};
  int rank_ = 0;
  int size_ = 1;
};

static_assert(collective<mpi_communicator>);
static_assert(reduce_scattering<mpi_communicator> && splittable<mpi_communicator>);

}  // namespace gradcomp

#endif  // __has_include(<mpi.h>)
