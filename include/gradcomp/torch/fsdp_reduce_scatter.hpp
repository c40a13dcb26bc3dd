// The C++ side of gradcomp's reduce-scatter for FSDP2 (component
// gradcomp::torch): FSDP's flat gradient input, one equal block per rank,
// reduce-scattered to the mean by a compressor that shards (ZeRO++'s qgZ
// idea, for every shardable gradcomp compressor). The Python class
// gradcomp.torch.ReduceScatter is a thin layer over it.
//
// Without PyTorch's headers on the include path this header still compiles,
// and declares fsdp_reduce_scatter without defining it.
#pragma once

#include <gradcomp/collectives/c10d.hpp>

#if !__has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
namespace gradcomp::inline GRADCOMP_ABI {
class fsdp_reduce_scatter;  // defined where PyTorch's headers are found: link gradcomp::torch
}  // namespace gradcomp
#else

#include <gradcomp/execution/host.hpp>
#include <gradcomp/reducers/any_reduce_scatterer.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// One FSDP module's reduce-scatter: input = size() blocks of S values (rank
/// r's block holds its shard of every parameter), output = the mean over
/// the ranks of this rank's block. gradcomp cuts a bucket at its
/// compressor's alignment (THC's block, TopK-Chunked's chunk), so each block
/// is padded with zeros to the shard the reducer makes, S' >= S, and the
/// bucket reduced is size() x S'. Built on the first call and whenever S
/// changes; construction is collective.
class fsdp_reduce_scatter {
 public:
  /// Reduce-scatters over `group` (host tensors, its CPU backend) with the
  /// compressor `spec` names; a compressor that cannot reduce-scatter
  /// (PowerSGD, classic TopK) is refused here.
  fsdp_reduce_scatter(c10::intrusive_ptr<c10d::ProcessGroup> group, compressor_spec spec,
                      allreducer_options options = {}, int threads = 0)
      : comm_(std::move(group)), spec_(std::move(spec)), options_(options), space_{threads} {
    std::string const failure = detail::spec_failure(spec_, comm_.size(), detail::refuse_unshardable);
    GRADCOMP_EXPECTS(failure.empty(), "gradcomp FSDP reduce-scatter: '" + spec_.str() + "': " + failure);
  }

  /// output = mean over the ranks of block rank() of input. Collective.
  void operator()(at::Tensor const& input, at::Tensor const& output) {
    for (at::Tensor const* t : {&input, &output}) {
      GRADCOMP_EXPECTS(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->is_contiguous(),
                       "gradcomp FSDP reduce-scatter: tensors must be contiguous float32 on the CPU");
    }
    std::size_t const n = static_cast<std::size_t>(comm_.size());
    std::size_t const block = static_cast<std::size_t>(output.numel());
    GRADCOMP_EXPECTS(static_cast<std::size_t>(input.numel()) == n * block,
                     "gradcomp FSDP reduce-scatter: input of " + std::to_string(input.numel()) + " values for " +
                         std::to_string(n) + " ranks' outputs of " + std::to_string(block));
    if (!reducer_ || block != block_) build(block);
    float const* in = input.data_ptr<float>();
    for (std::size_t r = 0; r < n; ++r) {  // (the step may leave anything in its input: pads are set each call)
      std::memcpy(bucket_.data() + r * padded_, in + r * block, block * sizeof(float));
      std::fill(bucket_.data() + r * padded_ + block, bucket_.data() + (r + 1) * padded_, 0.0f);
    }
    (*reducer_)(span<float>(bucket_.data(), bucket_.size()), span<float>(shard_.data(), shard_.size()));
    std::memcpy(output.data_ptr<float>(), shard_.data(), block * sizeof(float));
  }

  /// The reducer's compressor ("thc<uint8>"; empty before the first call).
  std::string description() const { return reducer_ ? reducer_->spec().str() : std::string(); }
  /// Bytes the last call put on the wire, per rank.
  std::size_t wire_bytes() const { return reducer_ ? reducer_->wire_bytes() : 0; }
  /// Values per block after padding (S').
  std::size_t padded_block() const { return padded_; }

 private:
  using reducer = any_reduce_scatterer<c10d_communicator, host_space, float>;

  std::unique_ptr<reducer> make(std::size_t padded) {
    return std::make_unique<reducer>(spec_, comm_, bucket_layout(padded * static_cast<std::size_t>(comm_.size())),
                                     space_, options_);
  }

  // The reducer's own shards are size() x S' for a bucket of size() x S'
  // once S' is its shard of size() x S (a multiple of its alignment).
  void build(std::size_t block) {
    auto r = make(block);
    std::size_t padded = r->shard_size(0);
    if (padded != block) r = make(padded);
    for (int rank = 0; rank < comm_.size(); ++rank)
      GRADCOMP_EXPECTS(
          r->shard_offset(rank) == padded * static_cast<std::size_t>(rank) && r->shard_size(rank) == padded,
          "gradcomp FSDP reduce-scatter: " + spec_.str() + " does not cut " + std::to_string(comm_.size()) +
              " blocks of " + std::to_string(padded) + " into equal shards");
    reducer_ = std::move(r);
    block_ = block;
    padded_ = padded;
    bucket_.assign(padded * static_cast<std::size_t>(comm_.size()), 0.0f);
    shard_.assign(padded, 0.0f);
  }

  c10d_communicator comm_;
  compressor_spec spec_;
  allreducer_options options_;
  host_space space_;
  std::unique_ptr<reducer> reducer_;
  std::size_t block_ = 0, padded_ = 0;
  std::vector<float> bucket_, shard_;
};

}  // namespace gradcomp

#endif  // __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
