// Non-owning views over host or device memory.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Memory that host code can dereference.
struct host_memory {
  static constexpr char const* name = "host";
};

/// Memory of a CUDA device; only kernels dereference it.
struct device_memory {
  static constexpr char const* name = "device";
};

/// A pointer and a length, tagged with the memory the pointer lives in so a
/// host view cannot be handed to a device kernel by mistake. Cheap to copy;
/// kernels take it by value.
template <class T, class Memory = host_memory>
class span {
 public:
  using element_type = T;  ///< The element type, with its const.
  using memory = Memory;   ///< host_memory or device_memory.

  span() = default;
  /// Views `size` elements at `data`.
  GRADCOMP_HOST_DEVICE span(T* data, std::size_t size) : data_(data), size_(size) {}
  /// A view of const elements from a view of mutable ones.
  template <class U>
  requires std::is_same_v<T const, U const> && std::is_const_v<T> &&(!std::is_const_v<U>)GRADCOMP_HOST_DEVICE
      span(span<U, Memory> other)
      : data_(other.data()), size_(other.size()) {}

  /// Pointer to the first element.
  GRADCOMP_HOST_DEVICE T* data() const { return data_; }
  /// Number of elements.
  GRADCOMP_HOST_DEVICE std::size_t size() const { return size_; }
  /// Size in bytes.
  GRADCOMP_HOST_DEVICE std::size_t size_bytes() const { return size_ * sizeof(T); }
  /// True when the view has no elements.
  GRADCOMP_HOST_DEVICE bool empty() const { return size_ == 0; }
  /// Element `i` (unchecked).
  GRADCOMP_HOST_DEVICE T& operator[](std::size_t i) const { return data_[i]; }
  /// Elements [offset, offset + count).
  GRADCOMP_HOST_DEVICE span subspan(std::size_t offset, std::size_t count) const { return span(data_ + offset, count); }
  /// Pointer to the first element, for range-for on host views.
  T* begin() const { return data_; }
  /// Pointer one past the last element.
  T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A view of host memory.
template <class T>
using host_span = span<T, host_memory>;

/// A view of device memory.
template <class T>
using device_span = span<T, device_memory>;

}  // namespace gradcomp
