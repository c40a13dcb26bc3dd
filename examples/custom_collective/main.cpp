// A collective backend of your own, used by an allreducer: see
// examples/common/timed_collective.hpp for the class (it wraps another
// backend and measures time and bytes spent communicating).
#include "../common/timed_collective.hpp"

#include <gradcomp/gradcomp.hpp>

#include <cstdio>
#include <type_traits>
#include <vector>

static_assert(gradcomp::collective<timed_collective<gradcomp::local_group::communicator>>);
// Its optional members follow the backend's: local_group's buffers are the
// host's (a timed nccl_communicator's would be its stream's cuda_space).
static_assert(std::is_same_v<gradcomp::default_space_t<timed_collective<gradcomp::local_group::communicator>>,
                             gradcomp::host_space>);

int main() {
  std::size_t const d = 1 << 22;
  gradcomp::local_group::run(4, [&](gradcomp::local_group::communicator& comm) {
    timed_collective<gradcomp::local_group::communicator> timed(comm);
    gradcomp::allreducer<gradcomp::bf16, gradcomp::error_feedback::residual, decltype(timed)> reduce(
        gradcomp::bf16{}, timed, gradcomp::bucket_layout(d));
    std::vector<float> gradient(d, 0.25f * static_cast<float>(comm.rank()));
    for (int step = 0; step < 5; ++step) reduce({gradient.data(), gradient.size()});
    if (comm.rank() == 0)
      std::printf("rank 0: %d collective calls, %zu bytes, %.3f s communicating over 5 steps; mean %.4f\n",
                  timed.calls(), timed.bytes(), timed.seconds(), gradient[0]);
  });
}
