// The CUDA side of nccl_reducer.hpp.
#include "nccl_reducer.hpp"

#include <gradcomp/cuda.cuh>

namespace train {
namespace {

class device_reducer : public reducer {
 public:
  device_reducer(options const& o, gradcomp::nccl_communicator& comm, gradcomp::bucket_layout const& layout)
      : space_{comm.stream()}, gradient_(layout.size(), space_), reduce_(o.spec(), comm, layout, {.warmup_steps = o.warmup}) {}

  void reduce(float* gradient, std::size_t size) override {
    space_.from_host(gradient_.data(), gradient, size * sizeof(float));
    reduce_(gradient_.view());
    space_.to_host(gradient, gradient_.data(), size * sizeof(float));  // waits for the stream
  }
  std::size_t wire_bytes() const override { return reduce_.wire_bytes(); }
  double comm_seconds() const override { return 0; }  // kernels and NCCL share the stream

 private:
  gradcomp::cuda_space space_;
  gradcomp::buffer<float, gradcomp::cuda_space> gradient_;
  gradcomp::any_allreducer<gradcomp::nccl_communicator> reduce_;  // NCCL, on the communicator's stream
};

}  // namespace

reducer_factory nccl_reducers(options const& o, gradcomp::nccl_communicator& comm) {
  return [&o, &comm](gradcomp::bucket_layout const& layout) -> std::unique_ptr<reducer> {
    return std::make_unique<device_reducer>(o, comm, layout);
  };
}

}  // namespace train
