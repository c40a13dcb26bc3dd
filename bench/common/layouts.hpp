// Bucket layouts the benchmarks use beyond flat vectors.
#pragma once

#include <gradcomp/bucket_layout.hpp>

namespace gradcomp::bench {

/// A transformer-like bucket: 12 blocks of a 1024 x 1024 projection, a
/// 4096 x 1024 and a 1024 x 4096 feed-forward pair, and their biases
/// (113M values).
inline bucket_layout transformer_layout() {
  bucket_layout layout;
  for (int block = 0; block < 12; ++block)
    layout.add({1024, 1024}).add({1024}).add({4096, 1024}).add({4096}).add({1024, 4096}).add({1024});
  return layout;
}

}  // namespace gradcomp::bench
