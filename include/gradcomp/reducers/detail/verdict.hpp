// How a step's verdict reaches the host: at once on host spaces, through
// page-locked memory and an event on the CUDA space (so the host reads it at
// the next call without a copy of its own, and never during the step).
#pragma once

#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/nonfinite.hpp>

#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// The status words the host learns after a step.
struct verdict_words {
  std::uint64_t failed_steps, last_veto, last_local;
};

/// Host spaces: the step's status is host memory, read where it is.
template <class Space>
class verdict_channel {
 public:
  explicit verdict_channel(Space const&) {}
  /// Nothing to bind on the host.
  int bind_device() const { return 0; }
  bool capturing() const { return false; }
  bool pending() const { return false; }
  void publish(std::uint64_t const*) {}
  verdict_words receive() { return {}; }
};

#if GRADCOMP_HAS_CUDA
/// Makes `device` current for a scope, and restores the caller's.
class device_binding {
 public:
  explicit device_binding(int device) {
    GRADCOMP_CUDA_TRY(cudaGetDevice(&previous_));
    if (previous_ == device)
      previous_ = -1;
    else
      GRADCOMP_CUDA_TRY(cudaSetDevice(device));
  }
  device_binding(device_binding const&) = delete;
  device_binding& operator=(device_binding const&) = delete;
  ~device_binding() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

/// The CUDA space: the end of a step copies its verdict words to
/// page-locked memory and records an event; the next call waits on that
/// event (the step is normally long done) and reads them.
template <>
class verdict_channel<cuda_space> {
 public:
  explicit verdict_channel(cuda_space const& space) : space_(space), words_(3) {
    GRADCOMP_CUDA_TRY(cudaGetDevice(&device_));
  }
  /// The device current at construction, current for the call's scope.
  device_binding bind_device() const { return device_binding(device_); }
  /// True while the space's stream is being captured into a CUDA Graph.
  bool capturing() const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    GRADCOMP_CUDA_TRY(cudaStreamIsCapturing(space_.stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }
  /// A verdict is on its way.
  bool pending() const { return pending_; }
  /// Sends the status words of the step just enqueued.
  void publish(std::uint64_t const* status) {
    GRADCOMP_CUDA_TRY(cudaMemcpyAsync(words_.data(), status + failed_steps, 3 * sizeof(std::uint64_t),
                                      cudaMemcpyDeviceToHost, space_.stream));
    GRADCOMP_CUDA_TRY(cudaEventRecord(event_.get(), space_.stream));
    pending_ = true;
  }
  /// The verdict sent last.
  /// @note Waits for the step that sent it.
  verdict_words receive() {
    GRADCOMP_CUDA_TRY(cudaEventSynchronize(event_.get()));
    pending_ = false;
    return {words_.data()[0], words_.data()[1], words_.data()[2]};
  }

 private:
  cuda_space space_;
  int device_ = 0;
  pinned<std::uint64_t> words_;
  cuda_event event_;
  bool pending_ = false;
};
#endif

}  // namespace gradcomp::detail
