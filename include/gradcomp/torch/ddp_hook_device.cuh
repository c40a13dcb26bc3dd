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

namespace detail {
template <class G>
compression_plan plan_device_bucket(c10d_communicator& comm, bucket_layout const& layout, cuda_space const& space,
                                    planner_options const& options) {
  return plan_compression<G>(comm, {layout}, space, options);
}
}  // namespace detail

/// Device buckets' reducers and plans, on the CUDA space.
inline ddp_hook_device const& cuda_ddp_hook_device() {
  using R32 = any_allreducer<c10d_communicator, cuda_space, float>;
  using R16b = any_allreducer<c10d_communicator, cuda_space, bfloat16>;
  using R16h = any_allreducer<c10d_communicator, cuda_space, half>;
  static constexpr ddp_hook_device device{
      {&make_bucket<R32, c10d_communicator, cuda_space>, &make_bucket<R16b, c10d_communicator, cuda_space>,
       &make_bucket<R16h, c10d_communicator, cuda_space>},
      {&detail::plan_device_bucket<float>, &detail::plan_device_bucket<bfloat16>, &detail::plan_device_bucket<half>}};
  return device;
}

}  // namespace gradcomp

#endif
