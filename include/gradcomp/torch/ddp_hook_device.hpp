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

#include <array>
#include <tuple>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Device buckets' reducers and plans (see above), for gradients stored as
/// float, bfloat16 or half.
struct ddp_hook_device {
  template <class G>
  using maker = bucket_maker<any_allreducer<c10d_communicator, cuda_space, G>, c10d_communicator, cuda_space>;
  using planner = compression_plan (*)(c10d_communicator&, bucket_layout const&, cuda_space const&,
                                       planner_options const&);

  std::tuple<maker<float>, maker<bfloat16>, maker<half>> makers;
  std::array<planner, 3> planners;  ///< Of float, bfloat16 and half buckets.

  /// The maker of G's buckets.
  template <class G>
  maker<G> make() const {
    return std::get<maker<G>>(makers);
  }
  /// The planner of G's buckets.
  template <class G>
  planner plan() const {
    return planners[std::is_same_v<G, float> ? 0 : std::is_same_v<G, bfloat16> ? 1 : 2];
  }
};

}  // namespace gradcomp

#endif
