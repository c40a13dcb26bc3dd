// The compressor registry: the one list of the compressors a spec can name,
// and compressor_spec, a compressor chosen at run time by name and
// parameters. Everything that must cover every compressor (the type-erased
// reducers, the benchmarks, the trainer's flags, the tests) iterates this
// list; each compressor declares its keys and how a spec builds it beside its
// policy (pipeline/registration.hpp).
#pragma once

#include <gradcomp/bucket_layout.hpp>
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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

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

/// A compressor by name, with the parameters that name takes; unset
/// parameters keep the compressor's defaults. The names and the keys each
/// takes are the registry's (names(), takes(); each compressor declares its
/// `parameters`): "topkc:fraction=0.1,chunk_size=256", "thc:bits=4,lane=int8",
/// "powersgd:matrix_rank=4", "bf16:ef=on". Every spec takes ef=on|off, and a
/// compressor with an integer lane lane=auto|int8|int32.
struct compressor_spec {
  std::string name = "bf16";
  /// The parameters it sets: key and value as written back (read as the
  /// member's type), in the order the compressor declares them.
  std::vector<std::pair<std::string, std::string>> values;
  lane_choice lane = lane_choice::automatic;
  /// Residual error feedback; unset: the compressor's default (off for the
  /// unbiased baselines and QSGD, as PyTorch's hooks, and GlobalRandK, whose
  /// default is no contraction; on for the others).
  std::optional<bool> error_feedback;

  /// The value of `key` as the spec holds it, where it sets one.
  std::optional<std::string_view> value_of(std::string_view key) const {
    for (auto const& [k, v] : values)
      if (k == key) return std::string_view(v);
    return std::nullopt;
  }

  /// Whether this spec uses error feedback.
  bool uses_error_feedback() const {
    bool by_default = true;
    for_each_registered([&]<class C>(std::type_identity<C>) {
      if (name == C::name) by_default = C::error_feedback_by_default;
    });
    return error_feedback.value_or(by_default);
  }

  /// Reads "name" or "name:key=value,key=value" (keys: the compressor's
  /// parameters, lane=auto|int8|int32 and ef=on|off), then validate()s it
  /// for one rank. Throws invalid_argument naming an unknown name, key or
  /// value, a key the compressor does not take, an empty item (a trailing
  /// ':' or ','), or, in the compressor's own words, a value out of its range.
  static compressor_spec parse(std::string_view text) {
    compressor_spec s;
    std::size_t const colon = text.find(':');
    s.name = std::string(text.substr(0, colon));
    GRADCOMP_EXPECTS(is_known(s.name), "compressor_spec: unknown compressor '" + s.name + "' (" + names() + ")");
    if (colon != std::string_view::npos) {
      std::string_view rest = text.substr(colon + 1);
      for (bool more = true; more;) {
        std::size_t const comma = rest.find(',');
        std::string_view const item = rest.substr(0, comma);
        more = comma != std::string_view::npos;
        rest = more ? rest.substr(comma + 1) : std::string_view{};
        std::size_t const eq = item.find('=');
        GRADCOMP_EXPECTS(
            eq != std::string_view::npos && eq != 0,
            "compressor_spec: '" + std::string(item) + "' is not key=value in '" + std::string(text) + "'");
        s.set(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
      }
    }
    s.validate();
    return s;
  }

  /// Throws invalid_argument, with the compressor's own message naming the
  /// key, where what this spec sets cannot run on `ranks` ranks whatever the
  /// bucket: a value out of its range, or integer sums that `ranks` ranks
  /// would overflow in the lane asked for. (What depends on a bucket, such as
  /// a k larger than it, is refused when the bucket is built.)
  void validate(int ranks = 1) const;

  /// The spec as parse() reads it.
  std::string str() const {
    std::string out = name;
    bool first = true;
    auto add = [&](std::string_view key, std::string_view value) {
      out += first ? ':' : ',';
      out.append(key).append("=").append(value);
      first = false;
    };
    for (auto const& [key, value] : values) add(key, value);
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

  /// Every key a spec may hold, each once, in the registry's order, then
  /// lane and ef.
  static std::vector<std::string> keys() {
    std::vector<std::string> out;
    for_each_registered([&]<class C>(std::type_identity<C>) {
      for_each_parameter<C>([&](auto const& p) {
        if (std::find(out.begin(), out.end(), p.key) == out.end()) out.emplace_back(p.key);
      });
    });
    out.emplace_back("lane");
    out.emplace_back("ef");
    return out;
  }

  /// Whether `n` is a registered compressor's name.
  static bool is_known(std::string_view n) {
    bool known = false;
    for_each_registered([&]<class C>(std::type_identity<C>) { known = known || n == C::name; });
    return known;
  }

  /// Whether compressor `compressor_name` takes `key` (every one takes ef;
  /// those with an integer lane, lane).
  static bool takes(std::string_view compressor_name, std::string_view key) {
    bool taken = key == "ef";
    for_each_registered([&]<class C>(std::type_identity<C>) {
      if (compressor_name != C::name) return;
      taken = taken || (key == "lane" && C::integer_lane);
      for_each_parameter<C>([&](auto const& p) { taken = taken || p.key == key; });
    });
    return taken;
  }

  /// Sets `key` from its text `value`, as parse() does. Throws
  /// invalid_argument for an unknown key or value, or one this spec's
  /// compressor does not take.
  void set(std::string const& key, std::string const& value) {
    auto const all = keys();
    GRADCOMP_EXPECTS(std::find(all.begin(), all.end(), key) != all.end(),
                     "compressor_spec: unknown key '" + key + "' (" + joined(all) + ")");
    GRADCOMP_EXPECTS(takes(name, key), "compressor_spec: " + name + " takes no '" + key + "'");
    if (key == "lane") {
      GRADCOMP_EXPECTS(value == "auto" || value == "int8" || value == "int32",
                       "compressor_spec: lane=" + value + " (auto, int8, int32)");
      lane = value == "int8" ? lane_choice::int8 : value == "int32" ? lane_choice::int32 : lane_choice::automatic;
    } else if (key == "ef") {
      bool const on = value == "on" || value == "true" || value == "1" || value == "yes";
      bool const off = value == "off" || value == "false" || value == "0" || value == "no";
      GRADCOMP_EXPECTS(on || off, "compressor_spec: ef=" + value + " (on, off)");
      error_feedback = on;
    } else {
      set_parameter(key, value);
    }
  }

 private:
  static std::string joined(std::vector<std::string> const& words) {
    std::string out;
    for (auto const& w : words) out.append(out.empty() ? "" : ", ").append(w);
    return out;
  }

  // Sets a declared parameter of this spec's compressor, its value read as
  // the member's type and written back so, keeping the declared order.
  void set_parameter(std::string const& key, std::string const& value) {
    for_each_registered([&]<class C>(std::type_identity<C>) {
      if (name != C::name) return;
      std::vector<std::string_view> order;  // C's keys, as declared
      for_each_parameter<C>([&](auto const& p) {
        order.push_back(p.key);
        if (p.key != key) return;
        using T = typename std::remove_cvref_t<decltype(p)>::value_type;
        auto const read = detail::read_value<T>(value);
        GRADCOMP_EXPECTS(read.has_value(),
                         "compressor_spec: " + key + "=" + value + " is not a number of the right kind");
        std::string text = detail::write_value(*read);
        auto const found = std::find_if(values.begin(), values.end(), [&](auto const& kv) { return kv.first == key; });
        if (found != values.end())
          found->second = std::move(text);
        else
          values.emplace_back(key, std::move(text));
      });
      auto rank = [&](std::string const& k) { return std::find(order.begin(), order.end(), k) - order.begin(); };
      std::stable_sort(values.begin(), values.end(),
                       [&](auto const& a, auto const& b) { return rank(a.first) < rank(b.first); });
    });
  }
};

namespace detail {
template <class Make, class C, class... Rest>
decltype(auto) visit_registered(type_list<C, Rest...>, compressor_spec const& spec, int ranks, Make& make) {
  static_assert(registered<C>,
                "a registry entry must declare parameters, integer_lane, error_feedback_by_default and from_spec");
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
/// can): a name or parameter it rejects (the compressor's validate() for
/// any bucket: an empty layout), or what `refuse(compressor)` throws for a
/// compressor the caller cannot use. The caller then agrees with the other
/// ranks, because a spec only one rank rejects must fail every rank.
template <class Refuse>
std::string spec_failure(compressor_spec const& spec, int ranks, Refuse&& refuse) {
  try {
    (void)visit_compressor(spec, ranks, [&](auto c, auto) {
      c.validate(bucket_layout{}, ranks);
      refuse(c);
      return 0;
    });
  } catch (std::exception const& e) {
    return e.what();
  }
  return {};
}
}  // namespace detail

inline void compressor_spec::validate(int ranks) const {
  std::string const failure = detail::spec_failure(*this, ranks, [](auto const&) {});
  GRADCOMP_EXPECTS(failure.empty(), failure);
}

}  // namespace gradcomp
