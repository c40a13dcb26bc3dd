// PyTorch backend (component gradcomp::torch): the process groups that
// torch.distributed set up (gloo on host tensors, NCCL on device tensors).
//
// Without PyTorch's headers on the include path (no gradcomp::torch linked)
// this header still compiles, and declares c10d_communicator without
// defining it: code that uses it fails to compile there, on an incomplete
// type.
#pragma once

#include <gradcomp/config.hpp>

#if !__has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
namespace gradcomp::inline GRADCOMP_ABI {
class c10d_communicator;  // defined where PyTorch's headers are found: link gradcomp::torch
}  // namespace gradcomp
#else

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/types.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#if GRADCOMP_HAS_CUDA
#include <gradcomp/execution/cuda.hpp>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Wraps a c10d::ProcessGroup (what `dist.group.WORLD` or `dist.new_group`
/// hold); satisfies gradcomp::collective. It shares the group with PyTorch.
///
/// Host buffers go through the group's CPU backend (gloo) and every call
/// returns when the data is in place. Device buffers go through its CUDA
/// backend (NCCL), enqueued on the stream it was given, the gradcomp space's,
/// without waiting for the host.
///
/// Every wire type maps onto a dtype both gloo and NCCL reduce: uint32 and
/// uint64 travel as int32 and int64 (a sum is bitwise the same with
/// wraparound; max and min flip the sign bit around the call, which maps
/// unsigned order onto signed order). So no (type, op) pair is refused.
///
/// c10d allocates a small Work object (and gradcomp a tensor handle) per
/// call; gradcomp's buffers themselves are never reallocated in a step. A
/// c10d failure or timeout (`timeout`, else the group's) becomes
/// collective_error: gloo reports a peer that died or never arrives by then,
/// so no rank is left waiting.
class c10d_communicator {
 public:
  using group_ptr = c10::intrusive_ptr<c10d::ProcessGroup>;

  /// Host tensors over `group`'s CPU backend; calls time out after `timeout`
  /// (zero: the group's own timeout).
  explicit c10d_communicator(group_ptr group, std::chrono::milliseconds timeout = std::chrono::milliseconds(0))
      : group_(std::move(group)), timeout_(timeout) {
    if (!group_) throw invalid_argument("c10d_communicator: the process group is null");
    if (!group_->hasBackendForDeviceType(c10::DeviceType::CPU))
      throw invalid_argument("c10d_communicator: process group '" + group_->getGroupName() +
                             "' has no CPU backend (gloo) for host buffers");
    rank_ = group_->getRank();
    size_ = group_->getSize();
  }

#if GRADCOMP_HAS_CUDA
  /// Device tensors on the current CUDA device, over `group`'s CUDA backend
  /// (NCCL), ordered on `stream`: the gradcomp space's.
  c10d_communicator(group_ptr group, cudaStream_t stream,
                    std::chrono::milliseconds timeout = std::chrono::milliseconds(0))
      : group_(std::move(group)), timeout_(timeout), on_device_(true) {
    if (!group_) throw invalid_argument("c10d_communicator: the process group is null");
    if (!group_->hasBackendForDeviceType(c10::DeviceType::CUDA))
      throw invalid_argument("c10d_communicator: process group '" + group_->getGroupName() +
                             "' has no CUDA backend (nccl) for device buffers");
    int device = 0;
    GRADCOMP_CUDA_TRY(cudaGetDevice(&device));
    device_ = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    stream_ = stream;
    rank_ = group_->getRank();
    size_ = group_->getSize();
  }
  /// The stream device collectives are ordered on.
  cudaStream_t stream() const { return stream_; }
#endif

  // A copy shares the group, not the scratch buffer (that is per reducer).
  c10d_communicator(c10d_communicator const& other)
      : group_(other.group_),
        timeout_(other.timeout_),
        on_device_(other.on_device_),
        device_(other.device_),
        rank_(other.rank_),
        size_(other.size_) {
#if GRADCOMP_HAS_CUDA
    stream_ = other.stream_;
#endif
  }
  c10d_communicator(c10d_communicator&&) noexcept = default;
  c10d_communicator& operator=(c10d_communicator const&) = delete;
  c10d_communicator& operator=(c10d_communicator&&) = delete;

  /// This rank in the group.
  int rank() const { return rank_; }
  /// Number of ranks in the group.
  int size() const { return size_; }
  /// Host memory for a host communicator, device memory for a device one.
  bool accepts(memory_kind kind) const { return (kind == memory_kind::device) == on_device_; }
  /// The wrapped group.
  group_ptr const& group() const { return group_; }

  /// recv = op over ranks of send; send may equal recv.
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    on_stream([&] {
      at::Tensor out = wrap(recv, count);
      if (send != recv) out.copy_(wrap(const_cast<T*>(send), count));
      flip<T>(out, op);
      std::vector<at::Tensor> tensors{out};
      c10d::AllreduceOptions options;
      options.reduceOp = op_of(op);
      options.timeout = timeout_or_unset();
      options.asyncOp = !on_device_;
      finish(group_->allreduce(tensors, options), "allreduce");
      flip<T>(out, op);
    });
  }

  /// recv[r * count + i] = send[i] of rank r.
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    if (count == 0) return;
    on_stream([&] {
      at::Tensor out = wrap(recv, count * static_cast<std::size_t>(size_));
      at::Tensor in = wrap(const_cast<T*>(send), count);
      // In place (send inside recv): gloo copies its input into the output
      // first, so host inputs are copied out of the way.
      if (!on_device_ && send == recv + count * static_cast<std::size_t>(rank_))
        in = wrap(scratch<T>(count), count).copy_(in);
      c10d::AllgatherOptions options;
      options.timeout = timeout_or_unset();
      options.asyncOp = !on_device_;
      finish(group_->all_gather_single(out, in, options), "all_gather_single");
    });
  }

  /// buffer = root's buffer on every rank.
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    if (count == 0) return;
    on_stream([&] {
      std::vector<at::Tensor> tensors{wrap(buffer, count)};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      options.timeout = timeout_or_unset();
      options.asyncOp = !on_device_;
      finish(group_->broadcast(tensors, options), "broadcast");
    });
  }

  /// recv = op over ranks of block rank() of send (size() blocks of count);
  /// recv may be send + rank() * count (in place: the rest of send is then
  /// overwritten). On the host this is an all-reduce of the whole buffer and
  /// a copy, as gloo's own reduce-scatter is, so each block is bitwise what
  /// all_reduce gives it; on the device, NCCL's reduce-scatter.
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
    if (count == 0) return;
    std::size_t const total = count * static_cast<std::size_t>(size_);
    std::size_t const mine = count * static_cast<std::size_t>(rank_);
    if (!on_device_) {
      T* whole = send + mine == recv ? recv - mine : scratch<T>(total);
      all_reduce(send, whole, total, op);
      if (whole + mine != recv) std::memcpy(recv, whole + mine, count * sizeof(T));
      return;
    }
    on_stream([&] {
      at::Tensor out = wrap(recv, count);
      at::Tensor in = wrap(const_cast<T*>(send), total);
      bool const in_place = send + mine == recv;
      flip<T>(in, op);
      c10d::ReduceScatterOptions options;
      options.reduceOp = op_of(op);
      options.timeout = timeout_or_unset();
      options.asyncOp = false;
      finish(group_->reduce_scatter_single(out, in, options), "reduce_scatter_single");
      if (!in_place) flip<T>(in, op);  // send is the caller's again
      flip<T>(out, op);
    });
  }

  /// The ranks that pass the same color, ranked by (key, rank): every rank
  /// learns every (color, key) by an all-gather, then c10d's splitGroup
  /// makes this rank's group. Collective.
  c10d_communicator split(int color, int key) {
    std::int64_t const own[2] = {color, key};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size_));
    if (on_device_) {
      all_gather_on_host(own, all.data());
    } else {
      all_gather(own, all.data(), 2);
    }
    // c10d ranks a subgroup by parent rank: keys must not reorder the ranks
    // of any color (checked by every rank on the same pairs, so all agree).
    auto const color_of = [&](int r) { return all[2 * static_cast<std::size_t>(r)]; };
    auto const key_of = [&](int r) { return all[2 * static_cast<std::size_t>(r) + 1]; };
    for (int a = 0; a < size_; ++a)
      for (int b = a + 1; b < size_; ++b)
        if (color_of(a) == color_of(b) && key_of(b) < key_of(a))
          throw invalid_argument(
              "c10d_communicator: split keys must keep the ranks' order within a color (c10d "
              "ranks a subgroup by its parent's ranks); ranks " +
              std::to_string(a) + " and " + std::to_string(b) + " are swapped");
    std::vector<int> members;
    for (int r = 0; r < size_; ++r)
      if (color_of(r) == color) members.push_back(r);
    std::string name = group_->getGroupName() + "/gradcomp" + std::to_string(split_serial(group_->getGroupName()));
    for (int r : members) name += "-" + std::to_string(r);
    group_ptr sub;
    try {
      sub = group_->splitGroup(members, std::nullopt, std::nullopt, name, name);
    } catch (std::exception const& e) {
      throw collective_error("c10d_communicator: splitGroup failed: " + message_of(e));
    }
    if (!sub)
      throw collective_error("c10d_communicator: splitGroup returned no group for rank " + std::to_string(rank_));
    c10d_communicator out(*this);
    out.group_ = std::move(sub);
    out.rank_ = out.group_->getRank();
    out.size_ = out.group_->getSize();
    return out;
  }

 private:
  static std::string message_of(std::exception const& e) {
    if (auto const* c10 = dynamic_cast<c10::Error const*>(&e)) return c10->what_without_backtrace();
    return e.what();
  }

  std::chrono::milliseconds timeout_or_unset() const { return timeout_.count() > 0 ? timeout_ : c10d::kUnsetTimeout; }

  // Host calls wait until the data is in place (gloo's timeout applies);
  // device calls were enqueued on the current stream (asyncOp = false).
  void finish(c10::intrusive_ptr<c10d::Work> const& work, char const* call) const {
    try {
      if (!on_device_) work->wait(timeout_.count() > 0 ? timeout_ : std::chrono::milliseconds(0));
    } catch (std::exception const& e) {
      throw collective_error(std::string("c10d_communicator: ") + call + " on process group '" +
                             group_->getGroupName() + "' failed: " + message_of(e));
    }
  }

  template <class F>
  void on_stream(F&& f) {
    try {
#if GRADCOMP_HAS_CUDA
      if (on_device_) {
        c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromExternal(stream_, device_.index()));
        return f();
      }
#endif
      f();
    } catch (collective_error const&) {
      throw;
    } catch (error const&) {
      throw;
    } catch (std::exception const& e) {
      throw collective_error("c10d_communicator: process group '" + group_->getGroupName() +
                             "' failed: " + message_of(e));
    }
  }

  template <class T>
  static constexpr c10::ScalarType scalar_type() {
    constexpr dtype type = dtype_of_v<T>;
    if constexpr (type == dtype::float32)
      return c10::ScalarType::Float;
    else if constexpr (type == dtype::float64)
      return c10::ScalarType::Double;
    else if constexpr (type == dtype::float16)
      return c10::ScalarType::Half;
    else if constexpr (type == dtype::bfloat16)
      return c10::ScalarType::BFloat16;
    else if constexpr (type == dtype::int8)
      return c10::ScalarType::Char;
    else if constexpr (type == dtype::uint8)
      return c10::ScalarType::Byte;
    else if constexpr (type == dtype::int32 || type == dtype::uint32)
      return c10::ScalarType::Int;
    else
      return c10::ScalarType::Long;
  }

  template <class T>
  at::Tensor wrap(T* data, std::size_t count) const {
    auto const options = at::TensorOptions().dtype(scalar_type<T>()).device(device_);
    return at::from_blob(data, {static_cast<std::int64_t>(count)}, options);
  }

  // Unsigned max and min as signed ones: x ^ sign bit maps unsigned order
  // onto signed order, and is its own inverse.
  template <class T>
  static constexpr bool flip_needed(reduce_op op) {
    return (dtype_of_v<T> == dtype::uint32 || dtype_of_v<T> == dtype::uint64) && op != reduce_op::sum;
  }
  template <class T>
  static void flip(at::Tensor& t, reduce_op op) {
    if constexpr (std::is_same_v<T, std::uint32_t> || std::is_same_v<T, std::uint64_t>) {
      if (op != reduce_op::sum) t.bitwise_xor_(std::numeric_limits<std::make_signed_t<T> >::min());
    }
  }

  // The splits this process has made of the group named `parent`: a split is
  // named with it, since c10d keys a group's rendezvous by its name and two
  // splits of one group (two hook states on it, say) must not meet. Splits
  // are collective, so every rank counts the same.
  static int split_serial(std::string const& parent) {
    static std::mutex mutex;
    static std::map<std::string, int> made;
    std::lock_guard<std::mutex> const lock(mutex);
    return made[parent]++;
  }

  static c10d::ReduceOp op_of(reduce_op op) {
    return op == reduce_op::sum   ? c10d::ReduceOp::SUM
           : op == reduce_op::max ? c10d::ReduceOp::MAX
                                  : c10d::ReduceOp::MIN;
  }

  // A buffer of this communicator's own, grown when a call needs more (the
  // steady state reuses it).
  template <class T>
  T* scratch(std::size_t count) {
    std::size_t const bytes = count * sizeof(T);
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    return reinterpret_cast<T*>(scratch_.data());
  }

#if GRADCOMP_HAS_CUDA
  // split() on a device communicator: the (color, key) pairs through device
  // memory, waited for (a split is not part of a step).
  void all_gather_on_host(std::int64_t const* own, std::int64_t* all) {
    std::int64_t* device = nullptr;
    std::size_t const n = 2 * static_cast<std::size_t>(size_);
    GRADCOMP_CUDA_TRY(cudaMallocAsync(reinterpret_cast<void**>(&device), (n + 2) * sizeof(std::int64_t), stream_));
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(device + n, own, 2 * sizeof(std::int64_t), cudaMemcpyHostToDevice, stream_));
    all_gather(device + n, device, 2);
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(all, device, n * sizeof(std::int64_t), cudaMemcpyDeviceToHost, stream_));
    GRADCOMP_CUDA_TRY(cudaFreeAsync(device, stream_));
    GRADCOMP_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
#else
  void all_gather_on_host(std::int64_t const*, std::int64_t*) {}
#endif

  group_ptr group_;
  std::chrono::milliseconds timeout_;
  bool on_device_ = false;
  c10::Device device_{c10::DeviceType::CPU};
#if GRADCOMP_HAS_CUDA
  cudaStream_t stream_ = nullptr;
#endif
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::byte> scratch_;
};

static_assert(collective<c10d_communicator>);
static_assert(reduce_scattering<c10d_communicator> && splittable<c10d_communicator>);

}  // namespace gradcomp

#endif  // __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
