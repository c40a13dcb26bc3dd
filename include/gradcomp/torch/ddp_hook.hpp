// The C++ side of gradcomp's DDP communication hook (component
// gradcomp::torch): each DDP bucket reduced by the compressor a spec names,
// over the process group DDP uses. The Python hook (gradcomp.torch.register)
// is a thin layer over this class; a LibTorch program can use it directly.
//
// Host (gloo) buckets are reduced in any translation unit. Device (NCCL)
// buckets need the CUDA space's kernels, which only nvcc compiles: a state
// reduces them when given a ddp_hook_device, which <gradcomp/torch/
// ddp_hook_device.cuh> makes in a .cu file. So the host loops stay in the
// host compiler's code (the Python module is a .cpp file and a small .cu).
//
// Without PyTorch's headers on the include path this header still compiles,
// and declares ddp_hook_state without defining it.
#pragma once

#include <gradcomp/collectives/c10d.hpp>
#include <gradcomp/torch/ddp_hook_device.hpp>

namespace gradcomp::inline GRADCOMP_ABI {
class ddp_hook_state;
}  // namespace gradcomp

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)

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
#include <optional>
#include <string>
#include <type_traits>
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
///
/// A host bucket is reduced when reduce() returns. A device bucket's step is
/// enqueued on the current CUDA stream (the same one in every call: the
/// Python hook's side stream) and reduce() returns without waiting for it;
/// a bucket's next step waits for its previous one to have finished. On the
/// device a bad value (NaN, infinity) makes that bucket NaN on every rank,
/// whatever `reduce.nonfinite` says (nonfinite_policy::propagate): raising
/// would need the host to wait for the step, and DDP would meanwhile take
/// the rank's own gradient.
class ddp_hook_state {
 public:
  using shapes = std::vector<std::vector<std::int64_t> >;

  /// Buckets reduced over `group`: host tensors through its CPU backend
  /// (gloo), device tensors through its CUDA backend (NCCL) where `device`
  /// is given (else they are refused). A spec the group's size cannot take
  /// (a parameter out of range, a lane too narrow for its ranks) is refused
  /// here.
  ddp_hook_state(c10::intrusive_ptr<c10d::ProcessGroup> group, ddp_hook_options options,
                 ddp_hook_device const* device = nullptr)
      : group_(std::move(group)), options_(std::move(options)), device_(device) {
    GRADCOMP_EXPECTS(group_, "gradcomp DDP hook: the process group is null");
    for (compressor_spec const* spec : {&options_.compressor, &options_.small}) {
      if (spec == &options_.compressor && !options_.candidates.empty())
        continue;  // the planner leaves out what cannot run
      std::string const failure = detail::spec_failure(*spec, group_->getSize(), [](auto) {});
      GRADCOMP_EXPECTS(failure.empty(), "gradcomp DDP hook: '" + spec->str() + "': " + failure);
    }
  }
  // The reducers hold the communicators: the state stays where it was made.
  ddp_hook_state(ddp_hook_state const&) = delete;
  ddp_hook_state& operator=(ddp_hook_state const&) = delete;

  /// Reduces bucket `index` in place to the mean over the ranks. `buffer` is
  /// DDP's flat bucket; `params` the shapes of its parameters, in the
  /// buffer's order. A bf16 or fp16 bucket (a 16-bit model's) is reduced in
  /// fp32, through a copy of the bucket's own made at its first step, and
  /// rounded back: every compressor takes it, its residuals are fp32.
  void reduce(std::size_t index, at::Tensor const& buffer, shapes const& params) {
    expect_bucket(buffer);
    if (buffer.scalar_type() != at::kFloat) {
      at::Tensor& wide = widened(index, buffer);
      wide.copy_(buffer);
      reduce(index, wide, params);
      buffer.copy_(wide);
      return;
    }
    auto* data = buffer.data_ptr<float>();
    std::size_t const n = static_cast<std::size_t>(buffer.numel());
#if GRADCOMP_HAS_CUDA
    if (buffer.is_cuda()) {
      c10::cuda::CUDAGuard const on(buffer.device());
      c10d_communicator& comm = device_communicator();
      return reduce_in(comm, cuda_space{comm.stream()}, index, buffer, data, n, params);
    }
#endif
    reduce_in(host_communicator(), host_space{options_.threads}, index, buffer, data, n, params);
  }

  /// Whether device (CUDA) buckets are reduced (a ddp_hook_device was given).
  bool reduces_device_buckets() const { return device_ != nullptr; }

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
    return found == buckets_.end() ? std::string() : found->second.visit([](auto& r) { return r.description(); });
  }

  /// This rank's state: the iterations, and each bucket's checkpoint (its
  /// residual and compressor state, gradcomp's checkpoint bytes; a loaded
  /// one not yet applied as it was loaded).
  std::pair<std::uint64_t, std::map<std::size_t, std::vector<std::byte> > > save() {
    std::map<std::size_t, std::vector<std::byte> > out = pending_;  // loaded, not yet applied
    for (auto& [index, b] : buckets_) out.insert_or_assign(index, b.visit([](auto& r) { return r.save(); }));
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
  template <class Space>
  using reducer = any_allreducer<c10d_communicator, Space, float>;

  // A bucket's reduction, in the space of its buffer's memory.
  struct bucket {
    shapes params;
    std::unique_ptr<reducer<host_space> > host;
#if GRADCOMP_HAS_CUDA
    std::unique_ptr<reducer<cuda_space> > device;
#endif
    template <class F>
    std::invoke_result_t<F&, reducer<host_space>&> visit(F&& f) const {  // f(the reducer)
#if GRADCOMP_HAS_CUDA
      if (device) return f(*device);
#endif
      return f(*host);
    }
    std::unique_ptr<reducer<host_space> >& slot(host_space const&) { return host; }
#if GRADCOMP_HAS_CUDA
    std::unique_ptr<reducer<cuda_space> >& slot(cuda_space const&) { return device; }
#endif
  };

  void expect_bucket(at::Tensor const& buffer) const {
    GRADCOMP_EXPECTS(buffer.device().is_cpu() || (device_ && buffer.device().is_cuda()),
                     "gradcomp DDP hook: bucket on " + buffer.device().str() +
                         "; this build reduces host (gloo) buckets only (device buckets need a ddp_hook_device: "
                         "the module built with gradcomp::cuda, nvcc and a CUDA PyTorch)");
    auto const type = buffer.scalar_type();
    GRADCOMP_EXPECTS(type == at::kFloat || type == at::kBFloat16 || type == at::kHalf,
                     std::string("gradcomp DDP hook: bucket of ") + c10::toString(type) +
                         "; gradients must be float32, bfloat16 or float16");
    GRADCOMP_EXPECTS(buffer.is_contiguous(), "gradcomp DDP hook: bucket buffer is not contiguous");
  }

  // Bucket `index`'s fp32 copy, where its gradients are 16-bit: made at its
  // first step (and when the bucket changes), reused after.
  at::Tensor& widened(std::size_t index, at::Tensor const& buffer) {
    at::Tensor& wide = widened_[index];
    if (!wide.defined() || wide.numel() != buffer.numel() || wide.device() != buffer.device())
      wide = at::empty({buffer.numel()}, buffer.options().dtype(at::kFloat));
    return wide;
  }

  c10d_communicator& host_communicator() {
    if (!host_comm_) host_comm_.emplace(group_);
    return *host_comm_;
  }

#if GRADCOMP_HAS_CUDA
  // The device communicator, on the current stream of the current device:
  // built at the first device bucket; every later one must come on the same
  // stream, which the buckets' reducers hold.
  c10d_communicator& device_communicator() {
    cudaStream_t const stream = c10::cuda::getCurrentCUDAStream().stream();
    if (!device_comm_) device_comm_.emplace(group_, stream);
    GRADCOMP_EXPECTS(device_comm_->stream() == stream,
                     "gradcomp DDP hook: device buckets must be reduced on one CUDA stream, the one of the first "
                     "(the hook's side stream); this one came on another");
    return *device_comm_;
  }
#endif

  template <class Space>
  void reduce_in(c10d_communicator& comm, Space const& space, std::size_t index, at::Tensor const& buffer, float* data,
                 std::size_t n, shapes const& params) {
    if (iterations_ < options_.warmup_iterations) {  // (on a device, both on the current stream)
      comm.all_reduce(data, data, n, reduce_op::sum);
      buffer.div_(static_cast<double>(comm.size()));
      return;
    }
    auto& r = bucket_for(comm, space, index, params, n);
    r(span<float, typename Space::memory>(data, n));
    last_wire_bytes_ += r.wire_bytes();
  }

  template <class Space>
  reducer<Space>& bucket_for(c10d_communicator& comm, Space const& space, std::size_t index, shapes const& params,
                             std::size_t elements) {
    auto found = buckets_.find(index);
    if (found != buckets_.end() && found->second.params == params && found->second.slot(space))
      return *found->second.slot(space);
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
                                     : choose(comm, space, index, layout, found != buckets_.end());
    bucket b;
    b.params = params;
    auto& r = b.slot(space);
    r = build_reducer(spec, comm, std::move(layout), space, o);
    if (auto const saved = pending_.find(index); saved != pending_.end()) {
      auto const bytes = std::move(saved->second);
      pending_.erase(saved);
      r->restore(span<std::byte const>(bytes.data(), bytes.size()));
    }
    return *buckets_.insert_or_assign(index, std::move(b)).first->second.slot(space);
  }

  // The planner's choice for bucket `index`: the saved one where a loaded
  // state has it and the bucket is not rebuilt, else planned over the group
  // (collective: every rank builds its buckets in DDP's order).
  template <class Space>
  compressor_spec choose(c10d_communicator& comm, Space const& space, std::size_t index, bucket_layout const& layout,
                         bool rebuilt) {
    if (auto const saved = choices_.find(index); saved != choices_.end() && !rebuilt) return saved->second;
    planner_options planner;
    planner.candidates = options_.candidates;
    compression_plan const plan = plan_bucket(comm, layout, space, planner);
    if (comm.rank() == 0) {
      std::string const text = "gradcomp DDP hook, bucket " + std::to_string(index) + ": " + plan.table();
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
    return choices_.insert_or_assign(index, plan.chosen(0)).first->second;
  }

  std::unique_ptr<reducer<host_space> > build_reducer(compressor_spec const& spec, c10d_communicator& comm,
                                                      bucket_layout layout, host_space const& space,
                                                      allreducer_options const& o) {
    return std::make_unique<reducer<host_space> >(spec, comm, std::move(layout), space, o);
  }
  compression_plan plan_bucket(c10d_communicator& comm, bucket_layout const& layout, host_space const& space,
                               planner_options const& o) {
    return plan_compression<float>(comm, {layout}, space, o);
  }
#if GRADCOMP_HAS_CUDA
  std::unique_ptr<reducer<cuda_space> > build_reducer(compressor_spec const& spec, c10d_communicator& comm,
                                                      bucket_layout layout, cuda_space const& space,
                                                      allreducer_options o) {
    o.nonfinite = nonfinite_policy::propagate;  // (see the class comment)
    return device_->make(spec, comm, std::move(layout), space, o);
  }
  compression_plan plan_bucket(c10d_communicator& comm, bucket_layout const& layout, cuda_space const& space,
                               planner_options const& o) {
    return device_->plan(comm, layout, space, o);
  }
#endif

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::optional<c10d_communicator> host_comm_;  // built at the first host bucket (a NCCL group has no CPU backend)
#if GRADCOMP_HAS_CUDA
  std::optional<c10d_communicator> device_comm_;  // built at the first device bucket
#endif
  ddp_hook_options options_;
  ddp_hook_device const* device_ = nullptr;
  std::map<std::size_t, compressor_spec> choices_;
  std::map<std::size_t, bucket> buckets_;
  std::map<std::size_t, std::vector<std::byte> > pending_;
  std::map<std::size_t, at::Tensor> widened_;  // 16-bit buckets' fp32 copies
  std::uint64_t iterations_ = 0;
  std::size_t wire_bytes_ = 0;
  std::size_t last_wire_bytes_ = 0;
};

}  // namespace gradcomp

#endif  // __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
