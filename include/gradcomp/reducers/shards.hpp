// Buckets cut into equal shards, one per rank: what the hierarchical path and
// the reduce-scatter path share.
#pragma once

#include <gradcomp/execution.hpp>
#include <gradcomp/pipeline/compressor.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// True when a bucket of compressor C can be cut into shards of elements: its
/// payload sums element by element and its step needs no shape (not PowerSGD,
/// whose matrices a shard would cut, nor classic TopK, whose pairs do not sum).
template <class C>
inline constexpr bool shards_by_elements = C::summable_payload && !requires { typename C::template resources<host_space>; };

/// Shards start on whole rotation blocks and chunks (and 64-element lines).
template <class C>
std::size_t shard_alignment(C const& c) {
  std::size_t a = 64;
  if constexpr (requires { c.block; }) a = std::max<std::size_t>(a, c.block);
  if constexpr (requires { c.chunk_size; }) a = std::max<std::size_t>(a, c.chunk_size);
  return a;
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

}  // namespace gradcomp::inline GRADCOMP_ABI::detail
