// How ranks agree before they act together (construction, a restore): every
// rank gathers every rank's statement (two numbers, and whether and why it
// failed) and reaches the same verdict. So all ranks throw together or none
// does: no rank is left waiting in a collective its peers gave up on, and
// every rank's error names the rank at fault and its reason. The reducers
// agree through it, and so can code that checkpoints state of its own (an
// optimizer's shards) next to theirs.
#pragma once

#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/reducers/detail/checkpoint.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Every rank's statement, on every rank, in world rank order.
class agreement {
 public:
  /// What one rank says.
  struct statement {
    std::uint64_t a, b;  ///< Two numbers the ranks compare (a bucket size, a hash, a step).
    std::uint32_t failed;
    std::uint32_t node;  ///< Two levels: the sender's rank on its rail.
    /// Why it failed: room for a refusal with its bound and its remedy
    /// (set-up only, so 1 KiB a rank costs nothing a step); a longer one is
    /// cut and ends in " [...]".
    char why[1000];
  };
  static_assert(sizeof(statement) == 1024);

  /// Gathers (a, b, failure) from every rank of `world`; `failure` empty
  /// means this rank can go on. Collective.
  template <class Collective, class Space>
  agreement(Collective& world, Space const& space, std::uint64_t a, std::uint64_t b, std::string const& failure)
      : all_(static_cast<std::size_t>(world.size())), self_(world.rank()) {
    buffer<std::uint8_t, Space> exchange((all_.size() + 1) * sizeof(statement), space);
    statement const mine = make(a, b, failure);
    space.from_host(exchange.data(), &mine, sizeof mine);
    world.all_gather(exchange.data(), exchange.data() + sizeof(statement), sizeof(statement));
    space.to_host(all_.data(), exchange.data() + sizeof(statement), all_.size() * sizeof(statement));
  }

  /// The same over a world given as its two levels: this rank's node
  /// (`local`), and its rail across the nodes (`cross`). Rank r of the
  /// result is local rank r % L of the node that is r / L-th on the rail of
  /// local ranks 0: nodes of consecutive ranks (split_nodes with
  /// ranks_per_node) keep their world ranks, and every rank sees one order
  /// even where rails order the nodes differently (nodes detected). Over
  /// dry runs (dry_run), every slot holds this rank's own statement.
  template <class Collective, class Space>
  agreement(Collective& local, Collective& cross, Space const& space, std::uint64_t a, std::uint64_t b,
            std::string const& failure)
      : all_(static_cast<std::size_t>(local.size()) * static_cast<std::size_t>(cross.size())) {
    std::size_t const per_node = static_cast<std::size_t>(local.size());
    std::size_t const node = per_node * sizeof(statement);
    buffer<std::uint8_t, Space> exchange(sizeof(statement) + node + all_.size() * sizeof(statement), space);
    std::uint8_t* const nodes = exchange.data() + sizeof(statement) + node;
    statement const mine = make(a, b, failure, static_cast<std::uint32_t>(cross.rank()));
    space.from_host(exchange.data(), &mine, sizeof mine);
    local.all_gather(exchange.data(), exchange.data() + sizeof(statement), sizeof(statement));
    cross.all_gather(exchange.data() + sizeof(statement), nodes, node);
    std::vector<statement> by_rail(all_.size());
    space.to_host(by_rail.data(), nodes, by_rail.size() * sizeof(statement));
    // Node n of this rail is node `first` of rail 0. A dry run gathers this
    // rank's own statement into every slot, so every node names this one:
    // there the rail's own order stands, and the rank agrees with itself.
    std::size_t const count = by_rail.size() / per_node;
    bool const dry = std::all_of(by_rail.begin(), by_rail.end(),
                                 [&](statement const& s) { return std::memcmp(&s, &mine, sizeof mine) == 0; });
    for (std::size_t n = 0; n < count; ++n) {
      std::size_t const first = dry ? n : by_rail[n * per_node].node;
      if (first >= count) continue;  // (not a node: its slots stay empty, and the ranks disagree)
      std::copy_n(by_rail.begin() + static_cast<std::ptrdiff_t>(n * per_node), per_node,
                  all_.begin() + static_cast<std::ptrdiff_t>(first * per_node));
      if (n == static_cast<std::size_t>(cross.rank())) self_ = static_cast<int>(first * per_node) + local.rank();
    }
  }

  /// Ranks that took part.
  int ranks() const { return static_cast<int>(all_.size()); }
  /// This rank's place among them.
  int self() const { return self_; }
  /// Rank r's statement.
  statement const& of(int r) const { return all_[static_cast<std::size_t>(r)]; }
  /// The first rank that failed, or -1.
  int first_failed() const {
    for (std::size_t r = 0; r < all_.size(); ++r)
      if (all_[r].failed != 0) return static_cast<int>(r);
    return -1;
  }
  /// The first rank whose `a` differs from rank 0's, or -1.
  int first_other_a() const { return first_other(&statement::a); }
  /// The first rank whose `b` differs from rank 0's, or -1.
  int first_other_b() const { return first_other(&statement::b); }
  /// Why rank r failed.
  std::string why(int r) const { return of(r).why; }

 private:
  static statement make(std::uint64_t a, std::uint64_t b, std::string const& failure, std::uint32_t node = 0) {
    statement mine{};
    mine.a = a;
    mine.b = b;
    mine.failed = failure.empty() ? 0 : 1;
    mine.node = node;
    constexpr std::string_view cut = " [...]";
    std::size_t const room = sizeof mine.why - 1;
    if (failure.size() <= room) {
      std::memcpy(mine.why, failure.data(), failure.size());
    } else {
      std::memcpy(mine.why, failure.data(), room - cut.size());
      std::memcpy(mine.why + room - cut.size(), cut.data(), cut.size());
    }
    return mine;
  }
  int first_other(std::uint64_t statement::*field) const {
    for (std::size_t r = 1; r < all_.size(); ++r)
      if (all_[r].*field != all_[0].*field) return static_cast<int>(r);
    return -1;
  }

  std::vector<statement> all_;
  int self_ = 0;
};

namespace detail {
/// The reason rank r gave: whole on rank r itself (`mine` is this rank's
/// own failure), as the agreement carried it (cut to fit) on the others.
inline std::string reason_of(agreement const& all, int r, std::string const& mine) {
  return r == all.self() && !mine.empty() ? mine : all.why(r);
}
}  // namespace detail

/// The verdict on a set-up: if any rank failed, throws invalid_argument on
/// every rank, "WHO: rank r cannot use WHAT: why", r the first rank that
/// failed, so that every rank names the same one. `mine` is this rank's own
/// failure.
inline void expect_none_failed(agreement const& all, std::string const& mine, std::string const& who,
                               std::string const& what) {
  if (int const r = all.first_failed(); r >= 0)
    throw invalid_argument(who + ": rank " + std::to_string(r) + " cannot use " + what + ": " +
                           detail::reason_of(all, r, mine));
}

/// The verdict on a set-up whose statements carry a count in `a` (WHAT's
/// size, in UNITs) and a configuration's hash in `b`: unless all agree,
/// throws invalid_argument on every rank, "WHO: ranks disagree on WHAT: rank
/// 0 has N UNITs, rank r has M" or "WHO: rank r's DIFFERS", r the first rank
/// that differs.
inline void expect_same(agreement const& all, std::string const& who, std::string const& what, std::string const& unit,
                        std::string const& differs) {
  if (int const r = all.first_other_a(); r >= 0)
    throw invalid_argument(who + ": ranks disagree on " + what + ": rank 0 has " + std::to_string(all.of(0).a) + " " +
                           unit + ", rank " + std::to_string(r) + " has " + std::to_string(all.of(r).a));
  if (int const r = all.first_other_b(); r >= 0)
    throw invalid_argument(who + ": rank " + std::to_string(r) + "'s " + differs);
}

/// expect_same for a bucket: its size in elements in `a`.
inline void expect_same_bucket(agreement const& all, std::string const& who, std::string const& differs) {
  expect_same(all, who, "the bucket size", "elements", differs);
}

/// The verdict on a restore whose statements carry each rank's step in `a`:
/// unless every rank can restore its checkpoint and all are of one step,
/// throws checkpoint_error on every rank, naming the first rank that failed
/// (the same on every rank). `mine` is this rank's own failure.
inline void expect_restorable(agreement const& all, std::string const& mine) {
  if (int const r = all.first_failed(); r >= 0)
    throw checkpoint_error("rank " + std::to_string(r) + " cannot restore its checkpoint (" +
                           detail::reason_of(all, r, mine) + "); no rank restored anything");
  if (int const r = all.first_other_a(); r >= 0)
    throw checkpoint_error("the ranks' checkpoints are of different steps (rank 0: " + std::to_string(all.of(0).a) +
                           ", rank " + std::to_string(r) + ": " + std::to_string(all.of(r).a) +
                           "); no rank restored anything");
}

}  // namespace gradcomp::inline GRADCOMP_ABI
