// The CUDA side of nccl_reducer.hpp.
#include "nccl_reducer.hpp"

#include <gradcomp/cuda.cuh>

#include <chrono>

namespace train {
namespace {

class device_reducer : public reducer {
 public:
  device_reducer(options const& o, gradcomp::nccl_communicator& comm, gradcomp::bucket_layout const& layout)
      : space_{comm.stream()},
        gradient_(layout.size(), space_),
        reduce_(o.spec(), comm, layout, {.warmup_steps = o.warmup}) {}

  // The whole model is one bucket on the GPU, reduced once the backward pass
  // (on the host) is done.
  void ready(std::size_t, float const*) override {}
  void finish(float* gradient) override {
    auto const start = std::chrono::steady_clock::now();
    std::size_t const size = gradient_.size();
    space_.from_host(gradient_.data(), gradient, size * sizeof(float));
    reduce_(gradient_.view());
    space_.to_host(gradient, gradient_.data(), size * sizeof(float));  // waits for the stream
    busy_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::size_t wire_bytes() const override { return reduce_.wire_bytes(); }
  double comm_seconds() const override { return 0; }  // kernels and NCCL share the stream
  double reduction_seconds() const override { return busy_; }
  std::vector<std::byte> save() override { return reduce_.save(); }
  void restore(std::vector<std::byte> const& bytes) override { reduce_.restore({bytes.data(), bytes.size()}); }

 private:
  gradcomp::cuda_space space_;
  gradcomp::buffer<float, gradcomp::cuda_space> gradient_;
  gradcomp::any_allreducer<gradcomp::nccl_communicator> reduce_;  // NCCL, on the communicator's stream
  double busy_ = 0;
};

}  // namespace

reducer_factory nccl_reducers(options const& o, gradcomp::nccl_communicator& comm) {
  return [&o, &comm](gradcomp::bucket_layout const& layout) -> std::unique_ptr<reducer> {
    return std::make_unique<device_reducer>(o, comm, layout);
  };
}

}  // namespace train
