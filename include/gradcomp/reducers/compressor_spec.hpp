// A compressor chosen at run time: a name and parameters (from a command
// line or a configuration file), and the library's lane policy, which turns
// them into a compressor type for n ranks.
#pragma once

#include <gradcomp/compressors/cast/cast.hpp>
#include <gradcomp/compressors/global_randk/global_randk.hpp>
#include <gradcomp/compressors/intsgd/intsgd.hpp>
#include <gradcomp/compressors/powersgd/powersgd.hpp>
#include <gradcomp/compressors/qsgd/qsgd.hpp>
#include <gradcomp/compressors/qsgd_multiscale/qsgd_multiscale.hpp>
#include <gradcomp/compressors/thc/thc.hpp>
#include <gradcomp/compressors/topk/topk.hpp>
#include <gradcomp/compressors/topk_chunked/topk_chunked.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/pipeline/error_feedback.hpp>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {

/// The integer lane of THC, QSGD-MaxNorm, GlobalRandK and IntSGD.
enum class lane_choice {
  automatic,  ///< The narrowest lane n ranks' sums cannot overflow (see compressor_spec).
  int8,       ///< int8 (THC: uint8); refused at construction if n ranks could overflow it.
  int32,      ///< int32.
};

/// A compressor by name, with the parameters that name takes; unset
/// parameters keep the compressor's defaults.
///
///   name       parameters
///   fp32, fp16, bf16
///   topk       fraction (of elements)
///   topkc      fraction (of chunks), chunk
///   powersgd   rank
///   thc        bits, block, stages, lane
///   qsgd       bits, lane                  (QSGD-MaxNorm)
///   qsgd-ms    -                           (two-scale QSGD)
///   randk      k, bits, lane               (GlobalRandK)
///   intsgd     lane
///
/// Lane policy (lane_choice::automatic): THC takes uint8 while n x its top
/// level fits in 255, else int32; QSGD and GlobalRandK take int8 while bits
/// <= 7 and n x (2^bits - 1) fits in 127, else int32; IntSGD takes int8 while
/// each of n ranks keeps at least the integers -7..7 (n <= 18), else int32.
struct compressor_spec {
  std::string name = "bf16";
  std::optional<double> fraction;
  std::optional<std::size_t> chunk;
  std::optional<std::size_t> rank;
  std::optional<int> bits;
  std::optional<std::size_t> block;
  std::optional<int> stages;
  std::optional<std::size_t> k;
  lane_choice lane = lane_choice::automatic;
  /// Residual error feedback; unset: off for the unbiased baselines (fp32,
  /// fp16, bf16: PyTorch's hooks) and QSGD-MaxNorm, on for the others.
  std::optional<bool> error_feedback;

  /// Whether this spec uses error feedback.
  bool uses_error_feedback() const {
    return error_feedback.value_or(!(name == "fp32" || name == "fp16" || name == "bf16" || name == "qsgd"));
  }

  /// Reads "name" or "name:key=value,key=value" (keys: the parameters above
  /// and ef=on|off, lane=auto|int8|int32). Throws invalid_argument naming an
  /// unknown name, key or value, or a key the compressor does not take.
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
    std::string out = name, sep = ":";
    auto add = [&](char const* key, std::string const& value) { out += sep + key + "=" + value, sep = ","; };
    if (fraction) {
      char text[32];
      auto const end = std::to_chars(text, text + sizeof text, *fraction).ptr;  // the shortest that reads back
      add("fraction", std::string(text, end));
    }
    if (chunk) add("chunk", std::to_string(*chunk));
    if (rank) add("rank", std::to_string(*rank));
    if (bits) add("bits", std::to_string(*bits));
    if (block) add("block", std::to_string(*block));
    if (stages) add("stages", std::to_string(*stages));
    if (k) add("k", std::to_string(*k));
    if (lane != lane_choice::automatic) add("lane", lane == lane_choice::int8 ? "int8" : "int32");
    if (error_feedback) add("ef", *error_feedback ? "on" : "off");
    return out;
  }

  /// The compressor names parse() knows.
  static std::string names() { return "fp32, fp16, bf16, topk, topkc, powersgd, thc, qsgd, qsgd-ms, randk, intsgd"; }

 private:
  static bool is_known(std::string const& n) {
    for (char const* known :
         {"fp32", "fp16", "bf16", "topk", "topkc", "powersgd", "thc", "qsgd", "qsgd-ms", "randk", "intsgd"})
      if (n == known) return true;
    return false;
  }

  // Which keys each compressor takes.
  bool takes(std::string const& key) const {
    auto among = [&](std::initializer_list<char const*> names) {
      for (char const* n : names)
        if (name == n) return true;
      return false;
    };
    if (key == "ef") return true;
    if (key == "fraction") return among({"topk", "topkc"});
    if (key == "chunk") return among({"topkc"});
    if (key == "rank") return among({"powersgd"});
    if (key == "bits") return among({"thc", "qsgd", "randk"});
    if (key == "block" || key == "stages") return among({"thc"});
    if (key == "k") return among({"randk"});
    if (key == "lane") return among({"thc", "qsgd", "randk", "intsgd"});
    return false;
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

  void set(std::string const& key, std::string const& value) {
    static char const* const known = "fraction, chunk, rank, bits, block, stages, k, lane, ef";
    bool const is_key = key == "ef" || key == "fraction" || key == "chunk" || key == "rank" || key == "bits" ||
                        key == "block" || key == "stages" || key == "k" || key == "lane";
    GRADCOMP_EXPECTS(is_key, "compressor_spec: unknown key '" + key + "' (" + known + ")");
    GRADCOMP_EXPECTS(takes(key), "compressor_spec: " + name + " takes no '" + key + "'");
    if (key == "fraction") fraction = number<double>(key, value);
    if (key == "chunk") chunk = number<std::size_t>(key, value);
    if (key == "rank") rank = number<std::size_t>(key, value);
    if (key == "bits") bits = number<int>(key, value);
    if (key == "block") block = number<std::size_t>(key, value);
    if (key == "stages") stages = number<int>(key, value);
    if (key == "k") k = number<std::size_t>(key, value);
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
};

namespace detail {
template <class C>
void set_if(std::optional<C> const& value, C& field) {
  if (value) field = *value;
}
}  // namespace detail

/// Calls make(compressor, error_feedback_policy) with the compressor `spec`
/// names for `ranks` ranks (lanes by the policy above) and returns its result.
/// Every branch must return the same type (a type-erased reducer, say).
template <class Make>
decltype(auto) visit_compressor(compressor_spec const& spec, int ranks, Make&& make) {
  auto with_ef = [&](auto c) -> decltype(auto) {
    if (spec.uses_error_feedback()) return make(c, error_feedback::residual{});
    return make(c, error_feedback::none{});
  };
  auto const n = static_cast<std::int64_t>(ranks);
  auto const& s = spec;
  if (s.name == "fp32") return with_ef(fp32{});
  if (s.name == "fp16") return with_ef(fp16{});
  if (s.name == "bf16") return with_ef(bf16{});
  if (s.name == "topk") {
    topk<bfloat16> c;
    detail::set_if(s.fraction, c.fraction);
    return with_ef(c);
  }
  if (s.name == "topkc") {
    topk_chunked<> c;
    detail::set_if(s.fraction, c.fraction);
    detail::set_if(s.chunk, c.chunk_size);
    return with_ef(c);
  }
  if (s.name == "powersgd") {
    powersgd<> c;
    detail::set_if(s.rank, c.rank);
    return with_ef(c);
  }
  if (s.name == "thc") {
    auto make_thc = [&](auto c) -> decltype(auto) {
      detail::set_if(s.bits, c.bits);
      detail::set_if(s.block, c.block);
      detail::set_if(s.stages, c.stages);
      return c;
    };
    auto const narrow = make_thc(thc<std::uint8_t>{});
    bool const fits = n * static_cast<std::int64_t>(narrow.top()) <= 255;
    if (s.lane == lane_choice::int8 || (s.lane == lane_choice::automatic && fits)) return with_ef(narrow);
    return with_ef(make_thc(thc<std::int32_t>{}));
  }
  if (s.name == "qsgd" || s.name == "randk") {
    auto build = [&](auto c) {
      detail::set_if(s.bits, c.bits);
      if constexpr (requires { c.k; }) detail::set_if(s.k, c.k);
      return c;
    };
    auto const pick = [&](auto narrow, auto wide) -> decltype(auto) {
      bool const fits = narrow.bits <= 7 && n * narrow.levels() <= 127;
      if (s.lane == lane_choice::int8 || (s.lane == lane_choice::automatic && fits)) return with_ef(narrow);
      return with_ef(wide);
    };
    if (s.name == "qsgd") return pick(build(qsgd_maxnorm<std::int8_t>{}), build(qsgd_maxnorm<std::int32_t>{}));
    return pick(build(global_randk<std::int8_t>{}), build(global_randk<std::int32_t>{}));
  }
  if (s.name == "qsgd-ms") return with_ef(qsgd_multiscale{});
  if (s.name == "intsgd") {
    if (s.lane == lane_choice::int8 || (s.lane == lane_choice::automatic && ranks <= 18))
      return with_ef(intsgd<std::int8_t>{});
    return with_ef(intsgd<std::int32_t>{});
  }
  throw invalid_argument("compressor_spec: unknown compressor '" + s.name + "' (" + compressor_spec::names() + ")");
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
