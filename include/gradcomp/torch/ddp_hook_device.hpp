// What the DDP hook's state needs for device (CUDA) buckets that only nvcc
// compiles: building a bucket's reducer, and planning one (the spec "auto"),
// on the CUDA space. <gradcomp/torch/ddp_hook_device.cuh> makes it in a .cu
// file; the state itself (ddp_hook.hpp) is compiled by any compiler.
//
// Without PyTorch's headers or gradcomp::cuda it declares the type only.
#pragma once

#include <gradcomp/collectives/c10d.hpp>

namespace gradcomp::inline GRADCOMP_ABI {
struct ddp_hook_device;
}  // namespace gradcomp

#if __has_include(<torch/csrc/distributed/c10d/ProcessGroup.hpp>) && GRADCOMP_HAS_CUDA

#include <gradcomp/planning/planner.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>

#include <memory>

namespace gradcomp::inline GRADCOMP_ABI {

/// Device buckets' reducers and plans (see above).
struct ddp_hook_device {
  using reducer = any_allreducer<c10d_communicator, cuda_space, float>;
  std::unique_ptr<reducer> (*make)(compressor_spec const&, c10d_communicator&, bucket_layout, cuda_space const&,
                                   allreducer_options const&);
  compression_plan (*plan)(c10d_communicator&, bucket_layout const&, cuda_space const&, planner_options const&);
};

}  // namespace gradcomp

#endif
