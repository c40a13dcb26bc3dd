// The compressor rows every benchmark binary registers, in one place, so the
// host and CUDA tables hold the same rows side by side. A row is a spec
// string (compressor_spec), built for row_ranks ranks as a run-time choice
// would build it, and named "<space>/<spec>" with the spec as str() writes
// it. A registered compressor without a row of its own below gets one at its
// defaults, so every compressor has a row.
#pragma once

#include "layouts.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

namespace gradcomp::bench {

/// Lanes and wire bytes are those of this many ranks.
inline constexpr int row_ranks = 4;

/// The flat rows (one per gradient size), as specs.
inline constexpr char const* flat_rows[] = {
    "fp32", "bf16", "bf16:ef=on", "fp16",
    // The sparsifiers, with error feedback, at 1% and 0.1% of the elements.
    "topkc:fraction=0.01", "topk:fraction=0.01", "topkc:fraction=0.001", "topk:fraction=0.001",
    // THC: rotation blocks of 256, 1024, 4096 (full rotation) at 2, 4, 8 bits
    // (8 bits takes 32-bit lanes on 4 ranks), then partial rotation: fewer
    // butterfly stages within the 1024-element block.
    "thc:bits=2,block=256", "thc:bits=4,block=256", "thc:bits=8,block=256",     //
    "thc:bits=2,block=1024", "thc:bits=4,block=1024", "thc:bits=8,block=1024",  //
    "thc:bits=2,block=4096", "thc:bits=4,block=4096", "thc:bits=8,block=4096",  //
    "thc:bits=4,block=1024,stages=5", "thc:bits=4,block=1024,stages=3",
    // The integer all-reduce quantizers: QSGD at 4 bits in int8 (no error
    // feedback: it is unbiased, and too noisy at 4 bits for feedback),
    // two-scale QSGD, GlobalRandK (10000 coordinates at 4 bits), IntSGD.
    "qsgd:bits=4", "qsgd_multiscale", "global_randk:bits=4,k=10000", "intsgd"};

/// The rows over a transformer-like bucket: PowerSGD, the bf16 baseline beside it.
inline constexpr char const* transformer_rows[] = {"bf16", "powersgd:matrix_rank=1", "powersgd:matrix_rank=4",
                                                   "powersgd:matrix_rank=16"};

/// The flat rows: those above, then each registered compressor that has none
/// there, at its defaults.
inline std::vector<std::string> flat_row_specs() {
  std::vector<std::string> specs(std::begin(flat_rows), std::end(flat_rows));
  for_each_registered([&]<class C>(std::type_identity<C>) {
    auto in = [](auto const& rows) {
      return std::any_of(std::begin(rows), std::end(rows),
                         [](char const* text) { return compressor_spec::parse(text).name == C::name; });
    };
    if (!in(flat_rows) && !in(transformer_rows)) specs.emplace_back(C::name);
  });
  return specs;
}

/// Registers the rows above under "<space>/<spec>". Registrar provides static
/// add<Compressor, EF>(name, compressor) (a row per flat gradient size) and
/// add_layout<Compressor, EF>(name, layout, compressor) (a row over a shaped
/// bucket).
template <class Registrar>
void register_compressor_rows(std::string const& space) {
  for (std::string const& text : flat_row_specs()) {
    compressor_spec const spec = compressor_spec::parse(text);
    visit_compressor(spec, row_ranks, [&](auto c, auto ef) {
      Registrar::template add<decltype(c), decltype(ef)>(space + "/" + spec.str(), c);
      return 0;
    });
  }
  bucket_layout const transformer = transformer_layout();
  for (char const* text : transformer_rows) {
    compressor_spec const spec = compressor_spec::parse(text);
    visit_compressor(spec, row_ranks, [&](auto c, auto ef) {
      Registrar::template add_layout<decltype(c), decltype(ef)>(space + "/" + spec.str(), transformer, c);
      return 0;
    });
  }
}

}  // namespace gradcomp::bench
