// Must not compile: PowerSGD cannot reduce-scatter (a shard of a matrix is not
// a matrix of the same rank). ctest checks the compiler's message.
#include <gradcomp/gradcomp.hpp>

int main() {
  gradcomp::local_group::run(1, [](gradcomp::local_group::communicator& comm) {
    gradcomp::reduce_scatterer<gradcomp::powersgd<>, gradcomp::error_feedback::residual,
                               gradcomp::local_group::communicator, gradcomp::host_space>
        reducer(gradcomp::powersgd<>{}, comm, gradcomp::bucket_layout{{16, 16}});
  });
}
