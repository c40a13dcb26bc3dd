// How a model's parameters are packed into buckets, and which buckets take
// the compressor: free functions, as DDP's compute_bucket_assignment_by_size,
// so the rules can be read and tested apart from the reducers that follow
// them. Every model-level entry point (model_reducer, its reduce-scatter
// twin, the DDP hook) calls these.
#pragma once

#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/detail/checked.hpp>
#include <gradcomp/detail/hash.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// The rules plan_buckets and takes_compressor follow (model_reducer_options
/// holds them).
struct bucket_rules {
  /// Buckets of fewer elements (values, not bytes) take the `small` compressor:
  /// below 64 Ki values a compressor's fixed costs outweigh the bytes saved.
  std::size_t min_compression_elements = std::size_t{1} << 16;
  /// 1-D tensors (biases, norms) go in buckets of their own, which take
  /// `small`; a bucket made elsewhere (DDP's) takes the compressor only if it
  /// holds a matrix.
  bool vectors_uncompressed = true;
  /// A bucket closes once it holds this many bytes of gradients, as stored
  /// (DDP's bucket_cap_mb: 25 MiB) ...
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  /// ... and the first bucket of each kind at this many (1 MiB), so the first
  /// reduction starts early in the backward pass.
  std::size_t first_bucket_cap_bytes = std::size_t{1} << 20;
};

/// Where plan_buckets put the model's parameters and how it laid them out.
struct bucket_plan {
  /// Parameter p: its bucket, and its elements' place in the model's storage.
  struct parameter {
    std::size_t bucket = 0, offset = 0, size = 0;
  };
  /// A bucket: its parameters in layout order, its place in the storage.
  struct bucket {
    std::vector<std::size_t> params;
    std::size_t offset = 0, size = 0;
    std::size_t last = 0;     ///< Its last parameter in backward order.
    bool compressed = false;  ///< It takes the compressor, not `small` (takes_compressor).
  };
  std::vector<parameter> params;
  std::vector<bucket> buckets;  ///< In the order they are reduced.
  std::size_t total = 0;        ///< Elements of the model.
};

namespace detail {
/// The rule itself, given whether the bucket holds a tensor of two or more
/// dimensions (each overload reads that from what it is given).
inline bool compressor_rule(std::size_t elements, bool holds_matrix, bucket_rules const& rules) {
  return elements >= rules.min_compression_elements && (!rules.vectors_uncompressed || holds_matrix);
}
}  // namespace detail

/// Whether a bucket of tensors of these `shapes` (each a list of extents),
/// `elements` values in all, takes the compressor rather than `small`: it
/// holds at least min_compression_elements values (an element count, as
/// CGX's layer_min_size; PyTorch's PowerSGD hook instead compares sizes per
/// tensor, by its min_compression_rate) and, where
/// vectors_uncompressed, a tensor of two or more dimensions (biases and
/// norms are small, and PowerSGD compresses matrices).
template <class Shapes>
bool takes_compressor(Shapes const& shapes, std::size_t elements, bucket_rules const& rules) {
  bool const holds_matrix =
      std::any_of(std::begin(shapes), std::end(shapes), [](auto const& s) { return std::size(s) > 1; });
  return detail::compressor_rule(elements, holds_matrix, rules);
}

/// takes_compressor of a bucket laid out as `layout`.
inline bool takes_compressor(bucket_layout const& layout, bucket_rules const& rules) {
  bool const holds_matrix = std::any_of(layout.tensors().begin(), layout.tensors().end(),
                                        [](tensor_info const& t) { return t.shape.size() > 1; });
  return detail::compressor_rule(layout.size(), holds_matrix, rules);
}

/// Packs parameters of `shapes` (in backward order; elements of
/// `element_bytes` bytes) into buckets by byte cap, 1-D tensors apart, then
/// orders the buckets by when their last gradient is ready and lays them out
/// back to back in that order. Throws invalid_argument for a size that
/// overflows.
inline bucket_plan plan_buckets(std::vector<std::vector<std::size_t>> const& shapes, std::size_t element_bytes,
                                bucket_rules const& rules) {
  bucket_plan plan;
  plan.params.resize(shapes.size());
  auto is_vector = [&](std::size_t p) { return rules.vectors_uncompressed && shapes[p].size() <= 1; };
  std::vector<bucket_plan::bucket> open(2), closed;
  std::size_t made[2] = {0, 0};
  auto close = [&](int kind) {
    if (open[kind].params.empty()) return;
    closed.push_back(std::move(open[kind]));
    open[kind] = {};
    ++made[kind];
  };
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    std::size_t n = 1;
    for (std::size_t extent : shapes[p]) n = detail::checked_mul(n, extent, "model_reducer: a tensor's size");
    int const kind = is_vector(p) ? 1 : 0;
    open[kind].params.push_back(p);
    open[kind].size = detail::checked_add(open[kind].size, n, "model_reducer: a bucket's size");
    open[kind].last = p;
    plan.params[p].size = n;
    std::size_t const cap = made[kind] == 0 ? rules.first_bucket_cap_bytes : rules.bucket_cap_bytes;
    if (open[kind].size * element_bytes >= cap) close(kind);
  }
  close(0);
  close(1);
  std::stable_sort(closed.begin(), closed.end(), [](auto const& a, auto const& b) { return a.last < b.last; });
  for (std::size_t b = 0; b < closed.size(); ++b) {
    auto& bucket = closed[b];
    bucket.offset = plan.total;
    std::vector<std::vector<std::size_t>> held;
    for (std::size_t p : bucket.params) held.push_back(shapes[p]);
    bucket.compressed = takes_compressor(held, bucket.size, rules);
    std::size_t offset = plan.total;
    for (std::size_t p : bucket.params) {
      plan.params[p].bucket = b;
      plan.params[p].offset = offset;
      offset += plan.params[p].size;
    }
    plan.total = detail::checked_add(plan.total, bucket.size, "model_reducer: the model's size");
  }
  plan.buckets = std::move(closed);
  return plan;
}

/// A hash of a plan and the shapes it was made from (each tensor's rank and
/// extents, the element size, every bucket's kind and parameters), so ranks
/// can check in one agreement that they built the same buckets.
inline std::uint64_t plan_fingerprint(bucket_plan const& plan, std::vector<std::vector<std::size_t>> const& shapes,
                                      std::size_t element_bytes) {
  std::uint64_t h = detail::hash_combine(detail::hash("bucket_plan"), element_bytes);
  for (auto const& s : shapes) {
    h = detail::hash_combine(h, s.size());
    for (std::size_t extent : s) h = detail::hash_combine(h, extent);
  }
  for (auto const& b : plan.buckets) {
    h = detail::hash_combine(h, b.compressed ? 1u : 0u);
    for (std::size_t p : b.params) h = detail::hash_combine(h, p);
  }
  return h;
}

}  // namespace gradcomp
