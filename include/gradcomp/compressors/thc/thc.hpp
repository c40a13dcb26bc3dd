// THC: tensor homomorphic compression (Li et al., NSDI 2024), with the
// HotNets 2024 changes: partial rotation and saturation.
//
// Per step, with acc = g + e and the bucket cut into rotation blocks of B
// elements (the last zero-padded) and scale groups of G elements:
//   1. norm pass: the squared norm of acc per group, in double
//      (segmented_reduce: two short levels, bitwise the same on host and
//      device) [reads g, e]; the ranks agree on the largest of each group with
//      one all-reduce(max). A rotation keeps norms, so no transform is needed
//      for this.
//   2. encode pass, one block at a time [reads g, e; writes levels, e]:
//      random signs D (shared seed: the same on every rank), scale by
//      sqrt(G) / max norm, `stages` Walsh-Hadamard butterflies (all log2 B of
//      them: the full rotation; fewer: partial rotation, cheaper and less
//      Gaussian), clamp at +-T (saturation: the clipped part stays in the
//      residual), unbiased stochastic rounding to integer lane values with
//      per-rank randomness; then, in the same pass, the rank decodes its own
//      values, rotates back, and keeps e = acc - own decode (acc stays in the
//      block's buffer: g and e are read once).
//   3. all-reduce(sum) of the lane values in the Lane type.
//   4. decode pass, one block at a time [reads levels; writes g]: mean value
//      -> z -> inverse rotation -> scale back -> output (on a reduce-scatter
//      step, only the blocks of this rank's shard).
// Wire bytes: padded d x sizeof(Lane) + 8 per group. A lane must hold the
// sum of n ranks' values: n x top <= max(Lane), checked at construction.
// Carries groups whose norm is up to carried_norm() (5.4e37 at the default
// clamp); every rank refuses a step beyond it.
#pragma once

#include <gradcomp/algorithm/segmented_reduce.hpp>
#include <gradcomp/compressors/detail/quantize.hpp>
#include <gradcomp/compressors/thc/blocks.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {

/// THC's quantizers.
enum class thc_quantizer {
  uniform,  ///< 2^bits evenly spaced levels over [-T, T], one stochastic rounding.
  table,    ///< THC's published 16-entry table over 0..30, two stochastic roundings.
};

namespace detail {
// Norm pass: acc of element i (NaN and infinity are left out and counted).
struct thc_acc {
  GRADCOMP_HOST_DEVICE float operator()(std::size_t, float g, float e) const { return g + e; }
};
struct store_double {
  double* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t j, double total) const { out[j] = total; }
};
}  // namespace detail

/// THC (see the top of this header).
///
/// \tparam Lane the summation lane: std::uint8_t, std::uint32_t or
///               std::int32_t. (No 16-bit lane: NCCL cannot sum 16-bit integers.)
template <class Lane = std::uint8_t>
struct thc {
  static_assert(std::is_same_v<Lane, std::uint8_t> || std::is_same_v<Lane, std::uint32_t> ||
                    std::is_same_v<Lane, std::int32_t>,
                "thc sums its levels in std::uint8_t, std::uint32_t or std::int32_t lanes (NCCL has no 16-bit "
                "integer sum)");

  /// Name for messages and reports.
  static constexpr std::string_view name = "thc";
  /// Integer lane values of every rank add element by element.
  static constexpr bool summable_payload = true;
  /// Shards on whole rotation blocks.
  static constexpr shard_kind sharding = shard_kind::elements;
  /// A shard starts on a rotation block.
  std::size_t shard_alignment() const { return block; }

  /// Spec: bits, block, stages, lane. Automatic lane: uint8 while n x the
  /// top level fits in 255, else int32.
  static constexpr bool integer_lane = true;
  static constexpr bool error_feedback_by_default = true;
  /// make(the compressor the spec sets, in its lane for `ranks` ranks).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int ranks, Make&& make) {
    auto const narrow = with_parameters<thc<std::uint8_t>>(s);
    bool const valid = narrow.quantizer == thc_quantizer::table || (narrow.bits >= 1 && narrow.bits <= 16);
    bool const fits = valid && static_cast<std::int64_t>(ranks) * static_cast<std::int64_t>(narrow.top()) <= 255;
    if (detail::narrow_lane(s.lane, fits)) return make(narrow);
    return make(with_parameters<thc<std::int32_t>>(s));
  }

  std::size_t block = 1024;      ///< B, the rotation block: a power of two up to 4096.
  int stages = -1;               ///< Butterfly stages (partial rotation); -1: log2(B), the full transform.
  std::size_t group = 1u << 20;  ///< G, elements sharing a scale (a multiple of B).
  thc_quantizer quantizer = thc_quantizer::uniform;  ///< Uniform levels or THC's table.
  int bits = 4;                                      ///< uniform: 2^bits levels.
  double overflow = 32;                              ///< o: the clamp T = Phi^-1(1 - 1/(2o)) (o = 32: T = 2.15387).
  float clamp = 0;                                   ///< T itself, when > 0 (overrides `overflow`).
  std::optional<std::uint64_t> seed{};               ///< Seeds the signs and the rounding; unset: the bucket's own.

  /// What a spec sets (pipeline/registration.hpp).
  static constexpr auto parameters =
      std::tuple{parameter{"bits", &thc::bits, "2^bits uniform levels", "1 to 16"},
                 parameter{"block", &thc::block, "B, the rotation block", "a power of two, 2 to 4096"},
                 parameter{"stages", &thc::stages, "butterfly stages of the rotation", "0 to log2(B); -1: log2(B)"}};

  /// Stages applied.
  int stage_count() const { return stages < 0 ? std::countr_zero(block) : stages; }
  /// The largest value one rank puts in a lane.
  std::uint32_t top() const { return quantizer == thc_quantizer::table ? 30u : (1u << bits) - 1u; }
  /// T.
  float clamp_value() const { return clamp > 0 ? clamp : detail::thc_clamp_for(overflow); }
  /// Elements after padding the bucket to whole blocks.
  std::size_t padded(std::size_t d) const { return (d + block - 1) / block * block; }
  /// Scale groups of a bucket.
  std::size_t groups(std::size_t d) const { return (padded(d) + group - 1) / group; }

  /// The largest group norm a step carries: a decoded coordinate is at most
  /// T x the norm (an orthonormal rotation of values within [-T, T]) and a
  /// residual at most (1 + T) x the norm, so max(float) / (2 (1 + T)), 5.4e37
  /// at the default T. Every rank refuses a step beyond it.
  double carried_norm() const { return detail::carried_magnitude / (1.0 + clamp_value()); }

  /// Throws invalid_argument for a block that is not a power of two (or
  /// beyond 4096), more stages than log2(B), a group that is not a multiple
  /// of B, levels the lane cannot hold, or n ranks whose summed levels could
  /// overflow the lane (saturation).
  void validate(bucket_layout const&, int ranks) const {
    GRADCOMP_EXPECTS(block >= 2 && block <= 4096 && std::has_single_bit(block),
                     "thc: block=" + std::to_string(block) + " is not a power of two in [2, 4096]");
    GRADCOMP_EXPECTS(stages >= -1 && stage_count() <= std::countr_zero(block),
                     "thc: stages=" + std::to_string(stages) + " is outside 0.." +
                         std::to_string(std::countr_zero(block)) + " (a block of " + std::to_string(block) +
                         " has that many butterfly stages) or -1 (all of them)");
    GRADCOMP_EXPECTS(group >= block && group % block == 0, "thc: the scale group (" + std::to_string(group) +
                                                               ") must be a multiple of the block (" +
                                                               std::to_string(block) + ")");
    GRADCOMP_EXPECTS(quantizer == thc_quantizer::table || (bits >= 1 && bits <= 16),
                     "thc: bits=" + std::to_string(bits) + " is outside 1..16");
    GRADCOMP_EXPECTS(clamp > 0 || overflow > 1, "thc: the overflow frequency o must exceed 1");
    std::uint64_t const limit = static_cast<std::uint64_t>(std::numeric_limits<Lane>::max());
    std::uint64_t const sum = static_cast<std::uint64_t>(ranks) * top();
    GRADCOMP_EXPECTS(sum <= limit, "thc: " + std::to_string(ranks) + " ranks x levels 0.." + std::to_string(top()) +
                                       " (bits=" + std::to_string(bits) + ") sum to " + std::to_string(sum) +
                                       ", beyond the " + std::string(name_of(dtype_of_v<Lane>)) + " lane (max " +
                                       std::to_string(limit) + "); use a wider lane or fewer levels");
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), block);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(stage_count()));
    h = detail::hash_combine(h, group);
    h = detail::hash_combine(h, static_cast<std::uint64_t>(quantizer) * 64 + static_cast<std::uint64_t>(bits));
    h = detail::hash_combine(h, std::bit_cast<std::uint32_t>(clamp_value()));
    h = detail::hash_optional(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Lane>));
  }

  /// Workspace pieces.
  template <class Memory>
  struct workspace {
    span<double, Memory> norms;       ///< Squared norm per group; then the max over ranks.
    span<std::byte, Memory> reduce;   ///< segmented_reduce's scratch.
    span<Lane, Memory> levels;        ///< Lane values of the padded bucket.
    span<std::byte, Memory> scratch;  ///< The aggregator's.
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    workspace<Memory> ws;
    ws.norms = w.template take<double>(groups(layout.size()));
    ws.reduce = w.template take<std::byte>(segmented_reduce_scratch_bytes(layout.size(), group));
    ws.levels = w.template take<Lane>(padded(layout.size()));
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(ws.levels.size_bytes(), ranks));
    return ws;
  }

  /// The norms (all-reduce max) and the lane values.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    return groups(layout.size()) * sizeof(double) +
           detail::aggregated_wire_bytes<Aggregator>(padded(layout.size()) * sizeof(Lane), ranks);
  }

  /// One step: gradient <- the mean over ranks of their decoded THC payloads.
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    std::size_t const d = gradient.size(), blocks = ws.levels.size() / block;

    segmented_reduce<reduction::sum_of_squares>(
        space, d, group, inputs(detail::gradient_stream(gradient), ef.previous()), detail::thc_acc{},
        detail::store_double{ws.norms.data()}, {.scratch = ws.reduce, .count = ctx.bad_count()});
    detail::count_norms_beyond(ctx, span<double const, typename Context::memory>(ws.norms), carried_norm());
    ctx.agree_all_finite(
        "NaN or infinite, or made a scale group's norm exceed the max(float) / (2 (1 + T)) THC carries (counted "
        "once per group)");
    ctx.all_reduce(ws.norms, reduce_op::max);

    float const t = clamp_value();  // T (a bisection unless set: once a step)
    detail::thc_block_params const p{d,
                                     block,
                                     stage_count(),
                                     group,
                                     ws.norms.data(),
                                     detail::thc_rotation_scale(stage_count()),
                                     {t, static_cast<float>(top()), quantizer == thc_quantizer::table},
                                     ctx.random(seed, random_purpose::rotation_signs, random_stream::shared),
                                     ctx.random(seed, random_purpose::rounding, ctx.own_lane()),
                                     static_cast<float>(2.0 * t / (static_cast<double>(top()) * ctx.ranks()))};
    detail::for_each_block(space, {0, blocks}, block,
                           detail::thc_encode<Lane, EF, G>{p, gradient.data(), ef, ws.levels.data()});
    ctx.aggregate_elementwise(ws.levels, ws.scratch);
    // Only the blocks of the output range: a reduce-scatter step's shard
    // starts and ends on whole rotation blocks (shard_alignment).
    auto const [first, count] = ctx.output_range();
    std::size_t const end = std::min(blocks, (first + count + block - 1) / block);
    detail::block_range const out{std::min(first / block, end), end};
    detail::for_each_block(space, out, block, detail::thc_decode<Lane, G>{p, ws.levels.data(), gradient.data()},
                           ctx.output_gate());
  }
};

static_assert(compressor<thc<>>);

}  // namespace gradcomp
