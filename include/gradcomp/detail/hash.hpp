// FNV-1a hashing for configuration fingerprints.
#pragma once

#include <cstdint>
#include <string_view>

namespace gradcomp::detail {

inline constexpr std::uint64_t hash_seed = 0xcbf29ce484222325ull;

/// Mixes the 8 bytes of `value` into `h`.
constexpr std::uint64_t hash_combine(std::uint64_t h, std::uint64_t value) {
  for (int byte = 0; byte < 8; ++byte) h = (h ^ ((value >> (8 * byte)) & 0xff)) * 0x100000001b3ull;
  return h;
}

/// Mixes the characters of `text` into `h`.
constexpr std::uint64_t hash(std::string_view text, std::uint64_t h = hash_seed) {
  for (char ch : text) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ull;
  return h;
}

}  // namespace gradcomp::detail
