// gradcomp: gradient compression for data-parallel training.
//
// This umbrella header brings in everything that compiles with a plain C++
// compiler: the core types, the execution spaces (the CUDA space's
// declarations where the CUDA runtime headers are found), the algorithms,
// the in-process collectives, the pipeline and every compressor. Backends
// with dependencies are separate: <gradcomp/nccl.hpp>
// (gradcomp::nccl) and <gradcomp/collectives/mpi.hpp> (gradcomp::mpi). CUDA
// kernels need <gradcomp/cuda.cuh> in a .cu file.
#pragma once

// Core
#include <gradcomp/bucket_layout.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/random.hpp>
#include <gradcomp/span.hpp>
#include <gradcomp/types.hpp>
#include <gradcomp/version.hpp>

// Where loops run, and what they are made of
#include <gradcomp/algorithm/segmented_reduce.hpp>
#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/algorithm/top_k.hpp>
#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/execution.hpp>

// Collectives
#include <gradcomp/collectives/any_collective.hpp>
#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/collectives/dry_run.hpp>
#include <gradcomp/collectives/local_group.hpp>
#include <gradcomp/collectives/single_rank.hpp>

// The pipeline
#include <gradcomp/pipeline/aggregator.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/pipeline/error_feedback.hpp>
#include <gradcomp/pipeline/nonfinite.hpp>
#include <gradcomp/pipeline/registration.hpp>

// Compressors: every one, through the registry that lists them
#include <gradcomp/compressors/registry.hpp>

// Reducers: a bucket's compressed all-reduce, with its compressor fixed or
// chosen at run time
#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/any_allreducer.hpp>
#include <gradcomp/reducers/any_reduce_scatterer.hpp>
#include <gradcomp/reducers/hierarchical.hpp>
#include <gradcomp/reducers/hierarchical_reduce_scatterer.hpp>
#include <gradcomp/reducers/model_reducer.hpp>
#include <gradcomp/reducers/reduce_scatterer.hpp>

// The planner: whether, and with which compressor, compression pays here
#include <gradcomp/planning/network.hpp>
#include <gradcomp/planning/planner.hpp>
