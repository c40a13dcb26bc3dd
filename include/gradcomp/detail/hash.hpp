// FNV-1a hashing for configuration fingerprints.
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI::detail {

inline constexpr std::uint64_t hash_seed = 0xcbf29ce484222325ull;

/// Mixes the 8 bytes of `value` into `h` (device code hashes selections too).
GRADCOMP_HOST_DEVICE constexpr std::uint64_t hash_combine(std::uint64_t h, std::uint64_t value) {
  for (int byte = 0; byte < 8; ++byte) h = (h ^ ((value >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
  return h;
}

/// Mixes the characters of `text` into `h`.
constexpr std::uint64_t hash(std::string_view text, std::uint64_t h = hash_seed) {
  for (char ch : text) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

/// Mixes an optional value into `h` (unset and 0 differ).
template <class T>
constexpr std::uint64_t hash_optional(std::uint64_t h, T const& value) {
  return value.has_value() ? hash_combine(hash_combine(h, 1), static_cast<std::uint64_t>(*value)) : hash_combine(h, 0);
}

/// A 64-bit finalizer (SplitMix64's): every input bit affects every output
/// bit, so keys derived from related seeds (seed, seed + 1) are unrelated.
GRADCOMP_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace gradcomp::detail
