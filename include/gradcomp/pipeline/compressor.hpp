// The compressor concept, and what a compressor may ask of the pipeline.
//
// A compressor turns each rank's gradient into the rank-mean of what the
// ranks' payloads decode to, in place. It may take several communication
// rounds (TopK-Chunked: scores, then values; THC: scale, then levels;
// PowerSGD: P, then Q); each round is a collective call on the step context,
// between passes. On the CUDA space every call is enqueued on one stream, so
// a step is straight-line code that never waits for the host.
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/workspace.hpp>
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/pipeline/error_feedback.hpp>
#include <gradcomp/pipeline/registration.hpp>
#include <gradcomp/pipeline/step_context.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {

/// The resources of a compressor that needs none beyond its workspace.
struct no_resources {
  /// Nothing to set up.
  template <class Space>
  explicit no_resources(Space const&) {}
};

namespace detail {
template <class C, class Space>
struct resources_of {
  using type = no_resources;
};
template <class C, class Space>
requires requires { typename C::template resources<Space>; }
struct resources_of<C, Space> {
  using type = typename C::template resources<Space>;
};

/// A collective with nothing behind it: the compressor concept checks a
/// step's signature against it (never called).
struct archetype_collective {
  int rank() const;
  int size() const;
  bool accepts(memory_kind) const;
  template <class T>
  void all_reduce(T const*, T*, std::size_t, reduce_op);
  template <class T>
  void all_gather(T const*, T*, std::size_t);
  template <class T>
  void broadcast(T*, std::size_t, int);
};
}  // namespace detail

/// How a compressor's bucket can be cut into shards, one per rank (the
/// reduce-scatter path and the hierarchical path cut buckets this way).
enum class shard_kind {
  elements,  ///< Into runs of elements: the payload sums element by element and needs no shape.
  tensors,   ///< Into runs of whole tensors: the payload sums, but a step needs the shapes (PowerSGD).
  none,      ///< Not at all: the payload does not sum (classic TopK's pairs).
};

/// What a compressor needs in execution space Space beyond its workspace,
/// built once by the allreducer from the space (PowerSGD on CUDA: a cuBLAS
/// handle): `C::resources<Space>` if C declares it, else no_resources.
template <class C, class Space>
using resources_t = typename detail::resources_of<C, Space>::type;

/// The step context a compressor's step is checked against.
template <class C>
using archetype_context = step_context<host_space, detail::archetype_collective, allreduce_aggregator,
                                       error_feedback::none::ref, resources_t<C, host_space>>;

/// A compressor: a copyable value holding its parameters, which
/// - names itself (`name`) and says whether its payload is summable;
/// - declares how its buckets shard (`sharding`), and for shard_kind::elements
///   the multiple a shard must start on (shard_alignment(): its rotation
///   block, its chunk);
/// - validate(layout, ranks) throws invalid_argument for a configuration
///   that cannot work on that bucket (k larger than the bucket, say);
/// - fingerprint() hashes its parameters, so ranks can check they agree;
/// - carve<Aggregator>(carver, layout, ranks) takes its workspace pieces
///   (called once to measure, then each step to carve);
/// - wire_bytes<Aggregator>(layout, ranks) predicts what a step puts on the
///   wire (beyond the agreement), counted as step_context counts it;
/// - step(ctx, gradient) turns gradient into the rank-mean of the decoded
///   payloads: it counts bad values into ctx.bad_count(), calls
///   ctx.agree_all_finite() (or, declaring `carries_agreement`,
///   ctx.agree_and_aggregate()) before writing anything that outlives the step,
///   gates those passes with ctx.output_gate() / ctx.state_gate(), and
///   writes every element's next residual through ctx.error_feedback().
///
/// A compressor that keeps state across steps in its workspace (PowerSGD's
/// Q, IntSGD's running norm) carves it first and says how many bytes it is
/// with state_bytes(layout, ranks): checkpoints save those bytes, warm-up
/// leaves them zero. Without the member there is no such state. An optional
/// state_problem(bytes) says why checkpointed bytes cannot be that state
/// (null where they can), so a restore refuses them.
template <class C>
concept compressor = std::copyable<C> &&
    requires(C const& c, bucket_layout const& layout, int ranks, workspace_carver<host_memory>& carver,
             archetype_context<C>& ctx, span<float> g) {
  { C::name } -> std::convertible_to<std::string_view>;
  { C::summable_payload } -> std::convertible_to<bool>;
  { C::sharding } -> std::convertible_to<shard_kind>;
  requires C::sharding != shard_kind::elements || requires {
    { c.shard_alignment() } -> std::same_as<std::size_t>;
  };
  c.validate(layout, ranks);
  { c.fingerprint() } -> std::same_as<std::uint64_t>;
  c.template carve<allreduce_aggregator>(carver, layout, ranks);
  { c.template wire_bytes<allreduce_aggregator>(layout, ranks) } -> std::same_as<std::size_t>;
  c.step(ctx, g);
};

namespace detail {

/// Error feedback needs a contraction, an error smaller than the signal
/// (||C(x) - x|| < ||x||), or it amplifies the error it should delay. A
/// compressor that knows a bound on E||C(x) - x||^2 / ||x||^2 on a bucket
/// declares it as error_bound(layout); this throws invalid_argument where
/// the bound reaches 1.
template <class C>
void expect_contraction(C const& c, bucket_layout const& layout) {
  if constexpr (requires { c.error_bound(layout); }) {
    double const bound = c.error_bound(layout);
    GRADCOMP_EXPECTS(bound < 1.0, std::string(C::name) + ": error feedback needs a contraction, but on a bucket of " +
                                      std::to_string(layout.size()) + " elements its squared error may reach " +
                                      std::to_string(bound) +
                                      " x the signal's (its error_bound), so feedback would amplify it; turn error "
                                      "feedback off (its default), or quantize fewer coordinates or with more bits");
  }
}

/// The leading workspace bytes `c` keeps across steps (0 without state_bytes).
template <class C>
std::size_t state_bytes_of(C const& c, bucket_layout const& layout, int ranks) {
  if constexpr (requires { c.state_bytes(layout, ranks); })
    return c.state_bytes(layout, ranks);
  else
    return 0;
}

/// Why `state` (state_bytes_of bytes, from a checkpoint) cannot be `c`'s
/// kept state, or null where it can (or `c` keeps none, or does not say).
template <class C>
char const* state_problem_of(C const& c, span<std::byte const> state) {
  if constexpr (requires { c.state_problem(state); })
    return c.state_problem(state);
  else
    return nullptr;
}

/// Bytes a payload of `bytes` costs on the wire under aggregator A.
template <class A>
constexpr std::size_t aggregated_wire_bytes(std::size_t bytes, int ranks) {
  return A::requires_summable_payload ? bytes : bytes * static_cast<std::size_t>(ranks);
}

}  // namespace detail
}  // namespace gradcomp
