// NCCL backend (component gradcomp::nccl), the default collective on GPUs.
//
// Without the CUDA runtime (GRADCOMP_WITH_CUDA, set by linking
// gradcomp::nccl) or <nccl.h>, this header still compiles, and declares
// nccl_communicator without defining it: code that uses it fails to compile
// there, on an incomplete type.
#pragma once

#include <gradcomp/config.hpp>

#if !GRADCOMP_HAS_CUDA || !__has_include(<nccl.h>)
namespace gradcomp::inline GRADCOMP_ABI {
class nccl_communicator;  // defined with the CUDA runtime and NCCL: link gradcomp::nccl
}  // namespace gradcomp
#else

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution/cuda.hpp>
#include <gradcomp/types.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Wraps an ncclComm_t and the CUDA stream its collectives are ordered on;
/// satisfies gradcomp::collective. Device buffers only.
///
/// Collectives are enqueued and return at once. A failed call, or an
/// asynchronous error that check() or wait() finds (a peer died, a network
/// failure), aborts the communicator with ncclCommAbort and throws
/// collective_error, so no rank is left hanging on a broken group.
class nccl_communicator {
 public:
  /// Borrows `comm`; collectives run on `stream`.
  nccl_communicator(ncclComm_t comm, cudaStream_t stream) : comm_(comm), stream_(stream), owned_(false) {
    query_shape();
  }

  /// Creates (and owns) rank `rank` of a `ranks`-rank communicator from a
  /// unique id that rank 0 made with ncclGetUniqueId and shared out of band.
  static nccl_communicator create(ncclUniqueId id, int ranks, int rank, cudaStream_t stream) {
    ncclComm_t comm = nullptr;
    ncclResult_t const status = ncclCommInitRank(&comm, ranks, id, rank);
    if (status != ncclSuccess)
      throw collective_error(std::string("ncclCommInitRank failed: ") + ncclGetErrorString(status));
    nccl_communicator c(comm, stream);
    c.owned_ = true;
    return c;
  }

  nccl_communicator(nccl_communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)),
        stream_(other.stream_),
        owned_(std::exchange(other.owned_, false)),
        rank_(other.rank_),
        size_(other.size_) {}
  nccl_communicator& operator=(nccl_communicator&&) = delete;
  nccl_communicator(nccl_communicator const&) = delete;
  nccl_communicator& operator=(nccl_communicator const&) = delete;
  ~nccl_communicator() {
    if (owned_ && comm_ != nullptr) ncclCommDestroy(comm_);
  }

  /// This rank.
  int rank() const { return rank_; }
  /// Number of ranks.
  int size() const { return size_; }
  /// Device memory only.
  bool accepts(memory_kind kind) const { return kind == memory_kind::device; }
  /// The stream collectives are ordered on.
  cudaStream_t stream() const { return stream_; }
  /// The wrapped communicator.
  ncclComm_t native() const { return comm_; }

  /// recv = op over ranks of send; send may equal recv.
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    require_live();
    check(ncclAllReduce(send, recv, count, type_of<T>(), op_of(op), comm_, stream_), "ncclAllReduce");
  }
  /// recv[r * count + i] = send[i] of rank r.
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    require_live();
    check(ncclAllGather(send, recv, count, type_of<T>(), comm_, stream_), "ncclAllGather");
  }
  /// buffer = root's buffer on every rank.
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    require_live();
    check(ncclBroadcast(buffer, buffer, count, type_of<T>(), root, comm_, stream_), "ncclBroadcast");
  }

  /// recv = op over ranks of block rank() of send (size() blocks of count);
  /// recv may be send + rank() * count.
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
    require_live();
    check(ncclReduceScatter(send, recv, count, type_of<T>(), op_of(op), comm_, stream_), "ncclReduceScatter");
  }

  /// ncclCommSplit: the ranks that pass the same color, ranked by (key,
  /// rank), on the same stream; owned by the result. Collective (blocking).
  nccl_communicator split(int color, int key) {
    require_live();
    ncclComm_t out = nullptr;
    check(ncclCommSplit(comm_, color, key, &out, nullptr), "ncclCommSplit");
    nccl_communicator c(out, stream_);
    c.owned_ = true;
    return c;
  }

  /// The ranks on this host (by host name), ranked as here. Collective.
  nccl_communicator split_node() {
    char name[256] = {};
    gethostname(name, sizeof name - 1);
    std::uint32_t hash = 2166136261u;  // FNV-1a: a color per host name
    for (char const* c = name; *c != '\0'; ++c) hash = (hash ^ static_cast<unsigned char>(*c)) * 16777619u;
    return split(static_cast<int>(hash & 0x7fffffffu), rank_);
  }

  /// Throws (after aborting the communicator) if NCCL has recorded an
  /// asynchronous error. Does not wait; cheap enough to call every step.
  void check_async() {
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) fail("asynchronous error", async);
  }

  /// Waits until the stream's work is done, polling for asynchronous NCCL
  /// errors; after `timeout` it aborts the communicator and throws instead of
  /// hanging on a peer that will never arrive.
  void wait(std::chrono::milliseconds timeout = std::chrono::minutes(10)) {
    auto const deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      cudaError_t const status = cudaStreamQuery(stream_);
      if (status == cudaSuccess) return;
      if (status != cudaErrorNotReady) GRADCOMP_CUDA_TRY(status);
      check_async();
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw collective_error("nccl_communicator: collective did not finish within " +
                               std::to_string(timeout.count()) + " ms; communicator aborted");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

 private:
  void require_live() const {
    if (comm_ == nullptr) throw collective_error("nccl_communicator: used after it was aborted");
  }

  void query_shape() {
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
  }

  void check(ncclResult_t status, char const* call) {
    if (status != ncclSuccess && status != ncclInProgress) fail(call, status);
  }

  [[noreturn]] void fail(char const* what, ncclResult_t status) {
    std::string message = std::string("nccl_communicator: ") + what + " failed: " + ncclGetErrorString(status);
    if (comm_ != nullptr) {
      if (char const* detail = ncclGetLastError(comm_); detail != nullptr && *detail != '\0')
        message += std::string(" (") + detail + ")";
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    throw collective_error(message + "; communicator aborted");
  }

  template <class T>
  static ncclDataType_t type_of() {
    constexpr dtype type = dtype_of_v<T>;
    if constexpr (type == dtype::float32)
      return ncclFloat32;
    else if constexpr (type == dtype::float64)
      return ncclFloat64;
    else if constexpr (type == dtype::float16)
      return ncclFloat16;
    else if constexpr (type == dtype::bfloat16)
      return ncclBfloat16;
    else if constexpr (type == dtype::int8)
      return ncclInt8;
    else if constexpr (type == dtype::uint8)
      return ncclUint8;
    else if constexpr (type == dtype::int32)
      return ncclInt32;
    else if constexpr (type == dtype::uint32)
      return ncclUint32;
    else if constexpr (type == dtype::int64)
      return ncclInt64;
    else
      return ncclUint64;
  }

  static ncclRedOp_t op_of(reduce_op op) {
    return op == reduce_op::sum ? ncclSum : op == reduce_op::max ? ncclMax : ncclMin;
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

static_assert(collective<nccl_communicator>);
static_assert(reduce_scattering<nccl_communicator> && splittable<nccl_communicator>);

/// NCCL's buffers live on the device: an allreducer over NCCL runs its
/// kernels on the communicator's stream unless given another space.
inline cuda_space default_space(nccl_communicator const& c) { return {c.stream()}; }

}  // namespace gradcomp

#endif  // GRADCOMP_HAS_CUDA && __has_include(<nccl.h>)
