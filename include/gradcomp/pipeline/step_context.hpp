// The step context: everything one step of a compressor sees.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/workspace.hpp>
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/pipeline/nonfinite.hpp>
#include <gradcomp/random.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Which part of the mean a step delivers.
enum class step_output {
  whole_bucket,  ///< An all-reduce step: every rank needs every element.
  own_block,     ///< A reduce-scatter step: rank r needs block r of ranks equal blocks of the bucket.
};

/// A run of a bucket's elements: [first, first + count).
struct element_range {
  std::size_t first = 0;  ///< The first element.
  std::size_t count = 0;  ///< How many.
};

/// A compressor whose step's first collective carries the agreement
/// (step_context::agree_and_aggregate): it declares
/// `static constexpr bool carries_agreement = true`.
template <class C>
concept agreement_carrier = C::carries_agreement;

/// Everything one step of a compressor sees: where to run, whom to talk to,
/// the error-feedback view, the bucket, its workspace and resources, the
/// step's status words and its random streams. Collective calls go through
/// it so it can count the bytes each step puts on the wire. The allreducer
/// builds one per step, on the stack; nothing in it allocates.
template <class Space, class Collective, class Aggregator, class ErrorFeedbackRef, class Resources>
class step_context {
 public:
  using space_type = Space;                     ///< The execution space.
  using memory = typename Space::memory;        ///< Where buffers live.
  using aggregator = Aggregator;                ///< How payloads combine.
  using error_feedback_ref = ErrorFeedbackRef;  ///< The residual's view.
  using resources_type = Resources;             ///< The compressor's per-space resources.

  /// What the allreducer hands a step.
  struct parts {
    Space space;                        ///< Where to run.
    Collective& collective;             ///< Whom to talk to.
    ErrorFeedbackRef error_feedback;    ///< The residual.
    bucket_layout const& layout;        ///< The bucket.
    span<std::byte, memory> workspace;  ///< The compressor's workspace.
    std::uint64_t* status;              ///< The step's status words (pipeline/nonfinite.hpp).
    Resources& resources;               ///< The compressor's resources.
    std::uint64_t step;                 ///< Steps committed before this one.
    std::uint64_t bucket_seed;          ///< Seeds random streams whose compressor set no seed.
    nonfinite_policy policy;            ///< What bad values do.
    /// Which part of the mean this step must deliver (see step_output).
    step_output output = step_output::whole_bucket;
  };

  /// Assembled by the allreducer for each step.
  explicit step_context(parts const& p) : p_(p) {}
  step_context(step_context const&) = delete;
  step_context& operator=(step_context const&) = delete;

  /// The execution space.
  Space const& space() const { return p_.space; }
  /// This rank.
  int rank() const { return p_.collective.rank(); }
  /// Number of ranks.
  int ranks() const { return p_.collective.size(); }
  /// Steps committed before this one (a step that any rank vetoed does not
  /// count): seeds per-step randomness and warm-up schedules.
  std::uint64_t step() const { return p_.step; }
  /// The error-feedback view.
  ErrorFeedbackRef const& error_feedback() const { return p_.error_feedback; }
  /// The bucket being reduced.
  bucket_layout const& layout() const { return p_.layout; }
  /// A carver over the workspace sized for this compressor.
  workspace_carver<memory> carver() const { return workspace_carver<memory>(p_.workspace); }
  /// The compressor's workspace pieces, carved as its carve() takes them.
  template <class Compressor>
  auto carve(Compressor const& c) const {
    auto w = carver();
    return c.template carve<Aggregator>(w, layout(), ranks());
  }
  /// The compressor's resources for this space (see resources_t).
  Resources& resources() const { return p_.resources; }
  /// Bytes this step has put on the wire so far (all-reduce: message size;
  /// reduce-scatter: half of it, as a ring all-reduce is a reduce-scatter and
  /// an all-gather; all-gather: gathered size, which grows with the number of
  /// ranks).
  std::size_t wire_bytes() const { return wire_bytes_; }

  /// The elements whose mean this step must deliver: the whole bucket, or on
  /// a reduce-scatter step this rank's block. A compressor may leave the
  /// gradient's other elements as anything (finite or not).
  element_range output_range() const {
    if (p_.output == step_output::whole_bucket) return {0, p_.layout.size()};
    std::size_t const block = p_.layout.size() / static_cast<std::size_t>(ranks());
    return {block * static_cast<std::size_t>(rank()), block};
  }

  /// data <- op over ranks of data.
  template <class T>
  void all_reduce(span<T, memory> data, reduce_op op) {
    p_.collective.all_reduce(data.data(), data.data(), data.size(), op);
    wire_bytes_ += data.size_bytes();
  }

  /// recv <- every rank's send, rank by rank.
  template <class T>
  void all_gather(span<T const, memory> send, span<T, memory> recv) {
    GRADCOMP_EXPECTS(recv.size() == send.size() * static_cast<std::size_t>(ranks()),
                     "all_gather: receive buffer must hold ranks x send");
    p_.collective.all_gather(send.data(), recv.data(), send.size());
    wire_bytes_ += recv.size_bytes();
  }

  /// payload <- sum over ranks of payload, by this step's aggregator.
  template <class T>
  void aggregate(span<T, memory> payload, span<std::byte, memory> scratch) {
    Aggregator::sum(*this, payload, scratch);
  }

  /// payload <- its sum over ranks, for a payload aligned with the bucket
  /// (payload[i] is element i's, over the whole bucket). On a reduce-scatter
  /// step only output_range() of it is summed, by one reduce-scatter (half an
  /// all-reduce's bytes, counted as such); the rest is left as anything.
  template <class T>
  void aggregate_elementwise(span<T, memory> payload, span<std::byte, memory> scratch) {
    if constexpr (std::is_same_v<Aggregator, allreduce_aggregator> && reduce_scattering<Collective>) {
      if (p_.output == step_output::own_block) {
        element_range const out = output_range();
        GRADCOMP_EXPECTS(payload.size() == out.count * static_cast<std::size_t>(ranks()),
                         "aggregate_elementwise: a reduce-scatter step needs a payload of one element per element of "
                         "the bucket");
        p_.collective.reduce_scatter(payload.data(), payload.data() + out.first, out.count, reduce_op::sum);
        wire_bytes_ += payload.size_bytes() / 2;
        return;
      }
    }
    aggregate(payload, scratch);
  }

  /// @name The non-finite protocol (pipeline/nonfinite.hpp)
  /// @{

  /// Where this step's passes count this rank's bad values (transform's and
  /// segmented_reduce's `count`).
  std::uint64_t* bad_count() const { return p_.status + detail::local_bad; }

  /// The agreement: every rank learns how many values all ranks found bad
  /// (`what` says what made them bad, for the message: a string literal).
  /// Call it after every pass that counts and before any pass that writes
  /// the output or kept state. On the host, under nonfinite_policy::raise,
  /// every rank throws nonfinite_error from here; elsewhere the verdict
  /// stays in memory and gates what follows.
  void agree_all_finite(char const* what) {
    what_ = what;
    detail::agree_sum(p_.collective, p_.status + detail::local_bad, p_.status + detail::veto);
    wire_bytes_ += sizeof(std::uint64_t);
    raise_on_veto();
  }

  /// Whether this step's agreement rides in its payload (agree_and_aggregate):
  /// on a host space, where each collective is a round trip of its own that
  /// costs as much as a small bucket's payload (on a device the agreement is
  /// one more small kernel on the stream); when the step all-reduces the
  /// whole bucket over a group whose all-reduce is the whole world's (a rail
  /// of a hierarchy agrees over the world instead).
  bool agreement_in_payload() const {
    if constexpr (std::is_same_v<memory, host_memory> && std::is_same_v<Aggregator, allreduce_aggregator> &&
                  !requires(std::uint64_t * w) { p_.collective.agree(w, w); })
      return p_.output == step_output::whole_bucket;
    else
      return false;
  }

  /// agree_all_finite(what), then aggregate_elementwise() of the payload's
  /// first layout().size() elements, in one all-reduce where
  /// agreement_in_payload(): the payload's last agreement_lanes elements
  /// then carry whether this rank found bad values and whether it refuses
  /// the step, summed with it (a 16-bit lane cannot sum counts exactly, so
  /// the veto then counts ranks, marked detail::ranks_counted). Only a
  /// compressor that declares `carries_agreement` calls this, so that a
  /// rank refusing the step takes part in the same all-reduce (refuse()).
  template <class Compressor, class T>
  void agree_and_aggregate(Compressor const&, span<T, memory> payload, span<std::byte, memory> scratch,
                           char const* what) {
    static_assert(agreement_carrier<Compressor>, "agree_and_aggregate: the compressor must declare carries_agreement");
    GRADCOMP_EXPECTS(payload.size() == p_.layout.size() + agreement_lanes,
                     "agree_and_aggregate: the payload holds the bucket's elements and agreement_lanes more");
    if (!agreement_in_payload()) {
      agree_all_finite(what);
      aggregate_elementwise(payload.subspan(0, p_.layout.size()), scratch);
      return;
    }
    what_ = what;
    aggregate_with_agreement(payload);
    raise_on_veto();
  }

  /// A step this rank refuses (its gradient is unusable): takes part in the
  /// step's first collective, the agreement, with a veto that makes every
  /// rank fail the step instead of waiting for it. `c` is the compressor the
  /// step would have run.
  template <class Compressor>
  void refuse(Compressor const& c) {
    std::uint64_t const words[2] = {detail::refusal, 0};
    p_.space.from_host(p_.status, words, sizeof words);
    if constexpr (agreement_carrier<Compressor>)
      if (agreement_in_payload()) return aggregate_with_agreement(carve(c).payload);
    detail::agree_sum(p_.collective, p_.status + detail::local_bad, p_.status + detail::veto);
  }

  /// The gate of a pass that writes the step's output: closed when the step
  /// was vetoed (raise: the gradient stays as it was), poisoned under
  /// nonfinite_policy::propagate (the output becomes NaN).
  gate output_gate() const { return {p_.status + detail::veto, p_.policy == nonfinite_policy::propagate}; }

  /// The gate of a pass that writes state kept across steps: closed when the
  /// step was vetoed.
  gate state_gate() const { return {p_.status + detail::veto, false}; }

  /// The veto word, for a compressor's own consistency check: a kernel that
  /// finds the ranks inconsistent ORs detail::fault_bit into it (the step
  /// then commits nothing and every rank gets collective_error naming
  /// `what`). Call fault_checked(what) after that kernel.
  std::uint64_t* veto_word() const { return p_.status + detail::veto; }

  /// After a consistency check: on the host, throws collective_error at once
  /// if it set the fault bit.
  void fault_checked(char const* what) {
    what_ = what;
    if constexpr (std::is_same_v<memory, host_memory>)
      if (detail::is_fault(p_.status[detail::veto]))
        detail::throw_step_failure(p_.status[detail::veto], 0, rank(), what_);
  }

  /// What the last agreement or check was about (a string literal).
  char const* what() const { return what_; }
  /// @}

  /// The random numbers of this step for `purpose`, on `lane` (a rank for
  /// private noise, random_stream::shared for numbers every rank draws
  /// alike), seeded by `seed` or, if the compressor set none, by the bucket's
  /// identity: two buckets never draw the same numbers by default.
  random_stream random(std::optional<std::uint64_t> seed, random_purpose purpose, std::uint32_t lane) const {
    return random_stream::derive(seed.value_or(p_.bucket_seed), purpose, p_.step, lane);
  }
  /// This rank's lane of private noise.
  std::uint32_t own_lane() const { return static_cast<std::uint32_t>(rank()); }

 private:
  // After an agreement: on the host, every rank throws from it under
  // nonfinite_policy::raise, or when the ranks were inconsistent.
  void raise_on_veto() const {
    if constexpr (std::is_same_v<memory, host_memory>)
      if ((p_.policy == nonfinite_policy::raise && p_.status[detail::veto] != 0) ||
          detail::is_fault(p_.status[detail::veto]))
        detail::throw_step_failure(p_.status[detail::veto], p_.status[detail::local_bad], rank(), what_);
  }

  // The all-reduce of agree_and_aggregate where the agreement rides in the
  // payload (host memory): this rank's marks in, every rank's veto out.
  template <class T>
  void aggregate_with_agreement(span<T, memory> payload) {
    if constexpr (std::is_same_v<memory, host_memory>) {
      std::uint64_t const local = p_.status[detail::local_bad];
      T* const lanes = payload.data() + p_.layout.size();
      lanes[0] = T(local != 0 && local < detail::refusal ? 1.0f : 0.0f);
      lanes[1] = T(local >= detail::refusal ? 1.0f : 0.0f);
      all_reduce(payload, reduce_op::sum);
      // Sums of ones never round to zero, so every rank's mark is seen.
      auto const marked = [](T v) { return static_cast<std::uint64_t>(static_cast<float>(v)); };
      std::uint64_t const refusing = marked(lanes[1]), bad = marked(lanes[0]);
      p_.status[detail::veto] = refusing != 0 ? refusing * detail::refusal : bad != 0 ? detail::ranks_counted | bad : 0;
    }
  }

  parts p_;
  std::size_t wire_bytes_ = 0;
  char const* what_ = nullptr;
};

}  // namespace gradcomp
