// gradcomp for nvcc translation units: everything in <gradcomp/gradcomp.hpp>
// plus the kernels that run the CUDA execution space.
#pragma once

#if !defined(__CUDACC__)
#error "<gradcomp/cuda.cuh> holds CUDA kernels: include it from a .cu file compiled by nvcc"
#endif

#include <gradcomp/compressors/topk/select.cuh>
#include <gradcomp/execution/cuda_kernels.cuh>
#include <gradcomp/gradcomp.hpp>
