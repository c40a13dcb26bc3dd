// The plan as text (compression_plan::table): the networks' fitted lines,
// a table per bucket with each candidate's predicted times against bf16's,
// what the comparison weighed, and the verdict.
#pragma once

#include <gradcomp/planning/plan.hpp>

#include <cstdio>
#include <map>
#include <string>

namespace gradcomp::inline GRADCOMP_ABI {

/// The plan as text: the network's lines, then a table per bucket and a
/// verdict.
inline std::string compression_plan::table(std::size_t first_bucket) const {
  char line[256];
  auto const links = [&](network_model const& model, std::string const& what) {
    std::string out = what + ", t = latency + bytes / bandwidth:\n";
    for (auto const& l : model.links) {
      double const bw = l.fit.seconds_per_byte > 0 ? 1.0 / l.fit.seconds_per_byte / 1e9 : 0.0;
      std::snprintf(line, sizeof line, "  %-14s %-9s latency %9.1f us, bandwidth %8.3f GB/s%s\n", name_of(l.op),
                    std::string(name_of(l.type)).c_str(), l.fit.latency * 1e6, bw, bw == 0 ? " (not seen)" : "");
      out += line;
    }
    return out;
  };
  std::string out =
      node_network.ranks == 0
          ? links(network, "Network (" + std::to_string(network.ranks) + " ranks)")
          : links(node_network, "Inside a node (" + std::to_string(node_network.ranks) + " ranks)") +
                links(network, "Across nodes (" + std::to_string(network.ranks) + " nodes, a rank of each)");
  bool any_pays = false;
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    auto const& c = buckets[b];
    std::snprintf(line, sizeof line, "Bucket %zu (%zu elements%s):\n  %-28s %10s %10s %10s %12s %9s\n",
                  first_bucket + b, c.elements, sharded ? ", reduce-scattered" : "", "candidate", "local ms", "comm ms",
                  "total ms", "wire bytes", "vs bf16");
    out += line;
    for (std::size_t r = 0; r < c.rows.size(); ++r) {
      auto const& row = c.rows[r];
      if (!row.refused.empty()) {
        out += "  " + row.spec + ": left out, " + row.refused + "\n";
        continue;
      }
      std::snprintf(line, sizeof line, "  %-28s %10.3f %10.3f %10.3f %12zu %8.2fx%s%s\n", row.spec.c_str(),
                    row.local * 1e3, row.communication * 1e3, row.total() * 1e3, row.wire_bytes,
                    c.score(row) / c.score(c.rows[c.baseline]), row.allowed ? "" : " (reference)",
                    r == c.chosen ? "  <- chosen" : "");
      out += line;
    }
    any_pays |= c.pays();
  }
  // What each "vs bf16" weighed beside the rows' totals: the step's other work, steps factors.
  double compute = 0;
  std::map<std::string, double> factors;
  for (auto const& c : buckets) {
    compute += c.compute;
    for (auto const& row : c.rows)
      if (row.factor != 1) factors[row.spec] = row.factor;
  }
  bool const to_target = !factors.empty();
  if (to_target || compute > 0) {
    std::snprintf(line, sizeof line, "vs bf16: (total + the bucket's share of the step's other %.3f ms)",
                  compute * 1e3);
    out += line;
    char const* between = ", x steps to target: ";
    for (auto const& [spec, factor] : factors) {
      std::snprintf(line, sizeof line, "%s%s %.2f", between, spec.c_str(), factor);
      out += line;
      between = ", ";
    }
    out += "\n";
  }
  char const* what = to_target ? "time to target" : "step time, not convergence";
  out += any_pays ? std::string("Compression pays on some buckets here (predicted ") + what + ").\n"
                  : std::string(
                        "Compression does not pay here: none is predicted to save enough of bf16's time on "
                        "any bucket (") +
                        what + ").\n";
  return out;
}

}  // namespace gradcomp
