// What the DDP hook's state needs for device (CUDA) buckets that only nvcc
// compiles: building a bucket's reducer, and planning one (the spec "auto"),
// on the CUDA space, for each type gradients are stored as.
// <gradcomp/torch/ddp_hook_device.cuh> makes it in a .cu file; the state
// itself (ddp_hook.hpp) is compiled by any compiler.
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
#include <gradcomp/reducers/model/delivery.hpp>

#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Device buckets' reducers and plans (see above), for gradients stored as
/// float, bfloat16 or half.
struct ddp_hook_device {
  template <class G>
  using maker = bucket_maker<any_allreducer<c10d_communicator, cuda_space, G>, c10d_communicator, cuda_space>;
  template <class G>
  using planner = compression_plan (*)(c10d_communicator&, bucket_layout const&, cuda_space const&,
                                       planner_options const&);

  maker<float> make_float;
  maker<bfloat16> make_bfloat16;
  maker<half> make_half;
  planner<float> plan_float;
  planner<bfloat16> plan_bfloat16;
  planner<half> plan_half;

  /// The maker of G's buckets.
  template <class G>
  maker<G> make() const {
    if constexpr (std::is_same_v<G, float>)
      return make_float;
    else if constexpr (std::is_same_v<G, bfloat16>)
      return make_bfloat16;
    else
      return make_half;
  }
  /// The planner of G's buckets.
  template <class G>
  planner<G> plan() const {
    if constexpr (std::is_same_v<G, float>)
      return plan_float;
    else if constexpr (std::is_same_v<G, bfloat16>)
      return plan_bfloat16;
    else
      return plan_half;
  }
};

}  // namespace gradcomp

#endif
