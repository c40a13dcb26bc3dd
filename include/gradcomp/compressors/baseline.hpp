// The baselines every compressor is measured against.
//
// fp32: all-reduce the 32-bit gradient, divide by n. Lossless.
// cast<bfloat16> / cast<half>: scale by 1/n, round to 16 bits, all-reduce in
// 16 bits, widen. Half the bytes of fp32 for free; bf16 is the strong
// baseline a compressor has to beat (fp16 has the precision but not the
// range). The 1/n comes before the cast, as in PyTorch's fp16_compress_hook,
// so the sum of n values stays within the range each of them had.
//
// Passes over the gradient (d elements, bytes per element):
//   fp32:      check [read 4] (+ residual: write 4), all-reduce in place,
//              scale [read 4, write 4].
//   cast<W>:   encode [read 4, write 2] (+ residual: read 4, write 4),
//              all-reduce of the 16-bit payload, decode [read 2, write 4].
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/detail/mean_codec.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradcomp {
namespace detail {

// fp32: acc into the gradient; the residual of a lossless codec is zero.
template <class EF>
struct fp32_encode {
  float* gradient;
  EF ef;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const {
    float const acc = ef.accumulate(i, gradient[i]);
    bool const usable = mean_codec<float>::fits(acc);
    if (usable) gradient[i] = acc;  // a bad value keeps its own bits (a device would rewrite a NaN's payload)
    ef.update(i, 0.0f, usable);
    return !usable;
  }
};

struct divide_by {
  float* data;
  float divisor;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { data[i] = mean_codec<float>::mean(data[i], divisor); }
};

// cast<W>: payload = W(acc / n); the residual is acc minus what was sent.
template <class W, class EF>
struct cast_encode {
  float const* gradient;
  W* payload;
  EF ef;
  float ranks;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t i) const {
    float const acc = ef.accumulate(i, gradient[i]);
    // Store first and read back: GCC does not vectorize a named local copy
    // of the 16-bit struct.
    payload[i] = mean_codec<W>::encode(acc, ranks);
    bool const usable = mean_codec<W>::fits(acc);
    ef.update(i, acc - mean_codec<W>::sent(payload[i], ranks), usable);
    return !usable;
  }
};

template <class W>
struct cast_decode {
  W const* payload;
  float* gradient;
  float ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { gradient[i] = mean_codec<W>::mean(payload[i], ranks); }
};

}  // namespace detail

/// The fp32 baseline: all-reduce(sum) in 32 bits, then divide by n.
struct fp32 {
  /// Name for messages and reports.
  static constexpr std::string_view name = "fp32";
  /// 32-bit floats add element by element.
  static constexpr bool summable_payload = true;

  /// Any bucket works.
  void validate(bucket_layout const&, int) const {}
  /// No parameters.
  std::uint64_t fingerprint() const { return detail::hash(name); }

  /// Workspace: the bad-value counters and the aggregator's scratch.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;  ///< This rank's and all ranks' bad-value counts.
    span<std::byte, Memory> scratch;       ///< For all-gather aggregation.
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    auto counters = w.template take<std::uint64_t>(2);
    return {counters, w.template take<std::byte>(Aggregator::scratch_bytes(layout.size() * sizeof(float), ranks))};
  }

  /// d * 4 bytes (all-reduce), n times that (all-gather).
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(float), ranks);
  }

  /// gradient <- (sum over ranks of gradient + e) / n.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    parallel_count(space, gradient.size(),
                   detail::fp32_encode<typename Context::error_feedback_ref>{gradient.data(), ctx.error_feedback()},
                   ws.counters.data());
    ctx.agree_all_finite(ws.counters.data(), "NaN or infinite");
    ctx.aggregate(gradient, ws.scratch);
    parallel_for(space, gradient.size(), detail::divide_by{gradient.data(), static_cast<float>(ctx.ranks())});
  }
};

/// The 16-bit baselines: pre-scale by 1/n, cast to W (bfloat16 or half),
/// all-reduce(sum) in W, widen. With error feedback the rounding error is
/// carried to the next step.
///
/// A value whose |g + e| exceeds W's largest finite value is bad: the n-rank
/// sum of the 1/n-scaled values could overflow the lane (for half, past
/// 65504). Bad values follow the allreducer's nonfinite_policy.
///
/// Accuracy: each rank's term rounds once (relative 2^-8 for bf16, 2^-11
/// for fp16, which also has subnormals below 2^-14); the sum rounds once more in the in-process and all-gather
/// paths (they accumulate in float), and once per reduction step in NCCL's.
template <class W>
struct cast {
  static_assert(std::is_same_v<W, bfloat16> || std::is_same_v<W, half>,
                "cast<W> needs a 16-bit float wire type: gradcomp::bfloat16 or gradcomp::half");

  /// Name for messages and reports.
  static constexpr std::string_view name = std::is_same_v<W, bfloat16> ? "bf16" : "fp16";
  /// 16-bit floats add element by element.
  static constexpr bool summable_payload = true;

  /// Any bucket works.
  void validate(bucket_layout const&, int) const {}
  /// No parameters beyond the wire type.
  std::uint64_t fingerprint() const { return detail::hash(name); }

  /// Workspace: counters, the 16-bit payload and the aggregator's scratch.
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;  ///< This rank's and all ranks' bad-value counts.
    span<W, Memory> payload;               ///< The 16-bit message.
    span<std::byte, Memory> scratch;       ///< For all-gather aggregation.
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    auto counters = w.template take<std::uint64_t>(2);
    auto payload = w.template take<W>(layout.size());
    return {counters, payload, w.template take<std::byte>(Aggregator::scratch_bytes(payload.size_bytes(), ranks))};
  }

  /// d * 2 bytes (all-reduce), n times that (all-gather).
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return detail::aggregated_wire_bytes<Aggregator>(layout.size() * sizeof(W), ranks);
  }

  /// gradient <- widen(sum over ranks of W((gradient + e) / n)).
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    parallel_count(space, gradient.size(),
                   detail::cast_encode<W, typename Context::error_feedback_ref>{
                       gradient.data(), ws.payload.data(), ctx.error_feedback(), static_cast<float>(ctx.ranks())},
                   ws.counters.data());
    ctx.agree_all_finite(ws.counters.data(), std::string("NaN, infinite or beyond the ") + std::string(name) +
                                                 " lane's range (|x| > " + std::to_string(W::max()) + ")");
    ctx.aggregate(ws.payload, ws.scratch);
    parallel_for(space, gradient.size(),
                 detail::cast_decode<W>{ws.payload.data(), gradient.data(), static_cast<float>(ctx.ranks())});
  }
};

/// The bf16 baseline.
using bf16 = cast<bfloat16>;
/// The fp16 baseline.
using fp16 = cast<half>;

static_assert(compressor<fp32> && compressor<bf16> && compressor<fp16>);

}  // namespace gradcomp
