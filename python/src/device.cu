// What the module needs of nvcc: the DDP hook's CUDA buckets. Built where
// nvcc exists and PyTorch is a CUDA build; the module's host loops stay the
// host compiler's (module.cpp).
#include <gradcomp/torch/ddp_hook_device.cuh>

gradcomp::ddp_hook_device const& gradcomp_torch_device() { return gradcomp::cuda_ddp_hook_device(); }
