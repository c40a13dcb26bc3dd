// The C++ side of gradcomp's DDP communication hook (component
// gradcomp::torch): an adapter of the model-level core (reducers/model/)
// whose buckets are DDP's, handed over by index as DDP makes them. The
// Python hook (gradcomp.torch) is a thin layer over this class; a LibTorch
// program can use it directly.
//
// Host (gloo) buckets are reduced in any translation unit. Device (NCCL)
// buckets need the CUDA space's kernels, which only nvcc compiles: a state
// reduces them when given a ddp_hook_device, which <gradcomp/torch/
// ddp_hook_device.cuh> makes in a .cu file.
//
// Without PyTorch's headers on the include path this header still compiles,
// and declares ddp_hook_state without defining it.
#pragma once

#include <gradcomp/collectives/c10d.hpp>
#include <gradcomp/torch/ddp_hook_device.hpp>
#include <gradcomp/torch/ddp_hook_options.hpp>

namespace gradcomp::inline GRADCOMP_ABI {
class ddp_hook_state;
}  // namespace gradcomp

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)

#include <gradcomp/planning/planner.hpp>
#include <gradcomp/reducers/model/model_buckets.hpp>
#include <gradcomp/torch/detail/hook_planner.hpp>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Every DDP bucket's reduction (see the top of this header). Steps are
/// collective and come in DDP's bucket order on every rank.
///
/// A host bucket is reduced on a lane's thread and its future completed
/// there, while the backward pass goes on. A device bucket's step is
/// enqueued on the current CUDA stream (the same one in every call: the
/// Python hook's side stream) and its future completed on that stream,
/// without the host waiting; on the device a bad value (NaN, infinity) makes
/// that bucket NaN on every rank, whatever `nonfinite` says
/// (nonfinite_policy::propagate): raising would need the host to wait for
/// the step, and DDP would meanwhile take the rank's own gradient.
class ddp_hook_state {
 public:
  using shapes = std::vector<std::vector<std::int64_t>>;

  /// Buckets reduced over `group`: host tensors through its CPU backend
  /// (gloo), device tensors through its CUDA backend (NCCL) where `device`
  /// is given (else they are refused). A spec this group cannot build is
  /// refused here, on every rank.
  ddp_hook_state(c10::intrusive_ptr<c10d::ProcessGroup> group, ddp_hook_options options,
                 ddp_hook_device const* device = nullptr)
      : group_(std::move(group)), options_(std::move(options)), device_(device) {
    GRADCOMP_EXPECTS(group_, "gradcomp DDP hook: the process group is null");
    GRADCOMP_EXPECTS(options_.lanes >= 1,
                     "gradcomp DDP hook: lanes must be 1 or more, not " + std::to_string(options_.lanes));
    std::vector<compressor_spec> specs = {options_.small};
    if (options_.compressor.is_automatic())
      ;  // the planner leaves out what cannot run
    else
      specs.push_back(options_.compressor.spec());
    for (auto const& spec : specs) {
      std::string const failure = detail::spec_failure(spec, group_->getSize(), [](auto) {});
      GRADCOMP_EXPECTS(failure.empty(), "gradcomp DDP hook: '" + spec.str() + "': " + failure);
    }
  }
  ddp_hook_state(ddp_hook_state const&) = delete;
  ddp_hook_state& operator=(ddp_hook_state const&) = delete;

  /// Reduces DDP's bucket `index` in place to the mean over the ranks:
  /// `buffer` is its flat buffer (float32, bfloat16 or float16, reduced as
  /// stored), holding the model's parameters `positions` (empty where
  /// unknown) of `params`' shapes, in that order. `last`: DDP's last bucket
  /// of the iteration. Returns the future DDP waits on, completed with
  /// `value` (a C++ hook's: `buffer`; a Python hook's: `buffer` as a Python
  /// object) or with the reduction's error.
  c10::intrusive_ptr<c10::ivalue::Future> reduce(std::size_t index, at::Tensor const& buffer,
                                                 std::vector<std::size_t> const& positions, shapes const& params,
                                                 bool last, c10::IValue value = {}) {
    expect_bucket(buffer);
    std::vector<std::vector<std::size_t>> extents;
    for (auto const& s : params) extents.emplace_back(s.begin(), s.end());
    c10::IValue result = value.isNone() ? c10::IValue(buffer) : std::move(value);
    c10::TypePtr const type =
        result.isPyObject() ? c10::TypePtr(c10::PyObjectType::get()) : c10::TypePtr(c10::TensorType::get());
    auto future = buffer.is_cuda()
                      ? c10::make_intrusive<c10::ivalue::Future>(type, std::vector<c10::Device>{buffer.device()})
                      : c10::make_intrusive<c10::ivalue::Future>(type);
    if (options_.compressor.is_automatic())
      planner_.handed(static_cast<std::size_t>(buffer.numel()), last, detail::hook_planner::clock::now());
    with_core(buffer, [&](auto& core, auto* data) {
      using G = std::remove_pointer_t<decltype(data)>;
      using memory = typename std::decay_t<decltype(core)>::memory;
      if constexpr (std::is_same_v<memory, host_memory>) plan_before_step<G>(index, extents);
      span<G, memory> gradient(data, static_cast<std::size_t>(buffer.numel()));
      auto tag = std::make_unique<pending_result>(pending_result{future, std::move(result), this});
      core.submit_handed(index, gradient, positions, extents, tag.get());
      (void)tag.release();  // complete() owns it now (and has run where the step ran at once)
    });
    if (last) {
      ++iterations_;
      for_each_core([&](auto& core) { core.set_steps(iterations_); });
    }
    return future;
  }

  /// What a step's error becomes before the future DDP waits on carries it
  /// (the Python module makes it the Python exception of gradcomp's type, so
  /// that backward() raises that); unset: the error as raised.
  void set_error_translator(std::function<std::exception_ptr(std::exception_ptr)> translate) {
    translate_ = std::move(translate);
  }

  /// Whether device (CUDA) buckets are reduced (a ddp_hook_device was given).
  bool reduces_device_buckets() const { return device_ != nullptr; }
  /// The options.
  ddp_hook_options const& options() const { return options_; }
  /// The lanes host buckets are reduced on (0 before the first host bucket).
  int lanes() {
    int out = 0;
    for_each_core_keyed([&](std::string const& key, auto& core) { out = key.starts_with("cpu") ? core.lanes() : out; });
    return out;
  }
  /// Iterations completed (DDP's last bucket handed over), warm-up included.
  std::uint64_t iterations() const { return iterations_; }
  /// Waits for every bucket handed over so far.
  void drain() {
    for_each_core([](auto& core) { core.drain(); });
  }
  /// Bytes the last iteration's buckets put on the wire. @note Drains.
  std::size_t wire_bytes() {
    drain();
    std::size_t total = 0;
    for_each_core([&](auto& core) { total += core.wire_bytes(); });
    return total;
  }
  /// Bucket `index`'s compressor ("topkc<bf16>", ...); empty before it is built. @note Drains.
  std::string description(std::size_t index) {
    drain();
    std::string out;
    for_each_core([&](auto& core) {
      if (auto const* r = core.bucket(index)) out = r->description();
    });
    return out;
  }
  /// The planner's choice of each bucket it planned (spec strings), by
  /// index; empty for a fixed compressor. @note Drains.
  std::map<std::size_t, std::string> choices() {
    drain();
    std::map<std::size_t, std::string> out;
    if (!options_.compressor.is_automatic()) return out;
    for_each_core([&](auto& core) {
      for (std::size_t b = 0; b < core.size(); ++b)
        if (auto const* spec = core.spec_of(b); spec && planned(core, b)) out.emplace(b, spec->str());
    });
    return out;
  }

  /// What the planner weighed for each bucket it planned ("auto"), in index
  /// order, as this rank measured it (the choices agree on every rank; the
  /// timings are each rank's own). Empty for a fixed compressor. @note Drains.
  std::string report() {
    drain();
    return planner_.report();
  }

  /// This rank's state: each kind of bucket's (host or device, and the
  /// gradients' type: "cpu/float32", ...) checkpoint envelope, with every
  /// bucket's residual, compressor state, compressor and parameters (one
  /// loaded and not yet applied as it was loaded). @note Drains.
  std::map<std::string, std::vector<std::byte>> save() {
    drain();
    std::map<std::string, std::vector<std::byte>> out = loaded_;
    for_each_core_keyed([&](std::string const& key, auto& core) { out.insert_or_assign(key, core.save()); });
    return out;
  }

  /// Loads what save() wrote after `iterations` iterations, on every rank
  /// before the next step: each kind of bucket's envelope is checked on
  /// every rank together where its buckets exist (else when the first of
  /// them comes), and each bucket restores its state when it is built; a
  /// checkpoint of another configuration fails every rank with gradcomp's
  /// message. Buckets built already are dropped. @note Collective where the
  /// kind's buckets exist.
  void load(std::uint64_t iterations, std::map<std::string, std::vector<std::byte>> envelopes) {
    drain();
    resumed_ = true;
    loaded_ = std::move(envelopes);
    iterations_ = iterations;
    for_each_core_keyed([&](std::string const& key, auto& core) {
      core.set_steps(iterations_);
      if (auto found = loaded_.find(key); found != loaded_.end()) {
        core.load({found->second.data(), found->second.size()});
        loaded_.erase(found);
      }
    });
  }

 private:
  template <class Space, class G>
  using core = model_buckets<all_reduce_delivery, c10d_communicator, Space, G>;

  // A future and the value it completes with, handed to a lane as a tag.
  struct pending_result {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    c10::IValue value;
    ddp_hook_state const* state;
  };
  static void complete(void* tag, std::exception_ptr error) {
    std::unique_ptr<pending_result> const done(static_cast<pending_result*>(tag));
    if (error)
      done->future->setError(done->state->translate_ ? done->state->translate_(error) : error);
    else
      done->future->markCompleted(std::move(done->value));
  }

  // The cores, one per kind of bucket: host or device, float, bfloat16 or half.
  template <class Space>
  using cores_in = std::tuple<std::unique_ptr<core<Space, float>>, std::unique_ptr<core<Space, bfloat16>>,
                              std::unique_ptr<core<Space, half>>>;

  // f("cpu/float32", ..., the core) for each core made.
  template <class F>
  void for_each_core_keyed(F&& f) {
    auto each = [&](char const* where, auto& cores) {
      std::apply(
          [&](auto&... slot) {
            ((slot ? f(std::string(where) + "/" + std::string(name_of(slot->gradient_dtype)), *slot) : void()), ...);
          },
          cores);
    };
    each("cpu", host_);
#if GRADCOMP_HAS_CUDA
    each("cuda", device_cores_);
#endif
  }
  template <class F>
  void for_each_core(F&& f) {
    for_each_core_keyed([&](std::string const&, auto& core) { f(core); });
  }

  // f(the core of `buffer`'s kind, its data as that kind's element).
  template <class F>
  void with_core(at::Tensor const& buffer, F&& f) {
    auto typed = [&](auto& cores, auto const& space, auto& comm, char const* where) {
      switch (buffer.scalar_type()) {
        case at::kBFloat16:
          return f(core_of<bfloat16>(cores, space, comm, where), reinterpret_cast<bfloat16*>(buffer.data_ptr()));
        case at::kHalf:
          return f(core_of<half>(cores, space, comm, where), reinterpret_cast<half*>(buffer.data_ptr()));
        default:
          return f(core_of<float>(cores, space, comm, where), buffer.data_ptr<float>());
      }
    };
#if GRADCOMP_HAS_CUDA
    if (buffer.is_cuda()) {
      c10::cuda::CUDAGuard const on(buffer.device());
      c10d_communicator& comm = device_communicator();
      return typed(device_cores_, cuda_space{comm.stream()}, comm, "cuda");
    }
#endif
    typed(host_, host_space{options_.threads}, host_communicator(), "cpu");
  }

  // The kind's core, made at its first bucket (collective: every rank hands
  // over its buckets in DDP's order), with the state loaded for it.
  template <class G, class Space>
  core<Space, G>& core_of(cores_in<Space>& cores, Space const& space, c10d_communicator& comm, char const* where) {
    auto& slot = std::get<std::unique_ptr<core<Space, G>>>(cores);
    if (slot) return *slot;
    model_reducer_options o = options_;
    if constexpr (!std::is_same_v<Space, host_space>)
      o.reduce.nonfinite = nonfinite_policy::propagate;  // (see the class)
    typename core<Space, G>::chooser choose;
    if (options_.compressor.is_automatic())
      choose = [this, space, o](std::size_t index, bucket_layout const& layout, c10d_communicator& lane) {
        if (!takes_compressor(layout, o)) return o.small;
        return plan_bucket<G>(lane, index, layout, space);
      };
    slot = std::make_unique<core<Space, G>>("gradcomp DDP hook", comm, std::move(o), space, maker<G>(space),
                                            std::move(choose), &complete);
    slot->set_steps(iterations_);
    std::string const key = std::string(where) + "/" + std::string(name_of(dtype_of_v<G>));
    if (auto found = loaded_.find(key); found != loaded_.end()) {
      slot->load({found->second.data(), found->second.size()});
      loaded_.erase(found);
    }
    return *slot;
  }

  template <class Core>
  bool planned(Core const& core, std::size_t b) const {
    auto const* r = core.bucket(b);
    return takes_compressor(r->layout(), options_);
  }

  // `auto`: a host bucket is planned before its first compressed step, over
  // the whole group (detail/hook_planner.hpp); a resumed state keeps the
  // choices it saved.
  template <class G>
  void plan_before_step(std::size_t index, std::vector<std::vector<std::size_t>> const& extents) {
    if (options_.compressor.is_automatic() && !resumed_ && iterations_ >= options_.reduce.warmup_steps)
      planner_.before_step<G>(host_communicator(), index, extents, options_, [this] { drain(); });
  }

  // The choice for bucket `index` when its lane builds it: planned before the
  // step (host buckets), else now over the lane (collective there).
  template <class G, class Space>
  compressor_spec plan_bucket(c10d_communicator& lane, std::size_t index, bucket_layout const& layout,
                              Space const& space) {
    auto const extents = detail::hook_planner::extents_of(layout);
    if (auto const kept = planner_.choice(index, extents)) return *kept;
    compression_plan plan;
    if constexpr (std::is_same_v<Space, host_space>)
      plan = plan_compression<G>(lane, {layout}, space, planner_.options_for(layout.size()));
#if GRADCOMP_HAS_CUDA
    else
      plan = device_->template plan<G>()(lane, layout, space, planner_.options_for(layout.size()));
#endif
    planner_.keep(index, extents, plan);
    return plan.chosen(0);
  }

  template <class G, class Space>
  bucket_maker<any_allreducer<c10d_communicator, Space, G>, c10d_communicator, Space> maker(Space const&) const {
    if constexpr (std::is_same_v<Space, host_space>)
      return &make_bucket<any_allreducer<c10d_communicator, Space, G>, c10d_communicator, Space>;
#if GRADCOMP_HAS_CUDA
    else
      return device_->template make<G>();
#endif
  }

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

  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  ddp_hook_options options_;
  ddp_hook_device const* device_ = nullptr;
  std::function<std::exception_ptr(std::exception_ptr)> translate_;
  std::uint64_t iterations_ = 0;
  std::map<std::string, std::vector<std::byte>> loaded_;                      // envelopes of cores not made yet
  detail::hook_planner planner_{detail::hook_planner::options_of(options_)};  // what `auto` chose, and why
  bool resumed_ = false;  // load() was called: the saved choices stand
  // The communicators before the cores that use them (destroyed after).
  std::optional<c10d_communicator> host_comm_;  // built at the first host bucket (a NCCL group has no CPU backend)
#if GRADCOMP_HAS_CUDA
  std::optional<c10d_communicator> device_comm_;  // built at the first device bucket
  cores_in<cuda_space> device_cores_;
#endif
  cores_in<host_space> host_;
};

}  // namespace gradcomp

#endif  // __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>)
