// The network as the user set it up, measured through the backend itself:
// for each operation and wire type a step uses, the time of a call at a few
// sizes, and the line t = latency + bytes x seconds_per_byte through them. A
// call is priced between the measured points that bracket its size.
//
// Every rank times every call (after one warm-up call, each call followed by
// waiting for the space), takes the median of its repeats, and then all ranks
// take the largest median of each size over the ranks (one all-reduce): the
// slowest rank sets a collective's time, and every rank fits bitwise the same
// lines from bitwise the same numbers.
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/collectives/dry_run.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/types.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A call's time as a line in the bytes it moves.
struct link_fit {
  double latency = 0;           ///< Seconds of a call that moves nothing.
  double seconds_per_byte = 0;  ///< The inverse of the bandwidth.
  /// The predicted time of a call that moves `bytes`.
  double seconds(double bytes) const { return latency + bytes * seconds_per_byte; }
};

/// Least squares through (bytes, seconds) points, neither term negative.
inline link_fit fit_line(std::vector<std::pair<double, double>> const& points) {
  double const m = static_cast<double>(points.size());
  double sx = 0, st = 0, sxx = 0, sxt = 0;
  for (auto const& [x, t] : points) sx += x, st += t, sxx += x * x, sxt += x * t;
  double const var = sxx - sx * sx / m;
  link_fit f;
  f.seconds_per_byte = var > 0 ? (sxt - sx * st / m) / var : 0.0;
  f.latency = (st - f.seconds_per_byte * sx) / m;
  if (f.seconds_per_byte < 0) f = {st / m, 0.0};            // (noise: no visible bandwidth term)
  if (f.latency < 0) f = {0.0, sxx > 0 ? sxt / sxx : 0.0};  // (noise: no visible latency)
  return f;
}

/// The bytes a call moves, as the fits count them: the message for an
/// all-reduce or a broadcast, everything a rank receives for an all-gather,
/// and everything a rank sends for a reduce-scatter.
inline double moved_bytes(collective_call const& c, int ranks) {
  double const b = static_cast<double>(c.bytes());
  return c.op == collective_op::all_gather ? b * ranks : b;
}

/// What measure_network measured.
struct network_model {
  /// One operation in one type: its line, and the points it was fit through.
  struct link {
    collective_op op;
    dtype type;
    link_fit fit;
    std::vector<std::pair<double, double>> points;  ///< (bytes moved, seconds): the agreed medians.
  };
  int ranks = 1;            ///< The group's size.
  std::vector<link> links;  ///< In the order asked for.

  /// The link of `op` in `type`, or null where it was not measured.
  link const* find(collective_op op, dtype type) const {
    for (auto const& l : links)
      if (l.op == op && l.type == type) return &l;
    return nullptr;
  }
  /// The predicted time of `call` (invalid_argument where its link was not
  /// measured): between two measured sizes, the line through their points
  /// (a shaped link is not one line: a token bucket passes a burst at line
  /// rate, so small messages cost less than the fit over all sizes says);
  /// below the smallest, its time; above the largest, its time plus the
  /// fit's seconds per byte.
  double seconds(collective_call const& call) const {
    link const* l = find(call.op, call.type);
    GRADCOMP_EXPECTS(l != nullptr, std::string("network_model: no measurement of ") + name_of(call.op) + " in " +
                                       std::string(name_of(call.type)));
    double const x = moved_bytes(call, ranks);
    auto const& p = l->points;  // (in increasing size: measure_network's order)
    if (p.empty()) return l->fit.seconds(x);
    if (x <= p.front().first) return p.front().second;
    for (std::size_t i = 1; i < p.size(); ++i)
      if (x <= p[i].first) {
        double const t = (x - p[i - 1].first) / (p[i].first - p[i - 1].first);
        return p[i - 1].second + t * (p[i].second - p[i - 1].second);
      }
    return p.back().second + (x - p.back().first) * l->fit.seconds_per_byte;
  }
};

/// How measure_network measures.
struct network_options {
  /// Bytes per message (per rank's part for an all-gather), at least two
  /// sizes, in increasing order.
  std::vector<std::size_t> sizes = {8, 4 << 10, 64 << 10, 256 << 10, 1 << 20};
  /// Timed calls per size and link (their median counts).
  int repeats = 3;
};

namespace detail {
/// One call of `op` on `count` elements of T in `room`, waited for (what a
/// call receives lands past what it sends: a reduce-scatter's peers may
/// still read this rank's send).
template <class T, class Collective, class Space>
double timed_call(Collective& c, Space const& space, collective_op op, T* room, std::size_t count) {
  auto const start = std::chrono::steady_clock::now();
  switch (op) {
    case collective_op::all_reduce:
      c.all_reduce(room, room, count, reduce_op::sum);
      break;
    case collective_op::all_gather:
      c.all_gather(room, room + count, count);
      break;
    case collective_op::broadcast:
      c.broadcast(room, count, 0);
      break;
    case collective_op::reduce_scatter:
      if constexpr (reduce_scattering<Collective>)
        c.reduce_scatter(room, room + count, count / static_cast<std::size_t>(c.size()), reduce_op::sum);
      else
        throw invalid_argument("measure_network: this collective cannot reduce-scatter");
      break;
  }
  space.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace detail

/// Measures `links` (operation and type pairs) over `collective` in `space`
/// (see the top of this header). Collective: every rank calls it with the
/// same links and options, and every rank gets bitwise the same model.
/// Where `collective` is one group of several measured at once (a node, a
/// rail), `others` are the groups that join them into the world: the
/// slowest rank's medians are then agreed over those too, and the whole
/// world gets the same model.
/// @note Waits for the space after every call.
template <class Collective, class Space, class... Others>
network_model measure_network(Collective& collective, Space const& space,
                              std::vector<std::pair<collective_op, dtype>> const& links, network_options const& o = {},
                              Others&... others) {
  GRADCOMP_EXPECTS(o.sizes.size() >= 2 && o.repeats >= 1 && std::is_sorted(o.sizes.begin(), o.sizes.end()),
                   "measure_network: at least two sizes, in increasing order, and one repeat");
  int const n = collective.size();
  std::size_t const largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  buffer<std::byte, Space> room(largest * static_cast<std::size_t>(n + 1) + 64, space);
  space.fill_zero(room.data(), room.size());
  std::vector<double> medians;  // link by link, size by size
  std::vector<double> moved;
  for (auto const& wanted : links) {
    collective_op const op = wanted.first;  // (not a structured binding: clang 14 lambdas cannot capture those)
    detail::with_type(wanted.second, [&]<class T>(T) {
      auto* data = reinterpret_cast<T*>(room.data());
      for (std::size_t bytes : o.sizes) {
        // Elements per call: an all-gather's part, a reduce-scatter's whole send (whole blocks).
        std::size_t count = std::max<std::size_t>(1, bytes / sizeof(T));
        if (op == collective_op::reduce_scatter) count = std::max<std::size_t>(1, count / n) * n;
        (void)detail::timed_call(collective, space, op, data, count);  // warm-up
        std::vector<double> times;
        for (int r = 0; r < o.repeats; ++r) times.push_back(detail::timed_call(collective, space, op, data, count));
        auto const middle = times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2);
        std::nth_element(times.begin(), middle, times.end());
        medians.push_back(times[times.size() / 2]);
        moved.push_back(moved_bytes({op, wanted.second, count}, n));
      }
    });
  }
  // The slowest rank's median of each point, on every rank.
  buffer<double, Space> agreed(medians.size(), space);
  space.from_host(agreed.data(), medians.data(), medians.size() * sizeof(double));
  collective.all_reduce(agreed.data(), agreed.data(), medians.size(), reduce_op::max);
  (others.all_reduce(agreed.data(), agreed.data(), medians.size(), reduce_op::max), ...);
  space.to_host(medians.data(), agreed.data(), medians.size() * sizeof(double));
  network_model model;
  model.ranks = n;
  std::size_t k = 0;
  for (auto const& [op, type] : links) {
    network_model::link l{op, type, {}, {}};
    for (std::size_t s = 0; s < o.sizes.size(); ++s, ++k) l.points.emplace_back(moved[k], medians[k]);
    l.fit = fit_line(l.points);
    model.links.push_back(std::move(l));
  }
  return model;
}

}  // namespace gradcomp
