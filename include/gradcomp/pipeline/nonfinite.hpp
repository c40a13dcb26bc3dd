// The non-finite protocol, written once for every compressor.
//
// A step's passes count this rank's bad values (NaN, infinity, or a value
// its wire lane cannot carry) into a status word; one 8-byte all-reduce
// (the agreement) sums them over the ranks into the step's veto, which is
// then the same on every rank. On a host space a compressor whose payload
// sums element by element (the casts) carries the agreement in that
// payload's all-reduce instead, as two more elements: one round trip fewer
// (step_context::agree_and_aggregate). The passes that write the output
// and the state kept across steps are gated on the veto, and the step's
// commit (the error-feedback side flip) happens only when it is zero. All
// of this stays where the data is: on a GPU nothing waits for the host.
//
// The host space raises at once, from the step itself. The CUDA space
// copies the verdict to page-locked memory at the end of the step and
// raises at the next call (or at synchronize()): every rank from the same
// call, with the gradient and all state as they were before the bad step.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradcomp::inline GRADCOMP_ABI {

/// What a step does when some rank's g + e is NaN, infinite, or too large
/// for the compressor's wire lane. Either way every rank takes the same
/// decision, and a bad step commits nothing: the error-feedback residual and
/// the compressor's state (PowerSGD's Q, IntSGD's running norm) stay as they
/// were. Either way costs an 8-byte all-reduce per step (or two elements of
/// the payload: see above), and no wait.
enum class nonfinite_policy {
  /// Every rank throws gradcomp::nonfinite_error and the gradient is left as
  /// it was: on the host from that call, on the CUDA space from the next
  /// call or synchronize() (the bad step's output pass never ran).
  raise,
  /// No exception: every rank's output for the bucket is NaN (so a loss
  /// scaler sees it and skips the step) and the state is left as it was.
  propagate,
};

/// Elements a payload holds after the bucket's when it carries the step's
/// agreement (step_context::agree_and_aggregate).
inline constexpr std::size_t agreement_lanes = 2;

namespace detail {

/// The words of a step's status, in the space's memory.
enum status_word : std::size_t {
  local_bad = 0,     ///< This rank's bad values this step.
  veto = 1,          ///< All ranks' bad values after the agreement, plus fault_bit: non-zero stops the commit.
  failed_steps = 2,  ///< Steps that committed nothing since the host last looked (kept across steps).
  last_veto = 3,     ///< The veto of the latest failed step.
  last_local = 4,    ///< This rank's count in the latest failed step.
  status_words = 5,
};

/// Set in the veto when ranks found each other inconsistent (a compressor's
/// own check, e.g. TopK-Chunked's verify_selection): a collective_error.
inline constexpr std::uint64_t fault_bit = std::uint64_t{1} << 63;

/// What a rank that refuses a step (its gradient has the wrong length) adds
/// to the agreement in place of a count: every rank then fails the step
/// instead of waiting for it (bad-value counts stay far below this).
inline constexpr std::uint64_t refusal = std::uint64_t{1} << 48;

/// Set in a veto that counts the ranks that found bad values rather than the
/// values (an agreement carried in a 16-bit payload cannot sum counts
/// exactly; the values are counted on each rank).
inline constexpr std::uint64_t ranks_counted = std::uint64_t{1} << 47;

/// True when a veto says the ranks were inconsistent rather than that some
/// values were bad.
GRADCOMP_HOST_DEVICE bool is_fault(std::uint64_t veto_word) { return veto_word >= refusal; }

/// The end of a step: flip the error-feedback side if nobody vetoed, else
/// record the failure. One thread.
struct commit_step {
  std::uint64_t* status;
  std::uint32_t* side;  // null without error feedback
  GRADCOMP_HOST_DEVICE void operator()(std::size_t) const {
    if (status[veto] == 0) {
      if (side != nullptr) *side ^= 1u;
    } else {
      status[failed_steps] += 1;
      status[last_veto] = status[veto];
      status[last_local] = status[local_bad];
    }
  }
};

/// The exception for a failed step, from its status words.
inline void throw_step_failure(std::uint64_t veto_word, std::uint64_t local, int rank, char const* what) {
  if ((veto_word & fault_bit) != 0)
    throw collective_error(std::string(what != nullptr ? what : "the ranks disagreed") +
                           "; every rank skipped the step and kept its state");
  if (is_fault(veto_word))
    throw collective_error(std::to_string(veto_word / refusal) +
                           " rank(s) refused this step (a gradient of the wrong length); every rank skipped it and "
                           "kept its state");
  std::string const total = (veto_word & ranks_counted) != 0
                                ? "value(s) of g + e on " + std::to_string(veto_word & ~ranks_counted) + " rank(s) ("
                                : std::to_string(veto_word) + " value(s) of g + e across the ranks (";
  throw nonfinite_error(total + std::to_string(local) + " on rank " + std::to_string(rank) + ") were " +
                        (what != nullptr ? what : "NaN or infinite") +
                        "; every rank skipped this step and kept its gradient and error-feedback state");
}

}  // namespace detail
}  // namespace gradcomp
