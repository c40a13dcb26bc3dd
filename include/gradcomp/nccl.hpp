// gradcomp over NCCL (component gradcomp::nccl): the NCCL backend and the
// reducers that default to it, kernels on the communicator's CUDA stream.
//
//   gradcomp::nccl_communicator comm(nccl, stream);
//   gradcomp::nccl_allreducer<gradcomp::bf16, gradcomp::error_feedback::none> reduce(gradcomp::bf16{}, comm, layout);
//
// Without the CUDA runtime and <nccl.h> this header declares
// nccl_communicator only (see <gradcomp/collectives/nccl.hpp>).
#pragma once

#include <gradcomp/collectives/nccl.hpp>
#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/reduce_scatterer.hpp>

#if GRADCOMP_HAS_CUDA && __has_include(<nccl.h>)
namespace gradcomp::inline GRADCOMP_ABI {

/// One bucket's compressed all-reduce over NCCL, in the communicator's
/// stream: allreducer with NCCL's collective and space filled in.
template <class Compressor, class ErrorFeedback, class Aggregator = default_aggregator_t<Compressor>>
using nccl_allreducer = allreducer<Compressor, ErrorFeedback, nccl_communicator, Aggregator, cuda_space>;

/// Each rank's shard of a bucket's mean over NCCL: reduce_scatterer with
/// NCCL's collective and space filled in.
template <class Compressor, class ErrorFeedback, gradient_element Gradient = float>
using nccl_reduce_scatterer = reduce_scatterer<Compressor, ErrorFeedback, nccl_communicator, cuda_space, Gradient>;

}  // namespace gradcomp
#endif
