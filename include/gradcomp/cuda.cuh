// gradcomp for nvcc translation units: everything in <gradcomp/gradcomp.hpp>
// plus the kernels that run the CUDA execution space. (PowerSGD on the
// device also needs cuBLAS at link time: CUDA::cublas.)
#pragma once

#if !defined(__CUDACC__)
#error "<gradcomp/cuda.cuh> holds CUDA kernels: include it from a .cu file compiled by nvcc"
#endif

#include <gradcomp/compressors/powersgd/powersgd.cuh>
#include <gradcomp/compressors/thc/thc.cuh>
#include <gradcomp/compressors/topk/select.cuh>
#include <gradcomp/execution/cuda_kernels.cuh>
#include <gradcomp/gradcomp.hpp>
