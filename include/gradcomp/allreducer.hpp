// The pipeline: one bucket's compressed all-reduce, with its state.
#pragma once

#include <gradcomp/aggregator.hpp>
#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/collective.hpp>
#include <gradcomp/compressor.hpp>
#include <gradcomp/error_feedback.hpp>
#include <gradcomp/execution.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp {

#if GRADCOMP_HAS_CUDA
class nccl_communicator;  // <gradcomp/collectives/nccl.hpp>
/// The collective allreducer uses unless told otherwise: NCCL.
using default_collective = nccl_communicator;
#else
/// Stands in for NCCL where CUDA is absent; naming a collective is required.
struct no_default_collective;
/// The collective allreducer uses unless told otherwise (none without CUDA).
using default_collective = no_default_collective;
#endif

/// The execution space that suits a collective's buffers: the host unless
/// the collective's backend overloads default_space (NCCL: its CUDA stream).
template <class Collective>
host_space default_space(Collective const&) {
  return {};
}

/// The type default_space returns for Collective.
template <class Collective>
using default_space_t = decltype(default_space(std::declval<Collective const&>()));

/// Options of an allreducer that are not the compressor's parameters.
struct allreducer_options {
  /// What a step does with NaN, infinity or out-of-lane values.
  nonfinite_policy nonfinite = nonfinite_policy::raise;
};

namespace detail {
template <class T, class = void>
inline constexpr bool is_complete = false;
template <class T>
inline constexpr bool is_complete<T, std::void_t<decltype(sizeof(T))>> = true;
}  // namespace detail

/// Reduces one bucket of gradients across ranks through a compressor:
/// afterwards every rank holds the mean over ranks of what their payloads
/// decode to, in place.
///
/// Owns the bucket's state: the error-feedback residual, the workspace
/// (sized once here, so steps never allocate), the step counter. Move-only.
/// The collective is borrowed and must outlive the allreducer. Construction
/// is collective: every rank constructs its allreducer together, and ranks
/// whose bucket size or configuration differ all get invalid_argument.
///
/// \tparam Compressor    fp32, cast<bfloat16>, ... (gradcomp::compressor).
/// \tparam ErrorFeedback error_feedback::none or error_feedback::residual.
/// \tparam Collective    nccl_communicator (default), mpi_communicator,
///                       local_group::communicator, or a user's backend.
/// \tparam Aggregator    all-reduce for summable payloads (default), or
///                       all-gather.
/// \tparam Space         host_space, or cuda_space (the default for NCCL).
template <class Compressor, class ErrorFeedback, class Collective = default_collective,
          class Aggregator = default_aggregator_t<Compressor>, class Space = default_space_t<Collective>>
class allreducer {
  static_assert(detail::is_complete<Collective>,
                "allreducer's default collective is NCCL: include <gradcomp/collectives/nccl.hpp> and link "
                "gradcomp::nccl, or name a collective, e.g. allreducer<C, EF, local_group::communicator>");
  static_assert(compressor<Compressor>, "the first template argument must satisfy gradcomp::compressor");
  static_assert(error_feedback::policy<ErrorFeedback>,
                "the second template argument must be an error-feedback policy (error_feedback::none or "
                "error_feedback::residual)");
  static_assert(collective<Collective>, "the third template argument must satisfy gradcomp::collective");
  static_assert(execution_space<Space>, "the last template argument must be an execution space");
  static_assert(can_aggregate<Compressor, Aggregator>,
                "this compressor's payload cannot be summed element by element, so all-reduce cannot combine it: "
                "use gradcomp::allgather_aggregator");

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// Sets up the bucket described by `layout` for this rank of `collective`,
  /// in the collective's default space.
  allreducer(Compressor compressor, Collective& collective, bucket_layout layout, allreducer_options options = {})
      : allreducer(std::move(compressor), collective, std::move(layout), default_space(collective), options) {}

  /// The same, running in `space`.
  allreducer(Compressor compressor, Collective& collective, bucket_layout layout, Space space,
             allreducer_options options = {})
      : compressor_(std::move(compressor)),
        collective_(&collective),
        layout_(std::move(layout)),
        space_(space),
        options_(options),
        ef_(space_, layout_.size()) {
    GRADCOMP_EXPECTS(collective.accepts(memory_kind_of<memory>),
                     std::string("allreducer: this collective does not accept ") + memory::name +
                         " memory (an MPI communicator must be declared CUDA-aware for device buffers)");
    if constexpr (requires {
                    collective.stream();
                    space.stream;
                  })
      GRADCOMP_EXPECTS(collective.stream() == space.stream,
                       "allreducer: the execution space's CUDA stream differs from the collective's; kernels and "
                       "collectives must be ordered on one stream");
    compressor_.validate(layout_, collective.size());
    check_ranks_agree();
    workspace_carver<memory> measure;
    compressor_.template carve<Aggregator>(measure, layout_, collective.size());
    workspace_ = buffer<std::byte, Space>(measure.bytes(), space_);
  }

  /// Reduces `gradient` (layout().size() values) in place: on return (on
  /// the CUDA space, once the stream reaches this point) it holds the
  /// rank-mean of the decompressed payloads.
  void operator()(span<float, memory> gradient) {
    GRADCOMP_EXPECTS(gradient.size() == layout_.size(),
                     "allreducer: the gradient has " + std::to_string(gradient.size()) +
                         " elements but the bucket was set up for " + std::to_string(layout_.size()));
    if (gradient.size() != 0) {
      context ctx(space_, *collective_, ef_.view(), layout_, workspace_.view(), step_, options_.nonfinite);
      compressor_.step(ctx, gradient);
      wire_bytes_ = ctx.wire_bytes();
      ef_.commit();
    }
    ++step_;
    if constexpr (requires { collective_->check_async(); }) collective_->check_async();
  }

  /// Bytes the last step put on the wire (see step_context::wire_bytes).
  std::size_t wire_bytes() const { return wire_bytes_; }
  /// Steps completed.
  std::uint64_t steps() const { return step_; }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return compressor_; }
  /// The execution space.
  Space const& space() const { return space_; }
  /// The compressor's workspace: carve it as the compressor does to inspect
  /// what a step left there (state kept across steps, such as PowerSGD's Q or
  /// IntSGD's running norm, or the last step's codes).
  span<std::byte, memory> workspace() const { return workspace_.view(); }
  /// The error-feedback residual carried to the next step.
  auto residual() const requires ErrorFeedback::enabled { return ef_.current(); }
  /// Zeroes the error-feedback state.
  void reset_error_feedback() { ef_.reset(); }

 private:
  using context = step_context<Space, Collective, Aggregator, typename ErrorFeedback::ref>;

  // Every rank gathers every rank's (bucket size, configuration hash) and
  // reaches the same verdict, so all ranks throw together or none does.
  void check_ranks_agree() {
    std::uint64_t fingerprint = detail::hash_combine(compressor_.fingerprint(), layout_.fingerprint());
    fingerprint = detail::hash(ErrorFeedback::name, fingerprint);
    fingerprint = detail::hash(Aggregator::name, fingerprint);
    fingerprint = detail::hash_combine(fingerprint, static_cast<std::uint64_t>(options_.nonfinite));
    std::uint64_t const mine[2] = {layout_.size(), fingerprint};

    int const n = collective_->size();
    std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(n));
    buffer<std::uint64_t, Space> exchange(2 + all.size(), space_);
    space_.from_host(exchange.data(), mine, sizeof mine);
    collective_->all_gather(exchange.data(), exchange.data() + 2, 2);
    space_.to_host(all.data(), exchange.data() + 2, all.size() * sizeof(std::uint64_t));

    for (std::size_t r = 1; r < all.size() / 2; ++r) {
      GRADCOMP_EXPECTS(all[2 * r] == all[0], "allreducer: ranks disagree on the bucket size: rank 0 has " +
                                                 std::to_string(all[0]) + " elements, rank " + std::to_string(r) +
                                                 " has " + std::to_string(all[2 * r]));
      GRADCOMP_EXPECTS(all[2 * r + 1] == all[1],
                       "allreducer: rank " + std::to_string(r) +
                           "'s configuration differs from rank 0's (compressor parameters, tensor shapes, error "
                           "feedback, aggregator or non-finite policy)");
    }
  }

  Compressor compressor_;
  Collective* collective_;
  bucket_layout layout_;
  Space space_;
  allreducer_options options_;
  typename ErrorFeedback::template state<Space> ef_;
  buffer<std::byte, Space> workspace_;
  std::uint64_t step_ = 0;
  std::size_t wire_bytes_ = 0;
};

}  // namespace gradcomp
