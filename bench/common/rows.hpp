// The compressor rows every benchmark binary registers, in one place, so the
// host and CUDA tables hold the same rows side by side.
#pragma once

#include "layouts.hpp"

#include <gradcomp/gradcomp.hpp>

#include <string>

namespace gradcomp::bench {

/// Registers the rows of every compressor under "<space>/<name>".
/// Registrar provides static add<Compressor, EF>(name, compressor) (a row per
/// flat gradient size) and add_layout<Compressor, EF>(name, layout,
/// compressor) (a row over a shaped bucket).
template <class Registrar>
void register_compressor_rows(std::string const& space) {
  using none = error_feedback::none;
  using residual = error_feedback::residual;
  Registrar::template add<fp32, none>(space + "/fp32", {});
  Registrar::template add<bf16, none>(space + "/bf16", {});
  Registrar::template add<bf16, residual>(space + "/bf16+ef", {});
  Registrar::template add<fp16, none>(space + "/fp16", {});
  // The sparsifiers, with error feedback, at 1% and 0.1% of the elements.
  for (double fraction : {0.01, 0.001}) {
    std::string const pct = fraction == 0.01 ? "@1%" : "@0.1%";
    Registrar::template add<topk_chunked<>, residual>(space + "/topkc" + pct, {.fraction = fraction});
    Registrar::template add<topk<bfloat16>, residual>(space + "/topk" + pct, {.fraction = fraction});
  }
  // THC: rotation blocks of 256, 1024, 4096 (full rotation) at 2, 4, 8 bits
  // (8 bits needs 32-bit lanes to sum 4 ranks), then partial rotation: fewer
  // butterfly stages within the 1024-element block.
  for (std::size_t block : {256, 1024, 4096}) {
    std::string const b = "-B" + std::to_string(block);
    Registrar::template add<thc<>, residual>(space + "/thc2" + b, {.block = block, .bits = 2});
    Registrar::template add<thc<>, residual>(space + "/thc4" + b, {.block = block, .bits = 4});
    Registrar::template add<thc<std::int32_t>, residual>(space + "/thc8" + b, {.block = block, .bits = 8});
  }
  for (int stages : {5, 3})
    Registrar::template add<thc<>, residual>(space + "/thc4-B1024-s" + std::to_string(stages),
                                             {.block = 1024, .stages = stages, .bits = 4});
  // The integer all-reduce quantizers: QSGD-MaxNorm at 4 bits in int8 (no
  // error feedback: it is unbiased, and too noisy at 4 bits for feedback),
  // two-scale QSGD (6 and 10 bits, int8 codes plus a uint8 scale index),
  // GlobalRandK (10000 coordinates, then QSGD-MaxNorm), IntSGD in int8.
  Registrar::template add<qsgd_maxnorm<>, none>(space + "/qsgd4", {.bits = 4});
  Registrar::template add<qsgd_multiscale, residual>(space + "/qsgd-ms6+10", {});
  Registrar::template add<global_randk<>, residual>(space + "/randk10k-qsgd4", {.k = 10000, .bits = 4});
  Registrar::template add<intsgd<>, residual>(space + "/intsgd8", {});
  // PowerSGD on a transformer-like bucket, the bf16 baseline beside it.
  bucket_layout const transformer = transformer_layout();
  Registrar::template add_layout<bf16, none>(space + "/bf16", transformer, {});
  for (std::size_t rank : {1, 4, 16})
    Registrar::template add_layout<powersgd<>, residual>(space + "/powersgd-r" + std::to_string(rank), transformer,
                                                         {.rank = rank});
}

}  // namespace gradcomp::bench
