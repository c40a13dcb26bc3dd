// Gradients through NCCL, one GPU per rank: the host gradient is copied to
// the GPU, reduced there by the compressor's CUDA kernels and NCCL on the
// communicator's stream, and copied back for the host optimizer.
#pragma once

#include "trainer.hpp"

#include <gradcomp/nccl.hpp>

namespace train {

/// The reducers `o` names, over NCCL (defined in nccl_reducer.cu).
reducer_factory nccl_reducers(options const& o, gradcomp::nccl_communicator& comm);

}  // namespace train
