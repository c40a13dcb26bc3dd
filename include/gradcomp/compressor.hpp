// The compressor concept, and the step context a compressor's step runs in.
//
// A compressor turns each rank's gradient into the rank-mean of what the
// ranks' payloads decode to, in place. It may take several communication
// rounds (TopK-Chunked: scores, then values; THC: scale, then levels;
// PowerSGD: P, then Q); each round is a collective call on the step context,
// between element loops. On the CUDA space every call is enqueued on one
// stream, so a step is straight-line code that never waits for the device
// (except to honour nonfinite_policy::raise, see allreducer).
#pragma once

#include <gradcomp/aggregator.hpp>
#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/collective.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradcomp {

/// What a step does when some rank's g + e is NaN, infinite, or too large
/// for the compressor's wire lane.
enum class nonfinite_policy {
  /// Every rank throws gradcomp::nonfinite_error from the same step; the
  /// gradient and the error-feedback state are left as they were. Costs one
  /// 8-byte all-reduce per step, and on CUDA one wait for the device.
  raise,
  /// No check, no wait: bad values reach every rank's output (as with a
  /// plain all-reduce, so a loss scaler can see them and skip the step),
  /// while the residual of those elements keeps its previous value.
  propagate,
};

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
  template <class T>
  span<T, Memory> take(std::size_t count) {
    offset_ = (offset_ + alignment - 1) / alignment * alignment;
    T* p = workspace_.data() == nullptr ? nullptr : reinterpret_cast<T*>(workspace_.data() + offset_);
    offset_ += count * sizeof(T);
    if (workspace_.data() != nullptr && offset_ > workspace_.size())
      throw error("workspace_carver: the workspace is smaller than the compressor asked for");
    return {p, count};
  }
  /// Bytes taken so far.
  std::size_t bytes() const { return offset_; }

 private:
  span<std::byte, Memory> workspace_;
  std::size_t offset_ = 0;
};

/// Everything one step of a compressor sees: where to run, whom to talk to,
/// the error-feedback view, the bucket and its workspace. Collective calls
/// go through it so it can count the bytes each step puts on the wire.
template <class Space, class Collective, class Aggregator, class ErrorFeedbackRef>
class step_context {
 public:
  using space_type = Space;                     ///< The execution space.
  using memory = typename Space::memory;        ///< Where buffers live.
  using aggregator = Aggregator;                ///< How payloads combine.
  using error_feedback_ref = ErrorFeedbackRef;  ///< The residual's kernel view.

  /// Assembled by the allreducer for each step.
  step_context(Space const& space, Collective& collective, ErrorFeedbackRef ef, bucket_layout const& layout,
               span<std::byte, memory> workspace, std::uint64_t step, nonfinite_policy policy)
      : space_(space),
        collective_(collective),
        ef_(ef),
        layout_(layout),
        workspace_(workspace),
        step_(step),
        policy_(policy) {}

  /// The execution space.
  Space const& space() const { return space_; }
  /// This rank.
  int rank() const { return collective_.rank(); }
  /// Number of ranks.
  int ranks() const { return collective_.size(); }
  /// Steps completed before this one (seeds per-step randomness).
  std::uint64_t step() const { return step_; }
  /// The error-feedback view for kernels.
  ErrorFeedbackRef const& error_feedback() const { return ef_; }
  /// The bucket being reduced.
  bucket_layout const& layout() const { return layout_; }
  /// A carver over the workspace sized for this compressor.
  workspace_carver<memory> carver() const { return workspace_carver<memory>(workspace_); }
  /// Bytes this step has put on the wire so far (all-reduce: message size;
  /// all-gather: gathered size, which grows with the number of ranks).
  std::size_t wire_bytes() const { return wire_bytes_; }

  /// data <- op over ranks of data.
  template <class T>
  void all_reduce(span<T, memory> data, reduce_op op) {
    collective_.all_reduce(data.data(), data.data(), data.size(), op);
    wire_bytes_ += data.size_bytes();
  }

  /// recv <- every rank's send, rank by rank.
  template <class T>
  void all_gather(span<T const, memory> send, span<T, memory> recv) {
    GRADCOMP_EXPECTS(recv.size() == send.size() * ranks(), "all_gather: receive buffer must hold ranks x send");
    collective_.all_gather(send.data(), recv.data(), send.size());
    wire_bytes_ += recv.size_bytes();
  }

  /// payload <- sum over ranks of payload, by this step's aggregator.
  template <class T>
  void aggregate(span<T, memory> payload, span<std::byte, memory> scratch) {
    Aggregator::sum(*this, payload, scratch);
  }

  /// Ranks agree whether any of them saw bad values. `counters` (two
  /// uint64 in the workspace) holds this rank's count of bad elements in
  /// [0]; under nonfinite_policy::raise the sum over ranks goes to [1] and,
  /// if it is not zero, every rank throws nonfinite_error naming `what`
  /// (what made a value bad). Nothing is committed by then.
  void agree_all_finite(std::uint64_t* counters, std::string_view what) {
    if (policy_ != nonfinite_policy::raise) return;
    collective_.all_reduce(counters, counters + 1, 1, reduce_op::sum);
    wire_bytes_ += sizeof(std::uint64_t);
    std::uint64_t host[2];
    space_.to_host(host, counters, sizeof host);
    if (host[1] == 0) return;
    throw nonfinite_error(std::to_string(host[1]) + " value(s) of g + e across the ranks (" + std::to_string(host[0]) +
                          " on rank " + std::to_string(rank()) + ") were " + std::string(what) +
                          "; every rank skipped this step and kept its error-feedback state");
  }

 private:
  Space space_;
  Collective& collective_;
  ErrorFeedbackRef ef_;
  bucket_layout const& layout_;
  span<std::byte, memory> workspace_;
  std::uint64_t step_;
  nonfinite_policy policy_;
  std::size_t wire_bytes_ = 0;
};

/// A compressor: a copyable value holding its parameters, which
/// - names itself (`name`) and says whether its payload is summable;
/// - validate(layout, ranks) throws invalid_argument for a configuration
///   that cannot work on that bucket (k larger than the bucket, say);
/// - fingerprint() hashes its parameters, so ranks can check they agree;
/// - carve<Aggregator>(carver, layout, ranks) takes its workspace pieces
///   (called once to measure, then each step to carve);
/// - wire_bytes<Aggregator>(layout, ranks) predicts what a step puts on the
///   wire, counted as step_context counts it;
/// - step(ctx, gradient) turns gradient into the rank-mean of the decoded
///   payloads, writing every element's next residual through
///   ctx.error_feedback().
template <class C>
concept compressor = std::copyable<C> &&
    requires(C const& c, bucket_layout const& layout, int ranks, workspace_carver<host_memory>& carver) {
  { C::name } -> std::convertible_to<std::string_view>;
  { C::summable_payload } -> std::convertible_to<bool>;
  c.validate(layout, ranks);
  { c.fingerprint() } -> std::same_as<std::uint64_t>;
  c.template carve<allreduce_aggregator>(carver, layout, ranks);
  { c.template wire_bytes<allreduce_aggregator>(layout, ranks) } -> std::same_as<std::size_t>;
};

namespace detail {

/// Bytes a payload of `bytes` costs on the wire under aggregator A.
template <class A>
constexpr std::size_t aggregated_wire_bytes(std::size_t bytes, int ranks) {
  return A::requires_summable_payload ? bytes : bytes * static_cast<std::size_t>(ranks);
}

}  // namespace detail
}  // namespace gradcomp
