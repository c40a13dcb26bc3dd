// Size arithmetic that cannot wrap: element counts and byte counts of
// buckets and workspaces are computed with these, and a product or sum that
// would overflow std::size_t is rejected with a message naming what was
// being computed.
#pragma once

#include <gradcomp/error.hpp>

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// a * b, or invalid_argument naming `what` if it exceeds std::size_t.
inline std::size_t checked_mul(std::size_t a, std::size_t b, std::string_view what) {
  std::size_t product = 0;
  if (__builtin_mul_overflow(a, b, &product))
    throw invalid_argument(std::string(what) + ": " + std::to_string(a) + " x " + std::to_string(b) +
                           " overflows a 64-bit size");
  return product;
}

/// a + b, or invalid_argument naming `what` if it exceeds std::size_t.
inline std::size_t checked_add(std::size_t a, std::size_t b, std::string_view what) {
  std::size_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum))
    throw invalid_argument(std::string(what) + ": " + std::to_string(a) + " + " + std::to_string(b) +
                           " overflows a 64-bit size");
  return sum;
}

/// ceil(a / b) * b, the multiple of b at or above a, checked.
inline std::size_t checked_round_up(std::size_t a, std::size_t b, std::string_view what) {
  return checked_mul(a / b + (a % b != 0), b, what);
}

/// The largest element count whose byte size fits a signed 64-bit offset
/// (pointer arithmetic and allocators need that much headroom).
template <class T>
inline constexpr std::size_t max_elements = static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max()) /
                                            sizeof(T);

}  // namespace gradcomp::detail
