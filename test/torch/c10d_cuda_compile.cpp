// The c10d backend's device path compiles (CI has nvcc and a CUDA PyTorch but
// no GPU; the GPU runs are the device checks'): every collective, for every
// wire type, on device buffers ordered on a stream. And the DDP hook state's
// step in a host compiler's translation unit with gradcomp::cuda linked (the
// kernels it needs for device buckets come from a ddp_hook_device, which
// the Python module's .cu file makes).
#include <gradcomp/collectives/c10d.hpp>
#include <gradcomp/torch/ddp_hook.hpp>

#include <cstdint>

static_assert(GRADCOMP_HAS_CUDA, "link gradcomp::cuda: this file checks the CUDA path");

namespace gradcomp {

template <class... T>
void every_call(c10d_communicator& c, std::byte* memory, std::size_t n) {
  (
      [&] {
        auto* p = reinterpret_cast<T*>(memory);
        c.all_reduce(p, p, n, reduce_op::max);
        c.all_gather(p, p, n);
        c.broadcast(p, n, 0);
        c.reduce_scatter(p, p, n, reduce_op::sum);
      }(),
      ...);
}

void device_path(c10::intrusive_ptr<c10d::ProcessGroup> group, cudaStream_t stream, std::byte* memory, std::size_t n) {
  c10d_communicator c(std::move(group), stream);
  every_call<float, double, half, bfloat16, std::int8_t, std::uint8_t, std::int32_t, std::uint32_t, std::int64_t,
             std::uint64_t>(c, memory, n);
  (void)c.split(0, c.rank());
}

void hook_path(ddp_hook_state& state, at::Tensor const& bucket) { (void)state.reduce(0, bucket, {}, {{4, 4}}, true); }

}  // namespace gradcomp
