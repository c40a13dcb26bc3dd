// The baselines every compressor is measured against: fp32, fp16, bf16.
//
// cast<W>: scale by 1/n, round to W, all-reduce(sum) in W, widen. The 1/n
// comes first (as in PyTorch's all-reduce and fp16/bf16 hooks) so the sum of
// n values stays within the range each had. bf16 halves fp32's bytes for
// free: it is the strong baseline a compressor has to beat (fp16 has the
// precision but not the range). With error feedback the rounding error
// (acc - n W(acc / n)) is carried to the next step.
//
// A value whose |g + e| exceeds the wire's limit (detail/mean_codec.hpp:
// close to its largest finite value, so that the n-rank sum cannot
// overflow) is bad, as is NaN or infinity.
//
// Passes over the gradient (d elements, bytes per element):
//   encode [read g 4, (e 4); write payload sizeof(W), (e 4)] (without error
//   feedback it reads g alone),
//   all-reduce of the payload,
//   decode [read payload sizeof(W); write g 4].
// Accuracy: each rank's term rounds once (relative 2^-24, 2^-8, 2^-11;
// fp16 also has subnormals below 2^-14); the sum rounds once more in the
// in-process and all-gather paths (they accumulate in float), and once per
// reduction step in NCCL's.
#pragma once

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/detail/mean_codec.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

// The wire value travels as a float that the payload's stream rounds to W
// on store (16-bit wires are widened<W> streams: on the host a chunk is
// narrowed at once, with the CPU's conversion instructions where it has them).

/// With error feedback: the wire value, and what the rank kept back.
template <class W>
struct cast_encode {
  float inverse, ranks, limit;  // 1/n, n, the admission limit
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, float g, float e, float& payload, float& e_next) const {
    float const acc = g + e;
    W const wire = mean_codec<W>::encode(acc, inverse);
    payload = static_cast<float>(wire);  // (exact: the store keeps it)
    e_next = mean_codec<W>::residual(acc, wire, ranks);
    return !mean_codec<W>::fits(acc, limit);
  }
};

/// Without: the scaled value alone, which the store rounds as encode() would.
template <class W>
struct cast_scale {
  float inverse, limit;  // 1/n, the admission limit
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, float g, float& payload) const {
    float const acc = g + 0.0f;  // (acc = g + a zero residual: -0 sends +0, as with feedback)
    payload = acc * inverse;
    return !mean_codec<W>::fits(acc, limit);
  }
};

/// The sum, widened by its stream, is the mean.
struct cast_decode {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float sum, float& g) const { g = sum; }
};

}  // namespace detail

/// A 16- or 32-bit baseline: pre-scale by 1/n, cast to W (float, bfloat16
/// or half), all-reduce(sum) in W, widen (see the top of this header).
template <class W>
struct cast {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, bfloat16> || std::is_same_v<W, half>,
                "cast<W> needs a float wire type: float, gradcomp::bfloat16 or gradcomp::half");

  /// Name for messages and reports.
  static constexpr std::string_view name = std::is_same_v<W, float>      ? "fp32"
                                           : std::is_same_v<W, bfloat16> ? "bf16"
                                                                         : "fp16";
  /// Floats add element by element.
  static constexpr bool summable_payload = true;
  /// Shards anywhere.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// Any element may start a shard.
  std::size_t shard_alignment() const { return 1; }

  /// Spec: no keys. Unbiased, so no error feedback unless asked for (as
  /// PyTorch's fp16 and bf16 hooks).
  static constexpr std::tuple<> parameters{};  // none beyond the wire type
  static constexpr bool integer_lane = false;
  static constexpr bool error_feedback_by_default = false;
  /// make(the baseline).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const&, int, Make&& make) {
    return make(cast{});
  }

  /// Any bucket works.
  void validate(bucket_layout const&, int) const {}
  /// No parameters beyond the wire type.
  std::uint64_t fingerprint() const { return detail::hash(name); }

  /// The step's agreement can ride in the payload's all-reduce.
  static constexpr bool carries_agreement = true;

  /// Workspace: the payload and the aggregator's scratch.
  template <class Memory>
  struct workspace {
    span<W, Memory> payload;          ///< The message, and the agreement's lanes after it.
    span<std::byte, Memory> scratch;  ///< For all-gather aggregation.
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    auto payload = w.template take<W>(layout.size() + agreement_lanes);
    return {payload, w.template take<std::byte>(Aggregator::scratch_bytes(layout.size() * sizeof(W), ranks))};
  }

  /// d * sizeof(W) bytes (all-reduce), n times that (all-gather).
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(W), ranks);
  }

  /// gradient <- widen(sum over ranks of W((gradient + e) / n)).
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    auto const ws = ctx.carve(*this);
    auto const& ef = ctx.error_feedback();
    float const inverse = detail::mean_codec<W>::inverse(ctx.ranks()),
                limit = detail::mean_codec<W>::limit(ctx.ranks());
    auto const wire = detail::gradient_stream(ws.payload);  // W*, or widened<W> for a 16-bit wire
    if constexpr (decltype(ef.bind())::keeps_residual)
      transform(ctx.space(), gradient.size(), inputs(detail::gradient_stream(gradient), ef.previous()),
                outputs(wire, ef.next()), detail::cast_encode<W>{inverse, static_cast<float>(ctx.ranks()), limit},
                {.count = ctx.bad_count()});
    else
      transform(ctx.space(), gradient.size(), inputs(detail::gradient_stream(gradient)), outputs(wire),
                detail::cast_scale<W>{inverse, limit}, {.count = ctx.bad_count()});
    ctx.agree_and_aggregate(*this, ws.payload, ws.scratch, detail::mean_codec<W>::out_of_range);
    auto const [first, count] = ctx.output_range();
    transform(ctx.space(), count, inputs(detail::gradient_stream(ws.payload, first)),
              outputs(detail::gradient_stream(gradient.subspan(first, count))), detail::cast_decode{},
              {.when = ctx.output_gate()});
  }
};

/// The fp32 baseline.
using fp32 = cast<float>;
/// The bf16 baseline: the one to beat.
using bf16 = cast<bfloat16>;
/// The fp16 baseline.
using fp16 = cast<half>;

static_assert(compressor<fp32> && compressor<bf16> && compressor<fp16>);

}  // namespace gradcomp
