// Several tensors packed in one flat gradient buffer.
#pragma once

#include <gradcomp/detail/checked.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/error.hpp>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// One tensor of a bucket: where it starts in the flat buffer and its shape.
struct tensor_info {
  std::size_t offset = 0;          ///< First element in the flat buffer.
  std::vector<std::size_t> shape;  ///< Extents, outermost first; empty for a scalar.
  std::size_t elements = 1;        ///< Number of elements (1 for a scalar), checked against overflow.

  /// Number of elements (1 for a scalar).
  std::size_t numel() const { return elements; }
  /// Rows of the matrix view `shape[0] x rest` that low-rank compressors use
  /// (PyTorch's `tensor.view(shape[0], -1)`); 1 for scalars.
  std::size_t rows() const { return shape.empty() ? 1 : shape.front(); }
  /// Columns of that matrix view.
  std::size_t cols() const { return rows() == 0 ? 0 : numel() / rows(); }
  /// True for tensors with at most one dimension (biases, norms).
  bool is_vector() const { return shape.size() <= 1; }
};

/// The tensors of one gradient bucket, packed back to back in a flat buffer.
///
/// Flat compressors only need size(); shape-aware ones (PowerSGD) walk
/// tensors(). Every rank must build the same layout; the allreducer checks.
/// Sizes that do not fit a 64-bit count are rejected (invalid_argument).
class bucket_layout {
 public:
  /// An empty bucket.
  bucket_layout() = default;

  /// A bucket holding one flat tensor of `elements` values.
  explicit bucket_layout(std::size_t elements) { add({elements}); }

  /// A bucket holding tensors of the given shapes, packed in order.
  bucket_layout(std::initializer_list<std::vector<std::size_t>> shapes) {
    for (auto const& shape : shapes) add(shape);
  }

  /// Appends a tensor of `shape` right after the last one; returns *this.
  bucket_layout& add(std::vector<std::size_t> shape) {
    std::size_t elements = 1;
    for (std::size_t extent : shape) elements = detail::checked_mul(elements, extent, "bucket_layout: a tensor's size");
    std::size_t const size = detail::checked_add(size_, elements, "bucket_layout: the bucket's size");
    GRADCOMP_EXPECTS(size <= detail::max_elements<float>,
                     "bucket_layout: " + std::to_string(size) + " elements exceed what a buffer can address");
    tensors_.push_back(tensor_info{size_, std::move(shape), elements});
    size_ = size;
    return *this;
  }

  /// Total number of elements in the bucket.
  std::size_t size() const { return size_; }
  /// The tensors, in buffer order.
  std::vector<tensor_info> const& tensors() const { return tensors_; }

  /// A hash of the shapes, equal on ranks that built the same layout.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_seed;
    for (auto const& t : tensors_) {
      h = detail::hash_combine(h, t.shape.size());
      for (std::size_t extent : t.shape) h = detail::hash_combine(h, extent);
    }
    return h;
  }

 private:
  std::vector<tensor_info> tensors_;
  std::size_t size_ = 0;
};

}  // namespace gradcomp
