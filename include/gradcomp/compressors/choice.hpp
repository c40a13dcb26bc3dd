// A compressor as a user chooses it: one spec ("thc:bits=4"), or the
// planner's choice among candidates ("auto", "auto:of=bf16+topkc+thc"). The
// one place that reads and writes the "auto:of=" grammar.
#pragma once

#include <gradcomp/compressors/registry.hpp>
#include <gradcomp/error.hpp>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A fixed compressor_spec, or `auto` with its candidates: the planner then
/// chooses each bucket's compressor among them (planning/planner.hpp).
/// Implicitly made from a compressor_spec; every options struct that takes a
/// compressor from a user holds one.
class compressor_choice {
 public:
  /// The candidates of a plain "auto": bf16, TopK-Chunked and PowerSGD at
  /// their defaults (one scheme of each family the paper revisits, and the
  /// strong baseline).
  static std::vector<compressor_spec> default_candidates() {
    return {compressor_spec::parse("bf16"), compressor_spec::parse("topkc"), compressor_spec::parse("powersgd")};
  }

  /// bf16: the strong baseline (see compressor_spec).
  compressor_choice() = default;
  /// A fixed compressor.
  compressor_choice(compressor_spec spec) : spec_(std::move(spec)) {}  // NOLINT(google-explicit-constructor)

  /// The planner's choice among `candidates` (at least one).
  static compressor_choice automatic(std::vector<compressor_spec> candidates) {
    GRADCOMP_EXPECTS(!candidates.empty(), "compressor_choice: auto names no candidate");
    compressor_choice c;
    c.candidates_ = std::move(candidates);
    return c;
  }

  /// Reads a spec ("topkc:fraction=0.1"), "auto", or "auto:of=A+B+..." ('+'
  /// between the candidates' specs). Throws invalid_argument naming what is
  /// wrong.
  static compressor_choice parse(std::string_view text) {
    if (text == "auto") return automatic(default_candidates());
    constexpr std::string_view prefix = "auto:of=";
    if (!text.starts_with(prefix)) return compressor_spec::parse(text);
    std::string_view rest = text.substr(prefix.size());
    std::vector<compressor_spec> candidates;
    while (!rest.empty()) {
      std::size_t const plus = rest.find('+');
      candidates.push_back(compressor_spec::parse(rest.substr(0, plus)));
      rest = plus == std::string_view::npos ? std::string_view{} : rest.substr(plus + 1);
    }
    GRADCOMP_EXPECTS(!candidates.empty(), "compressor_choice: '" + std::string(text) + "' names no candidate");
    return automatic(std::move(candidates));
  }

  /// Whether the planner chooses.
  bool is_automatic() const { return !candidates_.empty(); }
  /// The fixed compressor (invalid_argument where the planner chooses).
  compressor_spec const& spec() const {
    GRADCOMP_EXPECTS(!is_automatic(), "compressor_choice: '" + str() +
                                          "' is the planner's to choose (choose_compressors, plan_compression)");
    return spec_;
  }
  /// The planner's candidates (empty for a fixed compressor).
  std::vector<compressor_spec> const& candidates() const { return candidates_; }

  /// The choice as parse() reads it, candidates in their canonical form.
  std::string str() const {
    if (!is_automatic()) return spec_.str();
    std::string out = "auto:of=";
    for (std::size_t k = 0; k < candidates_.size(); ++k) out.append(k == 0 ? "" : "+").append(candidates_[k].str());
    return out;
  }

 private:
  compressor_spec spec_{};
  std::vector<compressor_spec> candidates_;
};

}  // namespace gradcomp
