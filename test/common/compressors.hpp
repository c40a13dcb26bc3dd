// Every compressor in one small configuration, for the tests that check a
// property of all of them (property_test, checkpoint_test).
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstddef>

namespace gradcomp::testing {

/// Shapes of odd sizes: a matrix (PowerSGD compresses it), a bias, a 3-D tensor.
inline bucket_layout odd_layout(std::size_t scale) {
  bucket_layout layout;
  layout.add({17 * scale, 23}).add({5 * scale + 2}).add({3, 3, 3});
  return layout;
}

/// Calls f(compressor, unit) for every compressor, small enough for 7 ranks
/// and sanitizers; unit is the roundoff that bounds one step's bookkeeping
/// error (what a lane's sum or a decode rounds away; zero where integers sum
/// exactly).
template <class F>
void for_each_compressor(F&& f) {
  f(fp32{}, 0x1.0p-23);
  f(bf16{}, 0x1.0p-8);
  f(fp16{}, 0x1.0p-10);
  f(topk_chunked<>{.chunk_size = 16, .fraction = 0.2}, 0x1.0p-8);
  f(topk<bfloat16>{.fraction = 0.1}, 0x1.0p-22);
  f(thc<>{.block = 64}, 0x1.0p-16);
  f(qsgd_maxnorm<std::int32_t>{.bits = 8}, 0x1.0p-20);
  f(qsgd_multiscale{}, 0x1.0p-20);
  f(global_randk<>{.k = 40}, 0x1.0p-20);
  f(intsgd<>{}, 0x1.0p-20);
  f(powersgd<>{.rank = 2, .min_compression_rate = 1}, 0x1.0p-18);
}

/// An allreducer on the host space.
template <class C, class EF, class Collective>
using host_reducer = allreducer<C, EF, Collective, default_aggregator_t<C>, host_space>;

}  // namespace gradcomp::testing
