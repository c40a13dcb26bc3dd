// A plain C++ program built against an installed gradcomp: two in-process
// ranks average a gradient through the bf16 baseline.
#include <gradcomp/gradcomp.hpp>
#if CONSUMER_HAS_MPI
#include <gradcomp/collectives/mpi.hpp>
#endif
#if CONSUMER_HAS_NCCL
#include <gradcomp/nccl.hpp>
#endif

#include <cstdio>
#include <vector>

int main() {
  bool ok = true;
  gradcomp::local_group::run(2, [&](gradcomp::local_group::communicator& comm) {
    std::vector<float> gradient(1000, comm.rank() == 0 ? 1.0f : 3.0f);
    gradcomp::allreducer<gradcomp::bf16, gradcomp::error_feedback::residual, gradcomp::local_group::communicator>
        reduce(gradcomp::bf16{}, comm, gradcomp::bucket_layout(gradient.size()));
    reduce({gradient.data(), gradient.size()});
    if (gradient.front() != 2.0f || gradient.back() != 2.0f) ok = false;
  });
  std::printf("consumer: bf16 mean of 1 and 3 is %s\n", ok ? "2 (ok)" : "wrong");
  return ok ? 0 : 1;
}
