// What a compressor declares so that it can be chosen by name at run time:
// its parameters as data, whether it has an integer lane, whether it wants
// error feedback by default, and how a spec builds it for n ranks
// (compressors/registry.hpp lists the compressors).
//
//   int bits = 4;   // (its members first)
//   static constexpr auto parameters = std::tuple{
//       parameter{"bits", &qsgd::bits, "s = 2^bits - 1 levels per sign", "1 to 30"}};
//   static constexpr bool integer_lane = true;  // takes lane=auto|int8|int32
//   static constexpr bool error_feedback_by_default = false;
//   template <class Spec, class Make>
//   static decltype(auto) from_spec(Spec const& spec, int ranks, Make&& make);
//
// from_spec builds the compressor with with_parameters(spec) (each declared
// parameter the spec sets, the defaults elsewhere), picks the integer lane
// for `ranks` ranks, and returns make(compressor). Every branch returns
// make's result, so its types must agree (a type-erased reducer, say). The
// spec's keys, their check, its text, the trainer's flags and help, the
// Python listing and the README's table all come from `parameters`.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// The integer lane of THC, QSGD, GlobalRandK and IntSGD.
enum class lane_choice {
  automatic,  ///< The narrowest lane n ranks' sums cannot overflow (each compressor's from_spec).
  int8,       ///< int8 (THC: uint8); refused at construction if n ranks could overflow it.
  int32,      ///< int32.
};

/// One parameter a spec can set on compressor C: its key, the member it
/// sets, what it means, and the values that make sense, as the compressor's
/// validate() checks them (naming the key and value it refuses). A spec
/// reads the value as the member's type, then runs that validate() for any
/// bucket (compressor_spec::parse, validate).
template <class C, class T>
struct parameter {
  using value_type = T;
  constexpr parameter(std::string_view key_, T C::*member_, std::string_view meaning_, std::string_view range_)
      : key(key_), member(member_), meaning(meaning_), range(range_) {}
  std::string_view key;
  T C::*member;
  std::string_view meaning;
  std::string_view range;
};

/// A compressor that a spec can name: it declares its name, its parameters,
/// whether it has an integer lane and its default for error feedback, and
/// from_spec (see the top of this header).
template <class C>
concept registered = requires {
  { C::name } -> std::convertible_to<std::string_view>;
  std::tuple_size<std::remove_cvref_t<decltype(C::parameters)>>::value;
  { C::integer_lane } -> std::convertible_to<bool>;
  { C::error_feedback_by_default } -> std::convertible_to<bool>;
};

/// Calls f(p) for each parameter p compressor C declares, in order.
template <class C, class F>
constexpr void for_each_parameter(F&& f) {
  std::apply([&](auto const&... p) { (f(p), ...); }, C::parameters);
}

namespace detail {

/// `text` read whole as a T (a number), or nothing.
template <class T>
std::optional<T> read_value(std::string_view text) {
  T out{};
  char const* const end = text.data() + text.size();
  auto const [at, error] = std::from_chars(text.data(), end, out);
  if (error != std::errc{} || at != end || text.empty()) return std::nullopt;
  return out;
}

/// A T as read_value reads it back (floating point: the shortest text that does).
template <class T>
std::string write_value(T value) {
  char text[32];
  auto const end = std::to_chars(text, text + sizeof text, value).ptr;
  return std::string(text, end);
}

/// Whether the narrow lane is the spec's choice: asked for, or automatic and
/// `fits` (n ranks' sums cannot overflow it).
inline bool narrow_lane(lane_choice lane, bool fits) {
  return lane == lane_choice::int8 || (lane == lane_choice::automatic && fits);
}

}  // namespace detail

/// `c` with every parameter of C that `spec` sets (spec.value_of(key): its
/// text, as the spec checked it), the others as they were.
template <class C, class Spec>
C with_parameters(Spec const& spec, C c = {}) {
  for_each_parameter<C>([&](auto const& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::value_type;
    auto const text = spec.value_of(p.key);
    if (!text) return;
    auto const value = detail::read_value<T>(*text);
    GRADCOMP_EXPECTS(value.has_value(), "compressor_spec: " + std::string(p.key) + "=" + std::string(*text) +
                                            " is not a number of the right kind");
    c.*p.member = *value;
  });
  return c;
}

}  // namespace gradcomp
