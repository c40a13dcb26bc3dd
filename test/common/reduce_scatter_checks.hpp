// Checks that flat and two-level reduce-scatterers share: the same contract
// for bad input, whatever the topology.
#pragma once

#include "harness.hpp"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace gradcomp::testing {

/// Drives `rs` (a host reduce-scatterer of THC, block 64, over a bucket of
/// 1000 elements, on this `rank`) through bad steps: a NaN on rank
/// `nan_rank`, then a wrong shard size and a wrong gradient size on rank
/// `wrong_rank`. Each fails on
/// every rank (nobody hangs), moves no residual and writes no shard; the next
/// good step goes through.
template <class Scatterer>
void check_bad_steps_fail_everywhere(Scatterer& rs, int rank, int nan_rank, int wrong_rank) {
  auto same = [](std::vector<float> const& a, float const* b) {
    return std::memcmp(a.data(), b, a.size() * sizeof(float)) == 0;
  };
  auto g = random_gradient(3, rank, 1000);
  std::vector<float> shard(rs.shard_size());
  rs({g.data(), g.size()}, {shard.data(), shard.size()});
  std::vector<float> const before(rs.residual().begin(), rs.residual().end());
  auto const kept_shard = shard;

  auto bad = random_gradient(4, rank, 1000);
  if (rank == nan_rank) bad[17] = std::nanf("");  // one element of rank 0's shard or part: every step fails
  CHECK_THROWS_AS(rs({bad.data(), bad.size()}, {shard.data(), shard.size()}), nonfinite_error);
  CHECK(rs.steps() == 1);
  CHECK(same(before, rs.residual().data()));
  CHECK(same(kept_shard, shard.data()));

  std::vector<float> wrong(rs.shard_size() + 1);
  g = random_gradient(5, rank, 1000);
  std::string const named = "a shard of " + std::to_string(wrong.size());
  if (rank == wrong_rank)
    CHECK_THROWS_WITH(rs({g.data(), g.size()}, {wrong.data(), wrong.size()}), doctest::Contains(named.c_str()));
  else
    CHECK_THROWS(rs({g.data(), g.size()}, {shard.data(), shard.size()}));  // the others fail too: nobody hangs
  CHECK(rs.steps() == 1);
  CHECK(same(before, rs.residual().data()));

  std::vector<float> short_gradient(999);  // a wrong gradient, on the same rank
  if (rank == wrong_rank)
    CHECK_THROWS_WITH(rs({short_gradient.data(), short_gradient.size()}, {shard.data(), shard.size()}),
                      doctest::Contains("a gradient of 999 elements"));
  else
    CHECK_THROWS(rs({g.data(), g.size()}, {shard.data(), shard.size()}));
  CHECK(rs.steps() == 1);
  CHECK(same(before, rs.residual().data()));
  rs({g.data(), g.size()}, {shard.data(), shard.size()});  // and the next good step goes through
  CHECK(rs.steps() == 2);
}

}  // namespace gradcomp::testing
