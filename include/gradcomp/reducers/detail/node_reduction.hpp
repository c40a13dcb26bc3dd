// The first level of a two-level step, which the hierarchical all-reduce
// and reduce-scatter share: the node's reduce-scatter of a bucket.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/reducers/shards.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI::detail {
// (16-bit elements travel through these as widened streams: read as float,
// written rounded once.)
struct divide_by {
  float n;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x / n; }
};
struct same_value {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x; }
};

/// The node's levels of a two-level step: first the node's reduce-scatter of
/// a bucket (fp32, or bf16 for half the bytes), which the hierarchical
/// all-reduce and reduce-scatter share, after which this rank holds the
/// node's mean of its slot, in fp32; last, for the all-reduce, the node's
/// all-gather of every rank's slot. Owns the padded bucket, which the
/// all-gather reuses.
template <class Space, class Gradient>
class node_reduction {
  static constexpr bool wide = std::is_same_v<Gradient, float>;

 public:
  using memory = typename Space::memory;

  /// The node's levels for a bucket cut into `parts`; `bf16`: reduce-scatter
  /// in bf16; `gathers`: the step ends with all_gather().
  node_reduction(node_parts parts, Space space, bool bf16, bool gathers)
      : parts_(std::move(parts)), in_place_(parts_.in_place()), space_(space), bf16_(bf16) {
    std::size_t const slot = parts_.slot, padded = slot * parts_.of_rank.size();
    whole_ = buffer<Gradient, Space>(padded, space_);
    part_ = buffer<float, Space>(slot, space_);
    if (bf16)  // the node's sum, after the bucket in bf16 unless it is already
      narrow_ = buffer<bfloat16, Space>(std::is_same_v<Gradient, bfloat16> ? slot : slot + padded, space_);
    else if (!wide)
      widened_ = buffer<float, Space>(padded, space_);
    if (gathers && !wide) rounded_ = buffer<Gradient, Space>(slot, space_);
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

  /// The last level: every rank's slot of the mean (`part`, this rank's)
  /// gathered over the node `local` into `gradient`, the bucket. A 16-bit
  /// bucket's slot is rounded to its type once, before it travels.
  template <class Collective>
  void all_gather(Collective& local, float const* part, span<Gradient, memory> gradient) {
    std::size_t const slot = parts_.slot;
    Gradient* out = in_place_ && whole_.size() == gradient.size() ? gradient.data() : whole_.data();
    if constexpr (wide) {
      local.all_gather(part, out, slot);
    } else {
      transform(space_, slot, inputs(part), outputs(gradient_stream(rounded_.data())), same_value{});
      local.all_gather(rounded_.data(), out, slot);
    }
    if (out != gradient.data()) unpack(gradient);
  }

  /// Each local rank's part of the bucket, and the slot it travels in.
  node_parts const& parts() const { return parts_; }
  /// The padded bucket's elements: the slots of every local rank.
  std::size_t padded() const { return whole_.size(); }
  /// Bytes each rank sends into the node's reduce-scatter.
  std::size_t bytes() const { return whole_.size() * (bf16_ ? sizeof(bfloat16) : sizeof(float)); }

 private:
  // The all-gathered slots back into the bucket (runs of tensors).
  void unpack(span<Gradient, memory> gradient) {
    for (std::size_t r = 0; r < parts_.of_rank.size(); ++r) {
      auto const [first, count] = parts_.of_rank[r];
      space_.copy(gradient.data() + first, whole_.data() + r * parts_.slot, count * sizeof(Gradient));
    }
  }

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
  buffer<Gradient, Space> whole_;    // the padded bucket (padding, and the all-gather)
  buffer<float, Space> part_;        // this rank's slot: the node's mean
  buffer<bfloat16, Space> narrow_;   // bf16 within the node: the slot's sum, then the bucket in bf16
  buffer<float, Space> widened_;     // a 16-bit bucket in fp32, for an fp32 reduce-scatter
  buffer<Gradient, Space> rounded_;  // a 16-bit bucket: the slot's mean, rounded for the all-gather
};

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
