// Must not compile: a compressor whose payload is not summable paired with
// the all-reduce aggregator. ctest checks the compiler's message.
#include <gradcomp/gradcomp.hpp>

namespace {

// Like fp32, but declares its payload not summable (as classic TopK's
// (index, value) pairs are not).
struct unsummable : gradcomp::fp32 {
  static constexpr bool summable_payload = false;
};

}  // namespace

int main() {
  gradcomp::local_group::run(1, [](gradcomp::local_group::communicator& comm) {
    gradcomp::allreducer<unsummable, gradcomp::error_feedback::none, gradcomp::local_group::communicator,
                         gradcomp::allreduce_aggregator>
        reducer(unsummable{}, comm, gradcomp::bucket_layout(8));
  });
}
