// Execution spaces: where a compressor's loops run and where its buffers
// live. The same functor runs under the host space's (OpenMP) loop and in the
// CUDA space's kernels, so the math is written once. The algorithms built on
// them (transform, segmented_reduce, top_k) are in <gradcomp/algorithm/...>.
#pragma once

#include <gradcomp/detail/checked.hpp>
#include <gradcomp/execution/host.hpp>
#if GRADCOMP_HAS_CUDA
#include <gradcomp/execution/cuda.hpp>
#endif

#include <concepts>
#include <cstddef>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// A place to run element loops and keep buffers: host_space or cuda_space.
/// It allocates, copies, zeroes and moves data to and from the host; the
/// loops themselves are free functions (parallel_for, transform, ...).
template <class S>
concept execution_space = std::copyable<S> && requires(S const& s, void* p, void const* q, std::size_t n) {
  typename S::memory;
  { s.allocate(n) } -> std::same_as<void*>;
  s.deallocate(p);
  s.copy(p, q, n);
  s.fill_zero(p, n);
  s.to_host(p, q, n);
  s.from_host(p, q, n);
  s.synchronize();
};

static_assert(execution_space<host_space>);
#if GRADCOMP_HAS_CUDA
static_assert(execution_space<cuda_space>);
#endif

/// An owning, move-only array of `T` in the memory of execution space `S`,
/// allocated once at construction.
template <class T, execution_space S>
class buffer {
 public:
  using memory = typename S::memory;  ///< Where the elements live.

  buffer() = default;
  /// Allocates `size` uninitialized elements (a size whose bytes overflow
  /// is rejected with invalid_argument).
  explicit buffer(std::size_t size, S space = {})
      : space_(space),
        data_(static_cast<T*>(space_.allocate(detail::checked_mul(size, sizeof(T), "buffer")))),
        size_(size) {}
  buffer(buffer&& other) noexcept
      : space_(other.space_), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  buffer& operator=(buffer&& other) noexcept {
    if (this != &other) {
      release();
      space_ = other.space_;
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  buffer(buffer const&) = delete;
  buffer& operator=(buffer const&) = delete;
  ~buffer() { release(); }

  /// Pointer to the first element.
  T* data() const { return data_; }
  /// Number of elements.
  std::size_t size() const { return size_; }
  /// A view of all elements.
  span<T, memory> view() const { return {data_, size_}; }
  /// The space the buffer belongs to.
  S const& space() const { return space_; }

 private:
  void release() {
    if (data_ != nullptr) space_.deallocate(data_);
    data_ = nullptr;
  }

  S space_{};
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace gradcomp
