// The compressor registry: the one list of the compressors a spec can name,
// and compressor_spec, a compressor chosen at run time by name and
// parameters. Everything that must cover every compressor (the type-erased
// reducers, the benchmarks, the trainer's flags, the tests) iterates this
// list; each compressor declares its keys and how a spec builds it beside its
// policy (pipeline/registration.hpp).
#pragma once

#include <gradcomp/compressors/cast/cast.hpp>
#include <gradcomp/compressors/global_randk/global_randk.hpp>
#include <gradcomp/compressors/intsgd/intsgd.hpp>
#include <gradcomp/compressors/powersgd/powersgd.hpp>
#include <gradcomp/compressors/qsgd/qsgd.hpp>
#include <gradcomp/compressors/qsgd_multiscale/qsgd_multiscale.hpp>
#include <gradcomp/compressors/thc/thc.hpp>
#include <gradcomp/compressors/topk/topk.hpp>
#include <gradcomp/compressors/topkc/topkc.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/pipeline/error_feedback.hpp>
#include <gradcomp/pipeline/registration.hpp>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// A list of types.
template <class... T>
struct type_list {};

/// Every compressor a spec can name, one entry each (its default lane: a
/// spec picks the lane for n ranks). Adding a compressor: its folder, one
/// entry here, its tests.
using compressor_registry = type_list<fp32, bf16, fp16, topkc<>, topk<bfloat16>, thc<>, qsgd<>, qsgd_multiscale,
                                      global_randk<>, intsgd<>, powersgd<>>;

/// Calls f(std::type_identity<C>{}) for each registered compressor C, in order.
template <class F>
void for_each_registered(F&& f) {
  [&]<class... C>(type_list<C...>) { (f(std::type_identity<C>{}), ...); }(compressor_registry{});
}

namespace detail {
/// Whether `key` is one of the space-separated words of `keys`.
constexpr bool has_word(std::string_view keys, std::string_view key) {
  while (!keys.empty()) {
    std::size_t const space = keys.find(' ');
    if (keys.substr(0, space) == key) return true;
    keys = space == std::string_view::npos ? std::string_view{} : keys.substr(space + 1);
  }
  return false;
}
}  // namespace detail

/// A compressor by name, with the parameters that name takes; unset
/// parameters keep the compressor's defaults. The names and the keys each
/// takes are the registry's (names(), takes(); see each compressor's
/// spec_keys): "topkc:fraction=0.1,chunk_size=256", "thc:bits=4,lane=int8",
/// "powersgd:matrix_rank=4", "bf16:ef=on". Every spec takes ef=on|off.
struct compressor_spec {
  std::string name = "bf16";
  std::optional<double> fraction;          ///< topk: of elements; topkc: of chunks.
  std::optional<std::size_t> chunk_size;   ///< topkc.
  std::optional<std::size_t> matrix_rank;  ///< powersgd: the rank of each matrix's approximation.
  std::optional<int> bits;                 ///< thc, qsgd, global_randk.
  std::optional<std::size_t> block;        ///< thc: the rotation block.
  std::optional<int> stages;               ///< thc: butterfly stages.
  std::optional<std::size_t> k;            ///< global_randk: coordinates per step.
  lane_choice lane = lane_choice::automatic;
  /// Residual error feedback; unset: the compressor's default (off for the
  /// unbiased baselines and QSGD, as PyTorch's hooks, and GlobalRandK, whose
  /// default is no contraction; on for the others).
  std::optional<bool> error_feedback;

  /// Calls f(key, field) for each numeric key, in the order str() writes them.
  template <class F>
  void for_each_key(F&& f) {
    keys_of(*this, f);
  }
  template <class F>
  void for_each_key(F&& f) const {
    keys_of(*this, f);
  }

  /// Whether this spec uses error feedback.
  bool uses_error_feedback() const {
    bool by_default = true;
    for_each_registered([&]<class C>(std::type_identity<C>) {
      if (name == C::name) by_default = C::error_feedback_by_default;
    });
    return error_feedback.value_or(by_default);
  }

  /// Reads "name" or "name:key=value,key=value" (keys: the numeric ones
  /// above, lane=auto|int8|int32 and ef=on|off). Throws invalid_argument
  /// naming an unknown name, key or value, or a key the compressor does not
  /// take.
  static compressor_spec parse(std::string_view text) {
    compressor_spec s;
    std::size_t const colon = text.find(':');
    s.name = std::string(text.substr(0, colon));
    GRADCOMP_EXPECTS(is_known(s.name), "compressor_spec: unknown compressor '" + s.name + "' (" + names() + ")");
    std::string_view rest = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
    while (!rest.empty()) {
      std::size_t const comma = rest.find(',');
      std::string_view const item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      std::size_t const eq = item.find('=');
      GRADCOMP_EXPECTS(eq != std::string_view::npos,
                       "compressor_spec: '" + std::string(item) + "' is not key=value in '" + std::string(text) + "'");
      s.set(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    }
    return s;
  }

  /// The spec as parse() reads it.
  std::string str() const {
    std::string out = name;
    bool first = true;
    auto add = [&](std::string_view key, std::string const& value) {
      out += first ? ':' : ',';
      out.append(key).append("=").append(value);
      first = false;
    };
    for_each_key([&](char const* key, auto const& field) {
      if (!field) return;
      if constexpr (std::is_floating_point_v<std::decay_t<decltype(*field)>>) {
        char text[32];
        auto const end = std::to_chars(text, text + sizeof text, *field).ptr;  // the shortest that reads back
        add(key, std::string(text, end));
      } else {
        add(key, std::to_string(*field));
      }
    });
    if (lane != lane_choice::automatic) add("lane", lane == lane_choice::int8 ? "int8" : "int32");
    if (error_feedback) add("ef", *error_feedback ? "on" : "off");
    return out;
  }

  /// The compressor names parse() knows, as "fp32, fp16, ...".
  static std::string names() {
    std::string out;
    for_each_registered([&]<class C>(std::type_identity<C>) { out.append(out.empty() ? "" : ", ").append(C::name); });
    return out;
  }

  /// Every key a spec may hold, as "fraction, chunk_size, ..., lane, ef".
  static std::string keys() {
    std::string out;
    compressor_spec{}.for_each_key([&](char const* key, auto const&) { out.append(key).append(", "); });
    return out + "lane, ef";
  }

  /// Whether `n` is a registered compressor's name.
  static bool is_known(std::string_view n) {
    bool known = false;
    for_each_registered([&]<class C>(std::type_identity<C>) { known = known || n == C::name; });
    return known;
  }

  /// Whether compressor `compressor_name` takes `key` (every one takes ef).
  static bool takes(std::string_view compressor_name, std::string_view key) {
    bool taken = key == "ef";
    for_each_registered([&]<class C>(std::type_identity<C>) {
      if (compressor_name == C::name) taken = taken || detail::has_word(C::spec_keys, key);
    });
    return taken;
  }

  /// Sets `key` from its text `value`, as parse() does. Throws
  /// invalid_argument for an unknown key or value, or one this spec's
  /// compressor does not take.
  void set(std::string const& key, std::string const& value) {
    bool numeric = false;
    for_each_key([&](char const* k, auto const&) { numeric = numeric || key == k; });
    GRADCOMP_EXPECTS(numeric || key == "lane" || key == "ef",
                     "compressor_spec: unknown key '" + key + "' (" + keys() + ")");
    GRADCOMP_EXPECTS(takes(name, key), "compressor_spec: " + name + " takes no '" + key + "'");
    for_each_key([&](char const* k, auto& field) {
      if (key == k) field = number<std::decay_t<decltype(*field)>>(key, value);
    });
    if (key == "lane") {
      GRADCOMP_EXPECTS(value == "auto" || value == "int8" || value == "int32",
                       "compressor_spec: lane=" + value + " (auto, int8, int32)");
      lane = value == "int8" ? lane_choice::int8 : value == "int32" ? lane_choice::int32 : lane_choice::automatic;
    }
    if (key == "ef") {
      bool const on = value == "on" || value == "true" || value == "1" || value == "yes";
      bool const off = value == "off" || value == "false" || value == "0" || value == "no";
      GRADCOMP_EXPECTS(on || off, "compressor_spec: ef=" + value + " (on, off)");
      error_feedback = on;
    }
  }

 private:
  // The numeric keys of `s` (a spec, const or not), in the order str() writes them.
  template <class Self, class F>
  static void keys_of(Self& s, F& f) {
    f("fraction", s.fraction), f("chunk_size", s.chunk_size), f("matrix_rank", s.matrix_rank), f("bits", s.bits);
    f("block", s.block), f("stages", s.stages), f("k", s.k);
  }

  template <class T>
  static T number(std::string const& key, std::string const& value) {
    T out{};
    char const* const end = value.data() + value.size();
    auto const [at, error] = std::from_chars(value.data(), end, out);
    GRADCOMP_EXPECTS(error == std::errc{} && at == end && !value.empty(),
                     "compressor_spec: " + key + "=" + value + " is not a number of the right kind");
    return out;
  }
};

namespace detail {
template <class Make, class C, class... Rest>
decltype(auto) visit_registered(type_list<C, Rest...>, compressor_spec const& spec, int ranks, Make& make) {
  static_assert(registered<C>, "a registry entry must declare spec_keys, error_feedback_by_default and from_spec");
  if (spec.name == C::name) return C::from_spec(spec, ranks, make);
  if constexpr (sizeof...(Rest) > 0) {
    return visit_registered(type_list<Rest...>{}, spec, ranks, make);
  } else {
    throw invalid_argument("compressor_spec: unknown compressor '" + spec.name + "' (" + compressor_spec::names() +
                           ")");
  }
}
}  // namespace detail

/// Calls make(compressor, error_feedback_policy) with the compressor `spec`
/// names for `ranks` ranks (its lane as its from_spec picks it) and returns
/// its result. Every branch must return the same type (a type-erased
/// reducer, say).
template <class Make>
decltype(auto) visit_compressor(compressor_spec const& spec, int ranks, Make&& make) {
  auto with_ef = [&](auto c) -> decltype(auto) {
    if (spec.uses_error_feedback()) return make(c, error_feedback::residual{});
    return make(c, error_feedback::none{});
  };
  return detail::visit_registered(compressor_registry{}, spec, ranks, with_ef);
}

namespace detail {
/// Why this rank cannot build what `spec` names for `ranks` ranks ("" if it
/// can): a name or parameter it rejects, or what `refuse(compressor)` throws
/// for a compressor the caller cannot use. The caller then agrees with the
/// other ranks, because a spec only one rank rejects must fail every rank.
template <class Refuse>
std::string spec_failure(compressor_spec const& spec, int ranks, Refuse&& refuse) {
  try {
    (void)visit_compressor(spec, ranks, [&](auto c, auto) {
      refuse(c);
      return 0;
    });
  } catch (std::exception const& e) {
    return e.what();
  }
  return {};
}
}  // namespace detail

}  // namespace gradcomp
