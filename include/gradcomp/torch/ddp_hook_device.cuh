// What a ddp_hook_state needs for device (CUDA) buckets, compiled by nvcc:
// include this from one .cu file of a program and pass
// &cuda_ddp_hook_device() to the state (the Python module does).
//
// Without PyTorch's headers on the include path it compiles to nothing.
#pragma once

#if !defined(__CUDACC__)
#error "<gradcomp/torch/ddp_hook_device.cuh> holds CUDA kernels: include it from a .cu file compiled by nvcc"
#endif

#include <gradcomp/cuda.cuh>
#include <gradcomp/torch/ddp_hook_device.hpp>

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>) && GRADCOMP_HAS_CUDA

namespace gradcomp::inline GRADCOMP_ABI {

/// Device buckets' reducers and plans, on the CUDA space.
inline ddp_hook_device const& cuda_ddp_hook_device() {
  static constexpr ddp_hook_device device{
      [](compressor_spec const& spec, c10d_communicator& comm, bucket_layout layout, cuda_space const& space,
         allreducer_options const& options) {
        return std::make_unique<ddp_hook_device::reducer>(spec, comm, std::move(layout), space, options);
      },
      [](c10d_communicator& comm, bucket_layout const& layout, cuda_space const& space,
         planner_options const& options) { return plan_compression<float>(comm, {layout}, space, options); }};
  return device;
}

}  // namespace gradcomp

#endif
