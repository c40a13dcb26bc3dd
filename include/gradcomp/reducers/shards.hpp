// Buckets cut into equal shards, one per rank: what the hierarchical path and
// the reduce-scatter path share.
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/compressor.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// True when a bucket of compressor C can be cut into shards of elements (as
/// C declares: not PowerSGD, whose matrices a shard would cut, nor classic
/// TopK, whose pairs do not sum).
template <class C>
inline constexpr bool shards_by_elements = C::sharding == shard_kind::elements;

/// True when C shards by whole tensors across a node's ranks (PowerSGD).
template <class C>
inline constexpr bool shards_by_tensors = C::sharding == shard_kind::tensors;

/// True when the hierarchical path can cut C's buckets at all.
template <class C>
inline constexpr bool shards_in_two_levels = shards_by_elements<C> || shards_by_tensors<C>;

/// Shards start on what C declares (whole rotation blocks, chunks), and on
/// 64-element lines.
template <class C>
std::size_t shard_alignment(C const& c) {
  return std::max<std::size_t>(64, c.shard_alignment());
}

/// The elements of each of `parts` equal shards of a `d`-element bucket, each
/// a multiple of `alignment`: parts x the result >= d (the rest is padding).
inline std::size_t shard_elements(std::size_t d, int parts, std::size_t alignment) {
  std::size_t const p = static_cast<std::size_t>(parts);
  std::size_t const shard = (d + p - 1) / p;
  return (shard + alignment - 1) / alignment * alignment;
}

/// Each rank's part of a bucket, which travels in that rank's slot (`slot`
/// elements, zero-padded) of a reduce-scatter.
struct node_parts {
  std::vector<element_range> of_rank;
  std::size_t slot = 0;
  /// True when slot r starts at element r * slot: the bucket, padded with
  /// zeros, is the reduce-scatter's input as it stands.
  bool in_place() const {
    for (std::size_t r = 0; r < of_rank.size(); ++r)
      if (of_rank[r].count > 0 && of_rank[r].first != r * slot) return false;
    return true;
  }
};

/// Equal shards of `alignment`-multiples, in rank order (the last ones may
/// be short or empty).
inline node_parts element_parts(std::size_t d, int parts, std::size_t alignment) {
  node_parts p{std::vector<element_range>(static_cast<std::size_t>(parts)), shard_elements(d, parts, alignment)};
  for (std::size_t r = 0; r < p.of_rank.size(); ++r) {
    std::size_t const first = std::min(d, r * p.slot);
    p.of_rank[r] = {first, std::min(d, first + p.slot) - first};
  }
  return p;
}

/// The bucket a step on `padded` elements reads: `gradient` itself where it
/// needs no padding, else its copy in `room`, followed by zeros.
template <class Space, class T>
T* padded_bucket(Space const& space, span<T, typename Space::memory> gradient, T* room, std::size_t padded) {
  if (gradient.size() == padded) return gradient.data();
  space.copy(room, gradient.data(), gradient.size_bytes());
  space.fill_zero(room + gradient.size(), (padded - gradient.size()) * sizeof(T));
  return room;
}

/// Runs of whole tensors, one per rank, each cut at the tensor edge nearest
/// to an even share of the elements; run j goes to rank (first + j) % parts.
inline node_parts tensor_parts(bucket_layout const& layout, int parts, int first) {
  auto const& tensors = layout.tensors();
  std::size_t const d = layout.size(), n = static_cast<std::size_t>(parts);
  std::vector<std::size_t> cut(n + 1, d);  // run j: elements [cut[j], cut[j + 1])
  cut[0] = 0;
  std::size_t t = 0;
  for (std::size_t j = 1; j < n; ++j) {
    std::size_t const even = d * j / n;
    while (t < tensors.size() && tensors[t].offset + tensors[t].elements <= even) ++t;
    std::size_t edge = d;  // the nearer edge of tensor t (the one holding `even`)
    if (t < tensors.size()) {
      std::size_t const lo = tensors[t].offset, hi = lo + tensors[t].elements;
      edge = even - lo <= hi - even ? lo : hi;
    }
    cut[j] = std::max(cut[j - 1], edge);
  }
  node_parts p{std::vector<element_range>(n), 1};  // (a slot of one element at least)
  for (std::size_t j = 0; j < n; ++j) {
    p.of_rank[(static_cast<std::size_t>(first) + j) % n] = {cut[j], cut[j + 1] - cut[j]};
    p.slot = std::max(p.slot, cut[j + 1] - cut[j]);
  }
  return p;
}

/// The tensors of `layout` within `r` (whole tensors), or one element when
/// there are none: a rank without a tensor still steps.
inline bucket_layout tensors_within(bucket_layout const& layout, element_range r) {
  bucket_layout out;
  for (auto const& t : layout.tensors())
    if (t.offset >= r.first && t.offset + t.elements <= r.first + r.count && t.elements > 0) out.add(t.shape);
  return out.size() > 0 ? out : bucket_layout(1);
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
