// The extension module gradcomp.torch._C: gradcomp's Python bindings
// (gradcomp/torch/python.hpp), with the CUDA buckets' device where the build
// compiled device.cu (GRADCOMP_TORCH_DEVICE_BUCKETS).
#include <gradcomp/torch/python.hpp>

#ifdef GRADCOMP_TORCH_DEVICE_BUCKETS
gradcomp::ddp_hook_device const& gradcomp_torch_device();  // device.cu (nvcc)

PYBIND11_MODULE(_C, m) { gradcomp::python::define(m, &gradcomp_torch_device()); }
#else
PYBIND11_MODULE(_C, m) { gradcomp::python::define(m); }
#endif
