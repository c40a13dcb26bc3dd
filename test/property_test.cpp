// Properties every compressor must have, over 2, 3, 4 and 7 in-process
// ranks, with and without error feedback, on buckets of odd sizes: every
// rank gets bitwise the same output; the same inputs give the same bits;
// error feedback loses nothing over hundreds of steps; a bad value on one
// rank commits nothing under either policy; extreme magnitudes come back
// finite; values beyond 1e38 are carried or refused on every rank; a
// configuration or a call that one rank cannot use fails on every
// rank without a hang (an MPI-like collective with a watchdog); sizes that
// overflow are refused.
#include "common/compressors.hpp"
#include "common/harness.hpp"
#include "common/mpi_like.hpp"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

using namespace gradcomp;
using namespace gradcomp::testing;

TEST_CASE("every compressor gives every rank the same bits, and the same inputs the same bits") {
  for (int ranks : {2, 3, 4, 7}) {
    for_each_compressor([&](auto c, double) {
      using C = decltype(c);
      auto run = [&](auto ef) {
        using EF = decltype(ef);
        std::vector<std::vector<float>> last(ranks);
        local_group::run(ranks, [&](local_group::communicator& comm) {
          host_reducer<C, EF, local_group::communicator> reduce(c, comm, odd_layout(2), host_space{});
          std::size_t const d = reduce.layout().size();
          for (int step = 0; step < 3; ++step) {
            auto g = random_gradient(1000 + step, comm.rank(), d);
            reduce({g.data(), d});
            INFO(C::name << ", " << ranks << " ranks, step " << step);
            CHECK(same_as_rank0(comm, g));
            last[comm.rank()] = g;
          }
        });
        return last;
      };
      auto const a = run(error_feedback::residual{}), b = run(error_feedback::residual{});
      INFO(C::name << ", " << ranks << " ranks");
      CHECK(std::memcmp(a[0].data(), b[0].data(), a[0].size() * sizeof(float)) == 0);
      run(error_feedback::none{});
    });
  }
}

// Outputs written around the cache (host_space::streamed_bytes: by default
// only those beyond tens of MiB; here every one) give the bits ordinary
// stores give, in every compressor's passes, with and without error
// feedback, over steps whose residuals carry on, on buckets that span
// several threads' chunks.
TEST_CASE("streaming stores change no bit of any compressor's step") {
  int const ranks = 2;
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    auto run = [&](auto ef, std::size_t streamed_bytes) {
      using EF = decltype(ef);
      std::vector<std::vector<float>> outputs(ranks);
      local_group::run(ranks, [&](local_group::communicator& comm) {
        host_reducer<C, EF, local_group::communicator> reduce(
            c, comm, odd_layout(100), host_space{.threads = 2, .streamed_bytes = streamed_bytes});
        std::size_t const d = reduce.layout().size();
        for (int step = 0; step < 3; ++step) {
          auto g = random_gradient(2000 + step, comm.rank(), d);
          reduce({g.data(), d});
          outputs[comm.rank()].insert(outputs[comm.rank()].end(), g.begin(), g.end());
        }
      });
      return outputs;
    };
    auto compare = [&](auto ef) {
      auto const streamed = run(ef, 0), stored = run(ef, std::numeric_limits<std::size_t>::max());
      std::string const what = std::string(C::name) + (decltype(ef)::enabled ? " with" : " without");
      INFO(what << " error feedback");
      for (int r = 0; r < ranks; ++r) {
        REQUIRE(streamed[r].size() == stored[r].size());
        CHECK(std::memcmp(streamed[r].data(), stored[r].data(), stored[r].size() * sizeof(float)) == 0);
      }
    };
    compare(error_feedback::residual{});
    compare(error_feedback::none{});
  });
}

// Over many steps, what the ranks output plus what they keep is what they
// had: sum_t out_t + mean_r e_r,T = sum_t mean_r g_r,t, to the rounding of
// each step's sums and decodes (bounded here step by step).
TEST_CASE("error feedback loses nothing over hundreds of steps") {
  for (int ranks : {3, 4}) {
    for_each_compressor([&](auto c, double unit) {
      using C = decltype(c);
      local_group::run(ranks, [&](local_group::communicator& comm) {
        host_reducer<C, error_feedback::residual, local_group::communicator> reduce(c, comm, odd_layout(1),
                                                                                    host_space{});
        std::size_t const d = reduce.layout().size();
        std::vector<double> outputs(d, 0.0), inputs(d, 0.0), bound(d, 0.0);
        for (int step = 0; step < 200; ++step) {
          auto const all = random_gradients(77 + step, ranks, d);
          auto g = all[comm.rank()];
          reduce({g.data(), d});
          for (std::size_t i = 0; i < d; ++i) {
            double mean = 0, magnitude = 0;
            for (auto const& x : all) mean += x[i], magnitude += std::fabs(x[i]);
            outputs[i] += g[i];
            inputs[i] += mean / ranks;
            bound[i] += unit * (std::fabs(g[i]) + magnitude / ranks);
          }
        }
        auto const residual = reduce.residual();
        std::vector<float> mine(residual.begin(), residual.end()), every(d * ranks);
        comm.all_gather(mine.data(), every.data(), d);
        std::size_t lost = 0;
        double worst = 0;
        for (std::size_t i = 0; i < d; ++i) {
          double kept = 0, magnitude = 0;
          for (int r = 0; r < ranks; ++r) kept += every[r * d + i], magnitude += std::fabs(every[r * d + i]);
          double const gap = std::fabs(outputs[i] + kept / ranks - inputs[i]);
          lost += gap <= bound[i] + unit * magnitude / ranks + 1e-30 ? 0 : 1;
          worst = std::max(worst, gap / (bound[i] + 1e-30));
        }
        INFO(C::name << ", " << ranks << " ranks, worst gap / bound " << worst);
        CHECK(lost == 0);
      });
    });
  }
}

// A NaN or an infinity on one rank: under raise every rank throws and the
// gradient, the residual and the step count are as they were; under
// propagate every rank's output is NaN and nothing is committed; either way
// the next clean step works and the ranks agree.
TEST_CASE("a bad value on one rank commits nothing, under either policy") {
  for (int ranks : {2, 7}) {
    for (auto policy : {nonfinite_policy::raise, nonfinite_policy::propagate}) {
      for (float poison : {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
        for_each_compressor([&](auto c, double) {
          using C = decltype(c);
          local_group::run(ranks, [&](local_group::communicator& comm) {
            host_reducer<C, error_feedback::residual, local_group::communicator> reduce(
                c, comm, odd_layout(1), host_space{}, {.nonfinite = policy});
            std::size_t const d = reduce.layout().size();
            auto first = random_gradient(5, comm.rank(), d);
            reduce({first.data(), d});
            auto const kept = std::vector<float>(reduce.residual().begin(), reduce.residual().end());
            auto g = random_gradient(6, comm.rank(), d);
            if (comm.rank() == ranks - 1) g[d / 3] = poison;
            auto const before = g;
            INFO(C::name << ", " << ranks << " ranks, policy " << int(policy));
            if (policy == nonfinite_policy::raise) {
              CHECK_THROWS_AS(reduce({g.data(), d}), nonfinite_error);
              CHECK(std::memcmp(g.data(), before.data(), d * sizeof(float)) == 0);  // -0.0 stays -0.0 too
            } else {
              CHECK_NOTHROW(reduce({g.data(), d}));
              CHECK(std::all_of(g.begin(), g.end(), [](float x) { return std::isnan(x); }));
            }
            auto const residual = reduce.residual();
            CHECK(std::memcmp(residual.data(), kept.data(), d * sizeof(float)) == 0);
            CHECK(reduce.steps() == 1);
            auto clean = random_gradient(7, comm.rank(), d);
            CHECK_NOTHROW(reduce({clean.data(), d}));
            CHECK(std::all_of(clean.begin(), clean.end(), [](float x) { return std::isfinite(x); }));
            CHECK(same_as_rank0(comm, clean));
            CHECK(reduce.steps() == 2);
          });
        });
      }
    }
  }
}

// Gradients near 1e-30 and 1e30 come back as accurately as gradients near 1
// (norms are doubles); denormals, zeros and single spikes come back finite,
// zeros as zeros.
TEST_CASE("extreme magnitudes come back finite and as accurate as ordinary ones") {
  int const ranks = 3;
  for_each_compressor([&](auto c, double) {
    using C = decltype(c);
    local_group::run(ranks, [&](local_group::communicator& comm) {
      std::size_t const d = odd_layout(2).size();
      auto error_at = [&](float scale, std::size_t spike) {
        host_reducer<C, error_feedback::none, local_group::communicator> reduce(c, comm, odd_layout(2), host_space{},
                                                                                {.seed = 9});
        auto all = random_gradients(31, ranks, d);
        for (auto& x : all)
          for (auto& v : x) v *= scale;
        if (spike < d) all[0][spike] = 1e30f;
        auto g = all[comm.rank()];
        reduce({g.data(), d});
        double err = 0, norm = 0;
        std::size_t nonfinite = 0;
        for (std::size_t i = 0; i < d; ++i) {
          double mean = 0;
          for (auto const& x : all) mean += x[i];
          mean /= ranks;
          err += (g[i] - mean) * (g[i] - mean);
          norm += mean * mean;
          nonfinite += std::isfinite(g[i]) ? 0 : 1;
        }
        INFO(C::name << " at scale " << scale << ", spike at " << spike);
        CHECK(nonfinite == 0);
        return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
      };
      double const ordinary = error_at(1.0f, d);
      INFO(C::name << ": error " << ordinary << " at scale 1");
      if constexpr (std::is_same_v<C, fp16>) {                 // fp16's own range: 6e-8 to 65504
        CHECK(error_at(1e-30f, d) == doctest::Approx(1.0));    // underflows to zero (kept by error feedback)
        CHECK_THROWS_AS(error_at(1e30f, d), nonfinite_error);  // beyond the lane: refused
      } else {
        CHECK(error_at(1e-30f, d) <= 1.5 * ordinary + 1e-3);
        CHECK(error_at(1e30f, d) <= 1.5 * ordinary + 1e-3);
        error_at(1e-41f, d);    // denormals: finite (a compressor may send zeros)
        error_at(1.0f, d / 2);  // one spike
      }
      CHECK(error_at(0.0f, d) == 0.0);  // zeros in, zeros out
    });
  });
}

// Finite values at the top of float's range (1e38 to its largest value),
// everywhere or as one spike in N(0, 1) noise: a step either carries them
// (every output and residual finite) or every rank refuses it as the
// non-finite protocol does (raise: nonfinite_error, the gradient unchanged;
// propagate: NaN everywhere), committing nothing. Never an infinity, never
// ranks that disagree; the next clean step works or is refused alike.
TEST_CASE("values beyond 1e38 are carried or refused on every rank, never returned infinite") {
  float const values[] = {1e38f, 1.5e38f, 3e38f, std::numeric_limits<float>::max()};
  for (int ranks : {2, 3, 4, 7}) {
    for (auto policy : {nonfinite_policy::raise, nonfinite_policy::propagate}) {
      for_each_compressor([&](auto c, double) {
        using C = decltype(c);
        auto run = [&](auto ef) {
          using EF = decltype(ef);
          local_group::run(ranks, [&](local_group::communicator& comm) {
            host_reducer<C, EF, local_group::communicator> reduce(c, comm, odd_layout(1), host_space{},
                                                                  {.nonfinite = policy});
            std::size_t const d = reduce.layout().size();
            auto kept = [&] {
              if constexpr (EF::enabled)
                return std::vector<float>(reduce.residual().begin(), reduce.residual().end());
              else
                return std::vector<float>{};
            };
            auto all_finite = [](std::vector<float> const& x) {
              return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
            };
            // One step of g, checked against the protocol; true when refused.
            auto checked_step = [&](std::vector<float> g, char const* what) {
              auto const before = g, residual = kept();
              std::uint64_t const steps = reduce.steps();
              int refused = 0;
              if (policy == nonfinite_policy::raise) {
                try {
                  reduce({g.data(), d});
                } catch (nonfinite_error const&) {
                  refused = 1;
                  CHECK(std::memcmp(g.data(), before.data(), d * sizeof(float)) == 0);
                }
              } else {
                reduce({g.data(), d});
                refused = std::isnan(g[0]) ? 1 : 0;
                if (refused) CHECK(std::all_of(g.begin(), g.end(), [](float v) { return std::isnan(v); }));
              }
              int every[8] = {};
              comm.all_gather(&refused, every, 1);
              INFO(C::name << ", " << ranks << " ranks, policy " << int(policy) << ", ef " << EF::enabled << ": "
                           << std::string(what) << (refused ? " (refused)" : " (carried)"));
              CHECK(std::count(every, every + ranks, refused) == ranks);
              if (refused) {
                CHECK(reduce.steps() == steps);
                CHECK(kept() == residual);
              } else {
                CHECK(all_finite(g));
                CHECK(all_finite(kept()));
                CHECK(same_as_rank0(comm, g));
                CHECK(reduce.steps() == steps + 1);
              }
              return refused;
            };
            checked_step(random_gradient(41, comm.rank(), d), "a first clean step");
            for (float v : values) {
              bool const refused = checked_step(std::vector<float>(d, v), "every value at v");
              // A mean of max(float) everywhere: beyond every lane and carried
              // norm; IntSGD alone clips it (its scale comes from past steps).
              INFO(C::name << ", " << ranks << " ranks, ef " << EF::enabled);
              if (v == values[3] && !std::is_same_v<C, intsgd<>>) CHECK(refused);
              checked_step(random_gradient(42, comm.rank(), d), "a clean step after it");
              auto spike = random_gradient(43, comm.rank(), d);
              for (auto& x : spike) x = std::clamp(x, -4.0f, 4.0f);
              if (comm.rank() == ranks - 1) spike[d / 2] = v;
              checked_step(spike, "one spike of v in noise");
              checked_step(random_gradient(44, comm.rank(), d), "a clean step after it");
            }
          });
        };
        run(error_feedback::residual{});
        run(error_feedback::none{});
      });
    }
  }
}

// Over a collective where a failing rank releases nobody, a configuration or
// a call that only one rank cannot use must still end on every rank.
TEST_CASE("what one rank cannot use fails on every rank, and nobody hangs") {
  auto expect_all_fail = [](std::vector<std::exception_ptr> const& errors, char const* what) {
    for (std::size_t r = 0; r < errors.size(); ++r) {
      INFO(what << ", rank " << r << ": " << message_of(errors[r]));
      CHECK(errors[r] != nullptr);
      CHECK_FALSE(is_hang(errors[r]));
    }
  };
  using comm_t = mpi_like_group::communicator;
  expect_all_fail(mpi_like_group::run(3,
                                      [](comm_t& comm) {
                                        host_reducer<topkc<>, error_feedback::residual, comm_t> r(
                                            topkc<>{.fraction = comm.rank() == 0 ? 1.5 : 0.1}, comm,
                                            bucket_layout(4096), host_space{});
                                      }),
                  "a TopK-Chunked fraction on one rank");
  expect_all_fail(mpi_like_group::run(3,
                                      [](comm_t& comm) {
                                        host_reducer<thc<>, error_feedback::residual, comm_t> r(
                                            thc<>{.bits = comm.rank() == 1 ? 8 : 4}, comm, bucket_layout(4096),
                                            host_space{});
                                      }),
                  "a THC lane one rank's levels overflow");
  expect_all_fail(mpi_like_group::run(3,
                                      [](comm_t& comm) {
                                        host_reducer<global_randk<>, error_feedback::residual, comm_t> r(
                                            global_randk<>{.k = 1000}, comm,
                                            bucket_layout(comm.rank() == 2 ? 500 : 2000), host_space{});
                                      }),
                  "a GlobalRandK k beyond one rank's bucket");
  expect_all_fail(mpi_like_group::run(3,
                                      [](comm_t& comm) {
                                        host_reducer<bf16, error_feedback::residual, comm_t> r(
                                            bf16{}, comm, bucket_layout(1000), host_space{});
                                        std::vector<float> g(comm.rank() == 0 ? 999 : 1000, 1.0f);
                                        r({g.data(), g.size()});
                                      }),
                  "a gradient of the wrong length on one rank");
  expect_all_fail(mpi_like_group::run(3,
                                      [](comm_t& comm) {
                                        host_reducer<bf16, error_feedback::residual, comm_t> r(
                                            bf16{}, comm, bucket_layout(1000), host_space{}, {.warmup_steps = 1});
                                        std::vector<float> g(comm.rank() == 1 ? 1001 : 1000, 1.0f);
                                        r({g.data(), g.size()});
                                      }),
                  "a gradient of the wrong length on one rank, in warm-up");
  expect_all_fail(mpi_like_group::run(3,
                                      [](comm_t& comm) {
                                        host_reducer<fp16, error_feedback::none, comm_t> r(
                                            fp16{}, comm, bucket_layout(1000), host_space{});
                                        auto g = random_gradient(5, comm.rank(), 1000);
                                        if (comm.rank() == 0) g[999] = std::numeric_limits<float>::infinity();
                                        r({g.data(), g.size()});
                                      }),
                  "an infinity on one rank, through fp16");
  expect_all_fail(mpi_like_group::run(4,
                                      [](comm_t& comm) {
                                        host_reducer<intsgd<>, error_feedback::residual, comm_t> r(
                                            intsgd<>{}, comm, bucket_layout(1000), host_space{});
                                        auto g = random_gradient(3, comm.rank(), 1000);
                                        if (comm.rank() == 3) g[7] = std::numeric_limits<float>::quiet_NaN();
                                        r({g.data(), g.size()});
                                      }),
                  "a NaN on one rank");
  // And the good case completes on every rank, over the same collective.
  auto const fine = mpi_like_group::run(3, [](comm_t& comm) {
    host_reducer<powersgd<>, error_feedback::residual, comm_t> r(powersgd<>{}, comm, odd_layout(1), host_space{});
    auto g = random_gradient(4, comm.rank(), r.layout().size());
    r({g.data(), g.size()});
  });
  for (auto const& e : fine) CHECK(message_of(e) == "");
}

// On the host a cast's step is one all-reduce: its agreement rides in the
// payload, two lanes after the bucket's elements. Ranks that refuse or find
// bad values are counted in those lanes, and every rank fails the step.
TEST_CASE("on the host a cast's agreement rides in its payload's all-reduce") {
  std::size_t const d = 1000;
  auto calls_of_a_step = [&](auto compressor, auto aggregator, std::uint64_t warmup) {
    dry_run<> dry(0, 4);
    allreducer<decltype(compressor), error_feedback::residual, dry_run<>, decltype(aggregator), host_space> r(
        compressor, dry, bucket_layout(d), host_space{}, {.warmup_steps = warmup});
    dry.clear();
    auto g = random_gradient(6, 0, d);
    r({g.data(), d});
    return dry.calls();
  };
  using calls = std::vector<collective_call>;
  CHECK(calls_of_a_step(bf16{}, allreduce_aggregator{}, 0) ==
        calls{{collective_op::all_reduce, dtype::bfloat16, d + 2}});
  CHECK(calls_of_a_step(fp16{}, allreduce_aggregator{}, 0) ==
        calls{{collective_op::all_reduce, dtype::float16, d + 2}});
  CHECK(calls_of_a_step(bf16{}, allreduce_aggregator{}, 1) ==
        calls{{collective_op::all_reduce, dtype::float32, d + 2}});
  CHECK(calls_of_a_step(bf16{}, allgather_aggregator{}, 0) ==
        calls{{collective_op::all_reduce, dtype::uint64, 1}, {collective_op::all_gather, dtype::bfloat16, d}});

  // Two ranks of four find bad values, or one refuses: all four learn how many.
  auto what_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (std::exception const& e) {
      return e.what();
    }
    return "(nothing thrown)";
  };
  std::vector<std::string> messages(4);
  local_group::run(4, [&](local_group::communicator& comm) {
    host_reducer<bf16, error_feedback::residual, local_group::communicator> r(bf16{}, comm, bucket_layout(d),
                                                                              host_space{});
    auto g = random_gradient(7, comm.rank(), d), before = g;
    if (comm.rank() % 2 == 1) g[comm.rank()] = g[d - 1] = std::numeric_limits<float>::quiet_NaN();
    auto const bad = g;
    messages[static_cast<std::size_t>(comm.rank())] = what_of([&] { r({g.data(), d}); });
    CHECK(std::memcmp(g.data(), bad.data(), d * sizeof(float)) == 0);  // the gradient as it was
    std::vector<float> wrong(comm.rank() == 2 ? d - 1 : d, 1.0f);
    std::string const refused = what_of([&] { r({wrong.data(), wrong.size()}); });
    CHECK(refused.find(comm.rank() == 2 ? "999 elements" : "1 rank(s) refused") != std::string::npos);
    CHECK(r.steps() == 0);
    r({before.data(), d});  // and the next step works
    CHECK(r.steps() == 1);
  });
  for (int rank = 0; rank < 4; ++rank) {
    INFO(messages[static_cast<std::size_t>(rank)]);
    CHECK(messages[static_cast<std::size_t>(rank)].find("on 2 rank(s) (" + std::to_string(rank % 2 == 1 ? 2 : 0) +
                                                        " on rank " + std::to_string(rank) + ")") != std::string::npos);
  }
}

// Whether ASan's or TSan's allocator serves new: GCC says so by a macro,
// clang (before 16) by __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define GRADCOMP_TEST_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define GRADCOMP_TEST_SANITIZED_ALLOCATOR 1
#endif
#endif
#ifndef GRADCOMP_TEST_SANITIZED_ALLOCATOR
#define GRADCOMP_TEST_SANITIZED_ALLOCATOR 0
#endif

TEST_CASE("sizes that would wrap are refused with a clear error") {
  CHECK_THROWS_WITH_AS(bucket_layout({{std::size_t{1} << 32, std::size_t{1} << 32}}),
                       doctest::Contains("overflows a 64-bit size"), invalid_argument);
  CHECK_THROWS_WITH_AS(bucket_layout(std::size_t{1} << 62), doctest::Contains("exceed what a buffer can address"),
                       invalid_argument);
  bucket_layout twice;
  twice.add({std::size_t{1} << 60});
  CHECK_THROWS_AS(twice.add({std::size_t{1} << 60}), invalid_argument);
  local_group::run(2, [](local_group::communicator& comm) {
    CHECK_THROWS_WITH_AS((host_reducer<topkc<>, error_feedback::residual, local_group::communicator>(
                             topkc<>{.chunk_size = std::size_t{1} << 63}, comm, bucket_layout(1000), host_space{})),
                         doctest::Contains("not a power of two in [1, 2^30]"), invalid_argument);
#if !GRADCOMP_TEST_SANITIZED_ALLOCATOR  // (a sanitizer's allocator aborts on an exabyte instead of throwing bad_alloc)
    CHECK_THROWS_WITH_AS((host_reducer<bf16, error_feedback::residual, local_group::communicator>(
                             bf16{}, comm, bucket_layout(std::size_t{1} << 58), host_space{})),
                         doctest::Contains("cannot use this configuration"), invalid_argument);
#endif
  });
}

// A workspace does not depend on a setting the user can change later.
TEST_CASE("changing the OpenMP thread count after construction changes nothing") {
#if GRADCOMP_HAS_OPENMP
  int const before = omp_get_max_threads();
  local_group::run(1, [](local_group::communicator& comm) {
    host_reducer<topkc<>, error_feedback::residual, local_group::communicator> a(topkc<>{.chunk_size = 8}, comm,
                                                                                 bucket_layout(1 << 21), host_space{});
    host_reducer<topk<>, error_feedback::residual, local_group::communicator> b(topk<>{}, comm, bucket_layout(1 << 21),
                                                                                host_space{});
    omp_set_num_threads(8 * omp_get_num_procs());
    auto g = random_gradient(1, 0, 1 << 21), h = g;
    CHECK_NOTHROW(a({g.data(), g.size()}));
    CHECK_NOTHROW(b({h.data(), h.size()}));
  });
  omp_set_num_threads(before);
#endif
}

// Two buckets of the same shapes draw different random numbers unless told
// to share a seed; the same bucket draws the same ones.
TEST_CASE("buckets round with their own random streams") {
  local_group::run(1, [](local_group::communicator& comm) {
    auto residual_of = [&](std::uint64_t bucket, std::optional<std::uint64_t> seed) {
      host_reducer<thc<>, error_feedback::residual, local_group::communicator> r(
          thc<>{.block = 64, .bits = 2}, comm, bucket_layout(4096), host_space{}, {.bucket = bucket, .seed = seed});
      auto g = random_gradient(2, 0, 4096);
      r({g.data(), g.size()});
      auto const e = r.residual();
      return std::vector<float>(e.begin(), e.end());
    };
    CHECK(residual_of(0, {}) != residual_of(1, {}));
    CHECK(residual_of(0, {}) == residual_of(0, {}));
    CHECK(residual_of(0, 5) == residual_of(1, 5));
  });
}

// A collective every rank completed is not reported as failed because a
// peer aborted right after it.
TEST_CASE("local_group never fails a collective that completed") {
  for (int trial = 0; trial < 200; ++trial) {
    local_group group(3);
    std::vector<int> failed(3, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] {
        auto comm = group.comm(r);
        float x = 1.0f;
        try {
          comm.all_reduce(&x, &x, 1, reduce_op::sum);
        } catch (collective_error const&) {
          failed[r] = 1;
        }
        if (r == 0) comm.abort("rank 0 is done");
      });
    for (auto& t : threads) t.join();
    CHECK(failed == std::vector<int>{0, 0, 0});
  }
}
