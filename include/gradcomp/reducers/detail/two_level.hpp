// What the two-level reducers (hierarchical_allreducer and
// hierarchical_reduce_scatterer) share: their options, the node's first
// level (node_reduction), their set-up on every rank together, and their
// checkpoints' envelope.
#pragma once

#include <gradcomp/detail/hash.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/checkpoint.hpp>
#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/node_groups.hpp>
#include <gradcomp/reducers/options.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Options of a hierarchical_allreducer.
struct hierarchical_options {
  /// The rail's compressor options: non-finite policy, seed, warm-up.
  allreducer_options reduce{};
  /// Reduce-scatter inside the node in bf16 (half the bytes, one rounding
  /// of each rank's value) rather than fp32.
  bool bf16_within_node = false;
};

namespace detail {
// (16-bit elements travel through these as widened streams: read as float,
// written rounded once.)
struct divide_by {
  float n;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x / n; }
};
struct same_value {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x; }
};

/// The first level of a two-level step, which the hierarchical all-reduce and
/// reduce-scatter share: the node's reduce-scatter of a bucket (fp32, or bf16
/// for half the bytes), after which this rank holds the node's mean of its
/// slot, in fp32. Owns the padded bucket, which the all-gather reuses.
template <class Space, class Gradient>
class node_reduction {
  static constexpr bool wide = std::is_same_v<Gradient, float>;

 public:
  using memory = typename Space::memory;

  node_reduction(node_parts parts, Space space, bool bf16)
      : parts_(std::move(parts)), in_place_(parts_.in_place()), space_(space), bf16_(bf16) {
    std::size_t const slot = parts_.slot, padded = slot * parts_.of_rank.size();
    whole_ = buffer<Gradient, Space>(padded, space_);
    part_ = buffer<float, Space>(slot, space_);
    if (bf16)  // the node's sum, after the bucket in bf16 unless it is already
      narrow_ = buffer<bfloat16, Space>(std::is_same_v<Gradient, bfloat16> ? slot : slot + padded, space_);
    else if (!wide)
      widened_ = buffer<float, Space>(padded, space_);
    space_.fill_zero(whole_.data(), padded * sizeof(Gradient));
  }

  /// Reduce-scatters `gradient` (the bucket, or when `ok` is false the padded
  /// bucket's old contents, so that a rank with a wrong size still takes part)
  /// over the node `local`, and returns this rank's slot of the node's mean.
  template <class Collective>
  float* operator()(Collective& local, span<Gradient, memory> gradient, bool ok) {
    std::size_t const slot = parts_.slot, padded = whole_.size();
    float const per_node = static_cast<float>(local.size());
    Gradient* send = !ok         ? whole_.data()
                     : in_place_ ? padded_bucket(space_, gradient, whole_.data(), padded)
                                 : pack(gradient);
    if (bf16_) {
      bfloat16* node_in = narrow_.data() + slot;
      if constexpr (std::is_same_v<Gradient, bfloat16>)
        node_in = send;
      else
        transform(space_, padded, inputs(gradient_stream(send)), outputs(widened<bfloat16>{node_in}), same_value{});
      local.reduce_scatter(node_in, narrow_.data(), slot, reduce_op::sum);
      transform(space_, slot, inputs(widened<bfloat16>{narrow_.data()}), outputs(part_.data()), divide_by{per_node});
    } else {
      float* node_in = widened_.data();
      if constexpr (wide)
        node_in = send;
      else
        transform(space_, padded, inputs(gradient_stream(send)), outputs(node_in), same_value{});
      local.reduce_scatter(node_in, part_.data(), slot, reduce_op::sum);
      transform(space_, slot, inputs(part_.data()), outputs(part_.data()), divide_by{per_node});
    }
    return part_.data();
  }

  /// Each local rank's part of the bucket, and the slot it travels in.
  node_parts const& parts() const { return parts_; }
  /// True when the padded bucket is the slots in order (parts_.in_place()).
  bool in_place() const { return in_place_; }
  /// The padded bucket: the slots of every local rank.
  Gradient* whole() { return whole_.data(); }
  std::size_t padded() const { return whole_.size(); }
  /// Bytes each rank sends into the node's reduce-scatter.
  std::size_t bytes() const { return whole_.size() * (bf16_ ? sizeof(bfloat16) : sizeof(float)); }

  /// The all-gathered slots back into the bucket (runs of tensors).
  void unpack(span<Gradient, memory> gradient) {
    for (std::size_t r = 0; r < parts_.of_rank.size(); ++r) {
      auto const [first, count] = parts_.of_rank[r];
      space_.copy(gradient.data() + first, whole_.data() + r * parts_.slot, count * sizeof(Gradient));
    }
  }

 private:
  // The bucket in slots, for a reduce-scatter whose slots are not where the
  // parts are in the bucket (runs of tensors): each part, then zeros.
  Gradient* pack(span<Gradient, memory> gradient) {
    Gradient* whole = whole_.data();
    for (std::size_t r = 0; r < parts_.of_rank.size(); ++r) {
      auto const [first, count] = parts_.of_rank[r];
      Gradient* slot = whole + r * parts_.slot;
      space_.copy(slot, gradient.data() + first, count * sizeof(Gradient));
      space_.fill_zero(slot + count, (parts_.slot - count) * sizeof(Gradient));
    }
    return whole;
  }

  node_parts parts_;
  bool in_place_;
  Space space_;
  bool bf16_;
  buffer<Gradient, Space> whole_;   // the padded bucket (padding, and the all-gather)
  buffer<float, Space> part_;       // this rank's slot: the node's mean
  buffer<bfloat16, Space> narrow_;  // bf16 within the node: the slot's sum, then the bucket in bf16
  buffer<float, Space> widened_;    // a 16-bit bucket in fp32, for an fp32 reduce-scatter
};

/// The identity of a two-level reducer's checkpoints: the world's size, and
/// this rank's place in it counted node by node.
template <class Collective>
checkpoint_identity two_level_identity(node_groups<Collective> const& g, std::uint64_t fingerprint) {
  return {checkpoint_kind::hierarchical, fingerprint, static_cast<std::uint32_t>(g.nodes() * g.ranks_per_node()),
          static_cast<std::uint32_t>(g.cross.rank() * g.ranks_per_node() + g.local.rank())};
}

/// A two-level reducer's checkpoint: its rail's state, in an envelope that
/// names the world.
inline std::vector<std::byte> wrap_rail_state(checkpoint_identity const& id, std::vector<std::byte> const& rail) {
  checkpoint_writer w(id);
  w.word(rail.size());
  w.raw(rail.data(), rail.size());
  return std::move(w).finish();
}

/// The rail's state inside a two-level checkpoint (checkpoint_error if the
/// envelope does not match `id`).
inline span<std::byte const> unwrap_rail_state(span<std::byte const> bytes, checkpoint_identity const& id) {
  checkpoint_reader r(open(bytes, id));
  auto const rail = r.block("the shard's state");
  r.finish();
  return rail;
}

/// Restores `reducer` (a two-level reducer) from `bytes` on every rank of
/// the world together, or on none (checkpoint_error naming the problem).
template <class Reducer, class Collective, class Space>
void restore_on_every_rank(Reducer& reducer, node_groups<Collective>& g, Space const& space,
                           span<std::byte const> bytes) {
  bucket_checkpoint c;
  std::string failure;
  try {
    c = reducer.parse_checkpoint(bytes);
  } catch (checkpoint_error const& e) {
    failure = e.what();
  }
  expect_restorable(agreement(g.local, g.cross, space, failure.empty() ? c.steps : 0, 0, failure), failure);
  reducer.restore(c);
}

/// Sets a two-level reducer (named `who`) up on every rank of the world
/// together, or on none. First every rank states its bucket size `d` (zero
/// is valid, as flat: its steps always commit) and `fingerprint`
/// (two_level_terms), and sees every other's, before any rail exchanges
/// anything; then `build` runs, and if it throws on any rank (a lane that
/// would overflow), every rank throws invalid_argument naming the first rank
/// that failed.
template <class Collective, class Space, class Build>
void set_up_on_every_rank(node_groups<Collective>& g, Space const& space, std::size_t d, std::uint64_t fingerprint,
                          char const* who, Build&& build) {
  expect_same_bucket(agreement(g.local, g.cross, space, d, fingerprint, ""), who,
                     "compressor, its parameters, its options or the gradients' type differ from rank 0's");
  std::string failure;
  try {
    build();
  } catch (std::exception const& e) {
    failure = "across " + std::to_string(g.nodes()) + " nodes of " + std::to_string(g.ranks_per_node()) +
              " ranks (lanes sum one value per node): " + e.what();
  }
  expect_none_failed(agreement(g.local, g.cross, space, 0, 0, failure), failure, who, "this configuration");
}

/// How a two-level reducer's buckets are stored, for the ranks' agreement
/// (float: 0, as before 16-bit buckets existed, so that fp32 checkpoints keep
/// their identity).
template <class Gradient>
inline constexpr std::uint64_t gradient_tag = std::is_same_v<Gradient, float>      ? 0
                                              : std::is_same_v<Gradient, bfloat16> ? 1
                                                                                   : 2;

/// What every rank of the world must share to reduce a bucket in two levels:
/// the compressor and its parameters, error feedback, how buckets are stored,
/// the node's precision and the rail's options (a rank of another rail with
/// other options would still exchange with this one inside the node).
template <class ErrorFeedback, class Gradient, class Compressor>
std::uint64_t two_level_terms(Compressor const& compressor, hierarchical_options const& o) {
  std::uint64_t h = hash(ErrorFeedback::name, hash_combine(compressor.fingerprint(), gradient_tag<Gradient>));
  h = hash_combine(h, o.bf16_within_node ? 1 : 0);
  h = hash_combine(h, static_cast<std::uint64_t>(o.reduce.nonfinite));
  h = hash_combine(h, o.reduce.warmup_steps);
  h = hash_combine(h, o.reduce.bucket);
  h = hash_combine(h, o.reduce.seed.has_value() ? 1 : 0);
  return hash_combine(h, o.reduce.seed.value_or(0));
}
}  // namespace detail

}  // namespace gradcomp
