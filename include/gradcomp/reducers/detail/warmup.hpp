// The warm-up in front of a bucket's compressor: its first steps send the
// plain fp32 mean (PyTorch's start_powerSGD_iter, for every compressor).
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/compressors/cast/cast.hpp>
#include <gradcomp/detail/checked.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/workspace.hpp>
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/pipeline/error_feedback.hpp>
#include <gradcomp/pipeline/step_context.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// What a step leaves for the reducer to report.
struct step_report {
  std::size_t wire_bytes = 0;  ///< Bytes it put on the wire.
  char const* what = nullptr;  ///< What its last agreement was about.
};

/// The warm-up stage of a bucket (allreducer_options::warmup_steps): while
/// fewer than `steps` steps are committed, a step is the fp32 mean, with no
/// error feedback, and the compressor's kept state and residual stay zero;
/// afterwards the compressor counts its own steps from 0. Its workspace lies
/// after the compressor's kept state, so a checkpoint taken during warm-up
/// holds the compressor's zero state.
template <class Space>
class warmup {
 public:
  using memory = typename Space::memory;

  explicit warmup(std::uint64_t steps) : steps_(steps) {}

  /// The workspace bytes the bucket needs: `compressor_bytes` (its kept state
  /// first, `state_bytes` of it) and, with warm-up, the fp32 mean's pieces
  /// after that state.
  std::size_t workspace_bytes(bucket_layout const& layout, int ranks, std::size_t compressor_bytes,
                              std::size_t state_bytes) {
    if (steps_ == 0) return compressor_bytes;
    workspace_carver<memory> measure;
    fp32_.template carve<allreduce_aggregator>(measure, layout, ranks);
    offset_ = checked_round_up(state_bytes, workspace_carver<memory>::alignment, "workspace");
    return std::max(compressor_bytes, checked_add(offset_, measure.bytes(), "workspace"));
  }

  /// True while the step after `committed` committed steps is a warm-up step.
  bool active(std::uint64_t committed) const { return committed < steps_; }
  /// The compressor's own count of the steps before this one.
  std::uint64_t compressor_step(std::uint64_t committed) const { return committed - steps_; }
  /// The number of warm-up steps.
  std::uint64_t steps() const { return steps_; }

  /// One warm-up step. `frame` is the bucket's step frame with no error
  /// feedback and no resources (step_context<Space, C, allreduce_aggregator,
  /// error_feedback::none::ref, no_resources>::parts) and the whole bucket's
  /// workspace, of which this takes its part.
  template <class Frame, class Gradient>
  step_report step(Frame frame, span<Gradient, memory> gradient) {
    context_of<Frame> ctx(own_part(frame));
    fp32_.step(ctx, gradient);
    return {ctx.wire_bytes(), ctx.what()};
  }

  /// A warm-up step this rank refuses (step_context::refuse).
  template <class Frame>
  void refuse(Frame frame) {
    context_of<Frame> ctx(own_part(frame));
    ctx.refuse(fp32_);
  }

 private:
  template <class Frame>
  using context_of = step_context<Space, std::remove_reference_t<decltype(std::declval<Frame&>().collective)>,
                                  allreduce_aggregator, error_feedback::none::ref, no_resources>;

  // The frame narrowed to the warm-up's part of the workspace.
  template <class Frame>
  Frame own_part(Frame frame) const {
    frame.workspace = frame.workspace.subspan(offset_, frame.workspace.size() - offset_);
    return frame;
  }

  std::uint64_t steps_;
  std::size_t offset_ = 0;  // where its workspace starts
  fp32 fp32_{};
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
