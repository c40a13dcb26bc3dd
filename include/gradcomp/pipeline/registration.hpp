// What a compressor declares so that it can be chosen by name at run time:
// its spec keys, whether it wants error feedback by default, and how a spec
// builds it for n ranks (compressors/registry.hpp lists the compressors).
//
//   static constexpr std::string_view spec_keys = "bits lane";  // space-separated
//   static constexpr bool error_feedback_by_default = true;
//   template <class Spec, class Make>
//   static decltype(auto) from_spec(Spec const& spec, int ranks, Make&& make);
//
// from_spec reads the spec's optional fields named by its keys, leaves the
// compressor's defaults where they are unset, picks the integer lane for
// `ranks` ranks, and returns make(compressor). Every branch returns make's
// result, so its types must agree (a type-erased reducer, say).
#pragma once

#include <gradcomp/config.hpp>

#include <cstdint>
#include <optional>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {

/// The integer lane of THC, QSGD, GlobalRandK and IntSGD.
enum class lane_choice {
  automatic,  ///< The narrowest lane n ranks' sums cannot overflow (each compressor's from_spec).
  int8,       ///< int8 (THC: uint8); refused at construction if n ranks could overflow it.
  int32,      ///< int32.
};

/// A compressor that a spec can name: it declares its keys, its default for
/// error feedback, and from_spec (see the top of this header).
template <class C>
concept registered = requires {
  { C::name } -> std::convertible_to<std::string_view>;
  { C::spec_keys } -> std::convertible_to<std::string_view>;
  { C::error_feedback_by_default } -> std::convertible_to<bool>;
};

namespace detail {

/// field = *value where the spec sets it.
template <class T, class F>
void set_if(std::optional<T> const& value, F& field) {
  if (value) field = static_cast<F>(*value);
}

/// Whether the narrow lane is the spec's choice: asked for, or automatic and
/// `fits` (n ranks' sums cannot overflow it).
inline bool narrow_lane(lane_choice lane, bool fits) {
  return lane == lane_choice::int8 || (lane == lane_choice::automatic && fits);
}

}  // namespace detail
}  // namespace gradcomp
