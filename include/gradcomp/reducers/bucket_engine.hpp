// The bucket engine: the state one bucket's reduction owns, and its steps.
// allreducer is the engine with whole-bucket steps; reduce_scatterer and the
// two-level reducers compose it with own-block or rail steps.
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/pipeline/error_feedback.hpp>
#include <gradcomp/pipeline/nonfinite.hpp>
#include <gradcomp/pipeline/step_context.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/detail/checkpoint.hpp>
#include <gradcomp/reducers/detail/verdict.hpp>
#include <gradcomp/reducers/detail/warmup.hpp>
#include <gradcomp/reducers/options.hpp>

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// One bucket's reduction through a compressor, and the state it owns: the
/// error-feedback residual, the workspace and the compressor's resources (all
/// sized once at construction: steps never allocate), the step's status
/// words and the verdict on its way to the host, the count of committed
/// steps, the warm-up in front of the compressor, and the checkpoints of all
/// that. Each step delivers `output` of the mean: the whole bucket (an
/// all-reduce), or this rank's block of ranks equal blocks (a reduce-scatter,
/// whose bucket is then a whole number of blocks).
///
/// Move-only. The collective is borrowed and must outlive the engine.
/// Construction is collective: every rank constructs its engine together, and
/// if any rank cannot use the configuration (bad parameters, a size that
/// overflows, no memory) or the ranks' buckets or configurations differ,
/// every rank throws invalid_argument naming the first rank at fault.
///
/// Template parameters as allreducer's (which is this engine, named for
/// users).
template <class Compressor, class ErrorFeedback, class Collective, class Aggregator, class Space>
class bucket_engine {
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
  /// running in `space`, each step delivering `output` of the mean; `who`
  /// names the reducer in its errors ("allreducer", "reduce_scatterer", ...).
  /// @note Waits for the space: construction exchanges the configuration.
  bucket_engine(Compressor compressor, Collective& collective, bucket_layout layout, Space space,
                allreducer_options options, step_output output, char const* who)
      : who_(who),
        compressor_(std::move(compressor)),
        collective_(&collective),
        layout_(std::move(layout)),
        space_(space),
        options_(options),
        output_(output),
        bucket_seed_(options.seed.value_or(detail::mix64(layout_.fingerprint() ^ detail::mix64(options.bucket + 1)))),
        status_(detail::status_words, space_),
        channel_(space_),
        warmup_(options.warmup_steps) {
    GRADCOMP_EXPECTS(collective.accepts(memory_kind_of<memory>),
                     std::string(who_) + ": this collective does not accept " + memory::name +
                         " memory (an MPI communicator must be declared CUDA-aware for device buffers)");
    if constexpr (requires {
                    collective.stream();
                    space.stream;
                  })
      GRADCOMP_EXPECTS(collective.stream() == space.stream,
                       std::string(who_) +
                           ": the execution space's CUDA stream differs from the collective's; kernels and "
                           "collectives must be ordered on one stream");
    std::string failure;
    try {
      int const n = collective.size();
      compressor_.validate(layout_, n);
      if constexpr (ErrorFeedback::enabled) detail::expect_contraction(compressor_, layout_);
      workspace_carver<memory> measure;
      compressor_.template carve<Aggregator>(measure, layout_, n);
      state_bytes_ = detail::state_bytes_of(compressor_, layout_, n);
      GRADCOMP_EXPECTS(state_bytes_ <= measure.bytes(),
                       std::string(who_) + ": the compressor's state_bytes exceed its workspace");
      std::size_t const bytes = warmup_.workspace_bytes(layout_, n, measure.bytes(), state_bytes_);
      ef_.emplace(space_, layout_.size());
      workspace_ = buffer<std::byte, Space>(bytes, space_);
      space_.fill_zero(workspace_.data(), bytes);
      resources_.emplace(space_);
    } catch (std::exception const& e) {
      failure = *e.what() != '\0' ? e.what() : "an exception without a message";
    }
    agree_on_configuration(failure);
    space_.fill_zero(status_.data(), status_.size() * sizeof(std::uint64_t));
  }

  /// Reduces `gradient` (layout().size() values) in place (see
  /// allreducer::operator(), which documents the step for users).
  template <gradient_element G>
  void reduce(span<G, memory> gradient) {
    static_assert(
        requires(Compressor const& c, context& ctx) { c.step(ctx, gradient); },
        "this compressor's step does not take gradients stored as this type");
    [[maybe_unused]] auto const guard = channel_.bind_device();
    settle();
    if (gradient.size() != layout_.size())
      refuse(std::string(who_) + ": the gradient has " + std::to_string(gradient.size()) +
             " elements but the bucket was set up for " + std::to_string(layout_.size()) +
             " (every rank skips this step)");
    if (gradient.empty())
      ++step_;  // nothing to agree on: an empty bucket always commits
    else
      run(gradient);
    if constexpr (requires { collective_->check_async(); }) collective_->check_async();
  }

  /// Refuses this step (for a reducer built on this one, whose own input is
  /// unusable): takes part in its agreement with a veto, so every rank fails
  /// the step instead of waiting, then throws invalid_argument(why).
  [[noreturn]] void refuse_step(std::string const& why) {
    [[maybe_unused]] auto const guard = channel_.bind_device();
    settle();
    refuse(why);
  }

  /// Waits for every step enqueued so far, then throws nonfinite_error (or
  /// collective_error) if one of them failed, as the next call would.
  /// @note Waits for the space's stream.
  void synchronize() {
    [[maybe_unused]] auto const guard = channel_.bind_device();
    space_.synchronize();
    settle();
    if constexpr (!std::is_same_v<memory, host_memory>) {  // steps replayed from a CUDA Graph report here
      std::uint64_t words[3];
      space_.to_host(words, status_.data() + detail::failed_steps, sizeof words);
      if (words[0] != 0) fail(words[0], words[1], words[2]);
    }
    if constexpr (requires { collective_->check_async(); }) collective_->check_async();
  }

  /// Counts `steps` (at most the warm-up's) warm-up steps as taken by an
  /// engine that has taken none: a bucket built in the middle of its model's
  /// warm-up (DDP builds its buckets anew after the first iteration) starts
  /// where the model is. Warm-up steps keep no state, so it is then exactly
  /// as if it had taken them.
  void begin_at(std::uint64_t steps) {
    GRADCOMP_EXPECTS(step_ == 0 && steps <= options_.warmup_steps,
                     "begin_at: " + std::to_string(steps) + " warm-up steps on a bucket of " +
                         std::to_string(options_.warmup_steps) + " that has taken " + std::to_string(step_) + " steps");
    step_ = steps;
  }

  /// Bytes the last step put on the wire (see step_context::wire_bytes).
  std::size_t wire_bytes() const { return report_.wire_bytes; }
  /// Steps committed, warm-up included (CUDA: as far as known; synchronize() first).
  std::uint64_t steps() const { return step_; }
  /// True while the next step sends the plain fp32 mean (options().warmup_steps).
  bool warming_up() const { return warmup_.active(step_); }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return compressor_; }
  /// The execution space.
  Space const& space() const { return space_; }
  /// What bad values do, the seed, the warm-up.
  allreducer_options const& options() const { return options_; }
  /// The compressor's workspace: carve it as the compressor does to inspect
  /// what a step left there (PowerSGD's Q, IntSGD's running norm, codes).
  span<std::byte, memory> workspace() const { return workspace_.view(); }
  /// The error-feedback residual carried to the next step.
  /// @note On a device, waits for the stream.
  auto residual() const requires ErrorFeedback::enabled { return ef_->current(); }
  /// Zeroes the error-feedback state.
  void reset_error_feedback() { ef_->reset(); }

  /// A hash of everything the ranks must agree on: the compressor and its
  /// parameters, the shapes, error feedback, aggregator, non-finite policy,
  /// seed and warm-up (and, for own-block steps, the blocks).
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(compressor_.fingerprint(), layout_.fingerprint());
    h = detail::hash(ErrorFeedback::name, h);
    h = detail::hash(Aggregator::name, h);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(options_.nonfinite));
    h = detail::hash_combine(h, options_.warmup_steps);
    if (output_ == step_output::own_block)  // (each rank's block, as its checkpoints have always hashed it)
      h = detail::hash("reduce-scatter", detail::hash_combine(h, layout_.size() / collective_->size()));
    return detail::hash_combine(h, bucket_seed_);
  }

  /// @name Checkpoints (format: <gradcomp/reducers/detail/checkpoint.hpp>)
  /// @{

  /// This rank's state: the committed steps (which fix the warm-up position
  /// and the random streams' position), the error-feedback residual and the
  /// compressor's state kept across steps (PowerSGD's Q, IntSGD's running
  /// norm), sealed with the configuration's fingerprint, the world size and
  /// this rank.
  /// @note Waits for the space (as synchronize(), whose errors it throws).
  std::vector<std::byte> save() {
    synchronize();
    span<float const, memory> residual{};
    if constexpr (ErrorFeedback::enabled) residual = ef_->current();
    return detail::write_bucket_checkpoint(identity(), space_, step_, residual, {workspace_.data(), state_bytes_});
  }

  /// Reads and checks a checkpoint of this rank and configuration without
  /// applying it; throws checkpoint_error naming what is wrong (truncated,
  /// corrupted, another format version, rank, world size or configuration,
  /// non-finite values in the residual or the compressor's state).
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const {
    return detail::parse_bucket_checkpoint(bytes, identity(), ErrorFeedback::enabled ? layout_.size() : 0, state_bytes_,
                                           compressor_);
  }

  /// Applies a checkpoint parse_checkpoint accepted, on this rank alone
  /// (a reducer restores its buckets this way after one agreement).
  /// @note Waits for the space.
  void restore(bucket_checkpoint const& c) {
    [[maybe_unused]] auto const guard = channel_.bind_device();
    GRADCOMP_EXPECTS(
        c.residual.size() == (ErrorFeedback::enabled ? layout_.size() : 0) && c.state.size() == state_bytes_,
        std::string(who_) + ": a bucket_checkpoint of another configuration");
    space_.synchronize();
    if (channel_.pending()) (void)channel_.receive();  // the restored state replaces whatever it said
    ef_->assign(c.residual.data());
    if (state_bytes_ > 0) space_.from_host(workspace_.data(), c.state.data(), state_bytes_);
    space_.fill_zero(status_.data(), status_.size() * sizeof(std::uint64_t));
    space_.synchronize();
    step_ = c.steps;
  }

  /// Restores what save() wrote, on every rank together: if any rank's
  /// checkpoint is unusable (see parse_checkpoint) or the ranks' step counts
  /// differ, every rank throws checkpoint_error naming the rank and the
  /// reason, and no rank changes anything.
  /// @note Collective, and waits for the space.
  void restore(span<std::byte const> bytes) {
    [[maybe_unused]] auto const guard = channel_.bind_device();
    auto const [c, failure] = detail::parsed_or_why([&] { return parse_checkpoint(bytes); });
    expect_restorable(agreement(*collective_, space_, c.steps, 0, failure), failure);  // one step, on every rank
    restore(c);
  }
  /// @}

 private:
  using resources_type = resources_t<Compressor, Space>;
  using context = step_context<Space, Collective, Aggregator, typename ErrorFeedback::ref, resources_type>;
  using warmup_context = step_context<Space, Collective, allreduce_aggregator, error_feedback::none::ref, no_resources>;

  // The frame of a warm-up step (the compressor's state and the residual stay zero).
  typename warmup_context::parts warmup_frame() {
    return {space_,       *collective_,       {},     layout_, workspace_.view(), status_.data(), no_resources_, step_,
            bucket_seed_, options_.nonfinite, output_};
  }
  // The frame of a compressor step.
  typename context::parts frame() {
    return {space_,
            *collective_,
            ef_->view(),
            layout_,
            workspace_.view(),
            status_.data(),
            *resources_,
            warmup_.compressor_step(step_),
            bucket_seed_,
            options_.nonfinite,
            output_};
  }

  template <gradient_element G>
  void run(span<G, memory> gradient) {
    space_.fill_zero(status_.data(), 2 * sizeof(std::uint64_t));  // this rank's count and the veto
    bool const warm = warmup_.active(step_);
    if (warm) {
      report_ = warmup_.step(warmup_frame(), gradient);
    } else {
      context ctx(frame());
      compressor_.step(ctx, gradient);
      report_ = {ctx.wire_bytes(), ctx.what()};
    }
    parallel_for(space_, 1, detail::commit_step{status_.data(), warm ? nullptr : ef_->side()});
    if constexpr (std::is_same_v<memory, host_memory>) {
      if (status_.data()[detail::veto] == 0) ++step_;
    } else if (!channel_.capturing()) {
      channel_.publish(status_.data());
    }
  }

  // A call this rank cannot make: it still takes part in the step's first
  // collective, the agreement, so that every other rank fails the step
  // rather than wait for it; then it throws.
  [[noreturn]] void refuse(std::string const& why) {
    if (layout_.size() != 0) {  // (an empty bucket's step has no collective to take part in)
      if (warmup_.active(step_)) {
        warmup_.refuse(warmup_frame());
      } else {
        context ctx(frame());
        ctx.refuse(compressor_);
      }
    }
    throw invalid_argument(why);
  }

  // The verdict of the previous step, where it is still on its way.
  void settle() {
    if (!channel_.pending() || channel_.capturing()) return;
    auto const words = channel_.receive();
    if (words.failed_steps == 0) {
      ++step_;
      return;
    }
    fail(words.failed_steps, words.last_veto, words.last_local);
  }

  void fail(std::uint64_t /*failed*/, std::uint64_t veto, std::uint64_t local) {
    space_.fill_zero(status_.data() + detail::failed_steps, sizeof(std::uint64_t));
    if (options_.nonfinite == nonfinite_policy::raise || detail::is_fault(veto))
      detail::throw_step_failure(veto, local, collective_->rank(), report_.what);
  }

  // Every rank states its bucket size, its configuration's hash and whether
  // and why it failed to set up, and all reach the same verdict, so all
  // ranks throw together or none does: no rank is left waiting in a step.
  void agree_on_configuration(std::string const& failure) {
    agreement const all(*collective_, space_, layout_.size(), fingerprint(), failure);
    expect_none_failed(all, failure, who_, "this configuration");
    expect_same_bucket(all, who_,
                       "configuration differs from rank 0's (compressor parameters, tensor shapes, error feedback, "
                       "aggregator, non-finite policy or seed)");
  }

  detail::checkpoint_identity identity() const {
    return {checkpoint_kind::allreducer, fingerprint(), static_cast<std::uint32_t>(collective_->size()),
            static_cast<std::uint32_t>(collective_->rank())};
  }

  char const* who_;
  Compressor compressor_;
  Collective* collective_;
  bucket_layout layout_;
  Space space_;
  allreducer_options options_;
  step_output output_;
  std::uint64_t bucket_seed_;
  buffer<std::uint64_t, Space> status_;
  detail::verdict_channel<Space> channel_;
  std::optional<typename ErrorFeedback::template state<Space>> ef_;
  buffer<std::byte, Space> workspace_;
  std::optional<resources_type> resources_;
  detail::warmup<Space> warmup_;
  no_resources no_resources_{space_};
  std::size_t state_bytes_ = 0;  // the workspace's first bytes: the compressor's state
  std::uint64_t step_ = 0;
  detail::step_report report_;
};

}  // namespace gradcomp
