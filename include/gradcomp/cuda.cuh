// gradcomp for nvcc translation units: everything in <gradcomp/gradcomp.hpp>
// plus the kernels that run the CUDA execution space. (PowerSGD on the
// device also needs cuBLAS at link time: CUDA::cublas.)
#pragma once

#if !defined(__CUDACC__)
#error "<gradcomp/cuda.cuh> holds CUDA kernels: include it from a .cu file compiled by nvcc"
#endif

#include <gradcomp/gradcomp.hpp>

// The algorithms' kernels
#include <gradcomp/algorithm/segmented_reduce.cuh>
#include <gradcomp/algorithm/top_k.cuh>
#include <gradcomp/algorithm/transform.cuh>
#include <gradcomp/execution/cuda_kernels.cuh>

// Compressors with kernels of their own
#include <gradcomp/compressors/powersgd/powersgd.cuh>
#include <gradcomp/compressors/thc/thc.cuh>
