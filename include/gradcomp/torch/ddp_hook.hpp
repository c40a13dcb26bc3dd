// The C++ side of gradcomp's DDP communication hook (component
// gradcomp::torch): each DDP bucket reduced by the compressor a spec names,
// over the process group DDP uses. The Python hook (gradcomp.torch.register)
// is a thin layer over this class; a LibTorch program can use it directly.
//
// Without PyTorch's headers on the include path this header still compiles,
// and declares ddp_hook_state without defining it.
#pragma once

#include <gradcomp/collectives/c10d.hpp>

#if !__has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
namespace gradcomp::inline GRADCOMP_ABI {
class ddp_hook_state;  // defined where PyTorch's headers are found: link gradcomp::torch
}  // namespace gradcomp
#else

#include <gradcomp/pipeline/checkpoint.hpp>
#include <gradcomp/planning/planner.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>
#include <gradcomp/reducers/bucket_plan.hpp>

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// How a ddp_hook_state reduces DDP's buckets.
struct ddp_hook_options {
  /// The compressor of buckets that hold a matrix and at least
  /// `min_compression_elements` values.
  compressor_spec compressor{};
  /// When not empty (the spec "auto" or "auto:of=..."): the planner
  /// (plan_compression over the hook's group) chooses the compressor of each
  /// bucket that `compressor` would take among these, when the bucket is
  /// built (after warm-up, so on DDP's rebuilt buckets where warm-up is 2 or
  /// more); rank 0 prints its table. `compressor` is then unused.
  std::vector<compressor_spec> candidates{};
  /// The compressor of the other buckets (bf16, no error feedback: PyTorch's
  /// min_compression_rate).
  compressor_spec small{};
  /// See above; model_reducer's default.
  std::size_t min_compression_elements = bucket_rules{}.min_compression_elements;
  /// The first `warmup_iterations` iterations send the plain fp32 mean
  /// (PyTorch's start_powerSGD_iter). DDP rebuilds its buckets after the
  /// first iteration: two or more lets the compressors start on the final
  /// buckets.
  std::uint64_t warmup_iterations = 0;
  /// Non-finite policy and seed of every bucket (each bucket's position is
  /// its DDP index).
  allreducer_options reduce{};
  /// Threads of the host loops (gradcomp.torch passes torch's intra-op
  /// thread count, what the user gave each rank); 0: OpenMP's default.
  int threads = 0;
};

/// Every DDP bucket's reduction: built on a bucket's first step from its
/// parameters' shapes, and built again when DDP rebuilds its buckets (the
/// shapes then differ). Steps are collective and run in DDP's bucket order.
class ddp_hook_state {
 public:
  using shapes = std::vector<std::vector<std::int64_t> >;

  /// Buckets reduced over `group` (host tensors, its CPU backend). A spec
  /// the group's size cannot take (a parameter out of range, a lane too
  /// narrow for its ranks) is refused here.
  ddp_hook_state(c10::intrusive_ptr<c10d::ProcessGroup> group, ddp_hook_options options)
      : comm_(std::move(group)), options_(std::move(options)) {
    for (compressor_spec const* spec : {&options_.compressor, &options_.small}) {
      if (spec == &options_.compressor && !options_.candidates.empty())
        continue;  // the planner leaves out what cannot run
      std::string const failure = detail::spec_failure(*spec, comm_.size(), [](auto) {});
      GRADCOMP_EXPECTS(failure.empty(), "gradcomp DDP hook: '" + spec->str() + "': " + failure);
    }
  }

  /// Reduces bucket `index` in place to the mean over the ranks. `buffer` is
  /// DDP's flat fp32 bucket; `params` the shapes of its parameters, in the
  /// buffer's order.
  void reduce(std::size_t index, at::Tensor const& buffer, shapes const& params) {
    expect_bucket(buffer);
    auto* data = buffer.data_ptr<float>();
    std::size_t const n = static_cast<std::size_t>(buffer.numel());
    if (iterations_ < options_.warmup_iterations) {
      comm_.all_reduce(data, data, n, reduce_op::sum);
      buffer.div_(static_cast<double>(comm_.size()));
      return;
    }
    bucket& b = bucket_for(index, params, n);
    b.reducer->operator()(span<float>(data, n));
    last_wire_bytes_ += b.reducer->wire_bytes();
  }

  /// DDP's last bucket of an iteration has been reduced.
  void end_iteration() {
    ++iterations_;
    wire_bytes_ = std::exchange(last_wire_bytes_, 0);
  }

  /// Iterations completed.
  std::uint64_t iterations() const { return iterations_; }
  /// Bytes the last iteration's buckets put on the wire, through gradcomp
  /// (zero while warming up: those are plain fp32 all-reduces, which do not
  /// check for NaN either, as PyTorch's hooks do not).
  std::size_t wire_bytes() const { return wire_bytes_; }
  /// Bucket `index`'s compressor ("topkc<bf16>", ...); empty before it is built.
  std::string description(std::size_t index) const {
    auto const found = buckets_.find(index);
    return found == buckets_.end() ? std::string() : found->second.reducer->description();
  }

  /// This rank's state: the iterations, and each bucket's checkpoint (its
  /// residual and compressor state, gradcomp's checkpoint bytes; a loaded
  /// one not yet applied as it was loaded).
  std::pair<std::uint64_t, std::map<std::size_t, std::vector<std::byte> > > save() {
    std::map<std::size_t, std::vector<std::byte> > out = pending_;  // loaded, not yet applied
    for (auto& [index, b] : buckets_) out.insert_or_assign(index, b.reducer->save());
    return {iterations_, std::move(out)};
  }

  /// Loads what save() wrote (on every rank, before the next step): each
  /// bucket restores its checkpoint when it is built, a checkpoint of
  /// another configuration or bucket failing every rank with gradcomp's
  /// message. Buckets already built are dropped. `choices` (what choices()
  /// said when it was saved) gives the planner's buckets their saved
  /// compressors back, so they are not planned again.
  void load(std::uint64_t iterations, std::map<std::size_t, std::vector<std::byte> > checkpoints,
            std::map<std::size_t, std::string> const& choices = {}) {
    buckets_.clear();
    iterations_ = iterations;
    pending_ = std::move(checkpoints);
    choices_.clear();
    for (auto const& [index, spec] : choices) choices_.insert_or_assign(index, compressor_spec::parse(spec));
  }

  /// The planner's choice of each bucket it planned (spec strings), by index;
  /// empty without candidates.
  std::map<std::size_t, std::string> choices() const {
    std::map<std::size_t, std::string> out;
    for (auto const& [index, spec] : choices_) out.emplace(index, spec.str());
    return out;
  }

  /// Whether a bucket of these shapes is compressed (holds a matrix and at
  /// least min_compression_elements values) rather than given `small`.
  bool compressed(shapes const& params, std::size_t elements) const {
    bool matrix = false;
    for (auto const& s : params) matrix = matrix || s.size() > 1;
    return matrix && elements >= options_.min_compression_elements;
  }
  /// The compressor a bucket of these shapes takes (without candidates).
  compressor_spec const& spec_for(shapes const& params, std::size_t elements) const {
    return compressed(params, elements) ? options_.compressor : options_.small;
  }

 private:
  struct bucket {
    shapes params;
    std::unique_ptr<any_allreducer<c10d_communicator, host_space, float> > reducer;
  };

  static void expect_bucket(at::Tensor const& buffer) {
    GRADCOMP_EXPECTS(buffer.device().is_cpu(), "gradcomp DDP hook: bucket on " + buffer.device().str() +
                                                   "; this build reduces host (gloo) buckets only");
    GRADCOMP_EXPECTS(buffer.scalar_type() == at::kFloat, std::string("gradcomp DDP hook: bucket of ") +
                                                             c10::toString(buffer.scalar_type()) +
                                                             "; gradients must be float32");
    GRADCOMP_EXPECTS(buffer.is_contiguous(), "gradcomp DDP hook: bucket buffer is not contiguous");
  }

  bucket& bucket_for(std::size_t index, shapes const& params, std::size_t elements) {
    auto found = buckets_.find(index);
    if (found != buckets_.end() && found->second.params == params) return found->second;
    bucket_layout layout;
    for (auto const& s : params) {
      std::vector<std::size_t> extents;
      for (std::int64_t e : s) extents.push_back(static_cast<std::size_t>(e));
      layout.add(std::move(extents));
    }
    GRADCOMP_EXPECTS(layout.size() == elements, "gradcomp DDP hook: bucket " + std::to_string(index) + " holds " +
                                                    std::to_string(elements) + " values but its parameters " +
                                                    std::to_string(layout.size()));
    allreducer_options o = options_.reduce;
    o.bucket = index;
    compressor_spec const spec = options_.candidates.empty() || !compressed(params, elements)
                                     ? spec_for(params, elements)
                                     : choose(index, layout, found != buckets_.end());
    bucket b{params, std::make_unique<any_allreducer<c10d_communicator, host_space, float> >(
                         spec, comm_, std::move(layout), host_space{options_.threads}, o)};
    if (auto const saved = pending_.find(index); saved != pending_.end()) {
      auto const bytes = std::move(saved->second);
      pending_.erase(saved);
      b.reducer->restore(span<std::byte const>(bytes.data(), bytes.size()));
    }
    return buckets_.insert_or_assign(index, std::move(b)).first->second;
  }

  // The planner's choice for bucket `index`: the saved one where a loaded
  // state has it and the bucket is not rebuilt, else planned over the group
  // (collective: every rank builds its buckets in DDP's order).
  compressor_spec choose(std::size_t index, bucket_layout const& layout, bool rebuilt) {
    if (auto const saved = choices_.find(index); saved != choices_.end() && !rebuilt) return saved->second;
    planner_options planner;
    planner.candidates = options_.candidates;
    compression_plan const plan = plan_compression<float>(comm_, {layout}, host_space{options_.threads}, planner);
    if (comm_.rank() == 0) {
      std::string const text = "gradcomp DDP hook, bucket " + std::to_string(index) + ": " + plan.table();
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
    return choices_.insert_or_assign(index, plan.chosen(0)).first->second;
  }

  c10d_communicator comm_;
  ddp_hook_options options_;
  std::map<std::size_t, compressor_spec> choices_;
  std::map<std::size_t, bucket> buckets_;
  std::map<std::size_t, std::vector<std::byte> > pending_;
  std::uint64_t iterations_ = 0;
  std::size_t wire_bytes_ = 0;
  std::size_t last_wire_bytes_ = 0;
};

}  // namespace gradcomp

#endif  // __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
