// gradcomp: gradient compression for data-parallel training.
//
// This umbrella header brings in everything that compiles with a plain C++
// compiler: the concepts, the host execution space (and the CUDA space's
// declarations where the CUDA runtime headers are found), the in-process
// collective, the pipeline and the compressors. Backends with dependencies
// are separate: <gradcomp/collectives/nccl.hpp> (gradcomp::nccl) and
// <gradcomp/collectives/mpi.hpp> (gradcomp::mpi). CUDA kernels need
// <gradcomp/cuda.cuh> in a .cu file.
#pragma once

#include <gradcomp/aggregator.hpp>
#include <gradcomp/allreducer.hpp>
#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/collective.hpp>
#include <gradcomp/collectives/local_group.hpp>
#include <gradcomp/collectives/single_rank.hpp>
#include <gradcomp/compressor.hpp>
#include <gradcomp/compressors/baseline.hpp>
#include <gradcomp/compressors/powersgd.hpp>
#include <gradcomp/compressors/quantize.hpp>
#include <gradcomp/compressors/thc.hpp>
#include <gradcomp/compressors/topk.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/error_feedback.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/random.hpp>
#include <gradcomp/span.hpp>
#include <gradcomp/types.hpp>
