// The model reducer's central property, over any world (in-process ranks,
// mpiexec): results are bitwise those of reducing each bucket after the
// backward pass, whatever order each rank marks its gradients ready in, and
// every rank holds the same bits.
#pragma once

#include "harness.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>

namespace gradcomp::testing {

using shapes_t = std::vector<std::vector<std::size_t>>;

// An MLP's parameters in backward order: the last layer's weight and bias first.
inline shapes_t mlp_shapes() { return {{10, 64}, {10}, {64, 128}, {64}, {128, 300}, {128}, {300, 50}, {300}}; }

inline model_reducer_options small_buckets() {
  model_reducer_options o;
  o.compressor = compressor_spec::parse("topkc:fraction=0.25,chunk_size=16");
  o.bucket_cap_bytes = 40000 * sizeof(float);
  o.first_bucket_cap_bytes = 600 * sizeof(float);
  o.min_compression_elements = 1000;
  return o;
}

inline std::vector<float> fill(std::uint64_t seed, int rank, std::vector<std::size_t> const& shape) {
  std::size_t n = 1;
  for (std::size_t e : shape) n *= e;
  return random_gradient(seed, rank, n);
}

// One step of a model reducer on fresh gradients (parameter p's seeded by
// seed + p and the rank), marked ready in backward order; the reduced
// gradients, parameter after parameter.
template <class Reducer>
std::vector<float> reduced_step(Reducer& reducer, shapes_t const& shapes, std::uint64_t seed, int rank) {
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    auto const g = fill(seed + p, rank, shapes[p]);
    std::memcpy(reducer.gradient(p).data(), g.data(), g.size() * sizeof(float));
    reducer.mark_ready(p);
  }
  reducer.finish();
  std::vector<float> out;
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    auto const g = reducer.gradient(p);
    out.insert(out.end(), g.begin(), g.end());
  }
  return out;
}

}  // namespace gradcomp::testing

TEST_CASE_TEMPLATE_DEFINE("results are bitwise those of reducing after the backward pass, in any ready order", Setup,
                          model_any_order) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  shapes_t const shapes = mlp_shapes();
  for (bool overlap : {true, false}) {
    typename Setup::world{}.run([&](auto& comm) {
      using Collective = std::remove_reference_t<decltype(comm)>;
      model_reducer_options options = small_buckets();
      options.overlap = overlap;
      model_reducer<Collective, host_space> reducer(shapes, comm, options);
      // The reference: each bucket's allreducer, reduced in bucket order after the whole backward pass.
      std::vector<std::unique_ptr<any_allreducer<Collective, host_space>>> plain;
      for (std::size_t b = 0; b < reducer.buckets(); ++b) {
        bucket_layout layout;
        for (std::size_t p : reducer.parameters_of(b)) layout.add(shapes[p]);
        allreducer_options o;
        o.bucket = b;
        plain.push_back(std::make_unique<any_allreducer<Collective, host_space>>(reducer.bucket(b).spec(), comm,
                                                                                 std::move(layout), host_space{}, o));
      }
      std::mt19937_64 order_rng(shared_seed(comm) + static_cast<std::uint64_t>(comm.rank()));
      for (int step = 0; step < 3; ++step) {
        std::vector<std::size_t> order(shapes.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), order_rng);  // a different order on every rank
        for (std::size_t p : order) {
          auto const g = fill(100 + step * 10 + p, comm.rank(), shapes[p]);
          std::memcpy(reducer.gradient(p).data(), g.data(), g.size() * sizeof(float));
          reducer.mark_ready(p);
        }
        reducer.finish();
        std::vector<float> all;
        for (std::size_t b = 0; b < reducer.buckets(); ++b) {
          std::vector<float> bucket;
          for (std::size_t p : reducer.parameters_of(b)) {
            auto const g = fill(100 + step * 10 + p, comm.rank(), shapes[p]);
            bucket.insert(bucket.end(), g.begin(), g.end());
          }
          (*plain[b])({bucket.data(), bucket.size()});
          std::size_t at = 0;
          for (std::size_t p : reducer.parameters_of(b)) {
            auto const got = reducer.gradient(p);
            INFO("overlap " << overlap << ", step " << step << ", bucket " << b << ", parameter " << p);
            CHECK(std::memcmp(got.data(), bucket.data() + at, got.size() * sizeof(float)) == 0);
            all.insert(all.end(), got.begin(), got.end());
            at += got.size();
          }
        }
        CHECK(same_as_rank0(comm, all));
      }
    });
  }
}
