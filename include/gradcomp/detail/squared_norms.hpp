// Squared norms of long segments in two short levels, and the value functors
// the segment sums read: per tile in the canonical lane order, then per group
// of tiles, so no GPU warp walks more than a tile or a group's tile list.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/execution.hpp>

#include <cstddef>
#include <cstdint>

namespace gradcomp::detail {

/// acc = g + e of element i.
template <class EF>
struct accumulated {
  float const* gradient;
  EF ef;
  GRADCOMP_HOST_DEVICE float operator()(std::size_t i) const { return ef.accumulate(i, gradient[i]); }
};

/// Stores segment j's sum; a NaN or an overflow to infinity marks it bad.
struct store_sum {
  float* sums;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t j, float sum) const {
    sums[j] = sum;
    return !(sum <= 3.40282347e38f);
  }
};

/// Reads stored sums back as values.
struct read_sum {
  float const* sums;
  GRADCOMP_HOST_DEVICE float operator()(std::size_t j) const { return sums[j]; }
};

/// tile_sums[t] = Σ value(i)^2 over tile t of `tile` elements of [0, n), then
/// group_sums[g] = Σ tile_sums over group g of `tiles_per_group` tiles. Bad
/// (non-finite) tiles and groups are counted into *counter.
template <class Space, class Value>
void grouped_sum_of_squares(Space const& space, std::size_t n, std::size_t tile, std::size_t tiles_per_group,
                            Value const& value, float* tile_sums, float* group_sums, std::uint64_t* counter) {
  segment_sum_of_squares(space, n, tile, value, store_sum{tile_sums}, counter);
  segment_sum(space, (n + tile - 1) / tile, tiles_per_group, read_sum{tile_sums}, store_sum{group_sums}, counter);
}

}  // namespace gradcomp::detail
