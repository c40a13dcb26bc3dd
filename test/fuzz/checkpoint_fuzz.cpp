// libFuzzer target: any bytes given to an allreducer's restore() are either
// a checkpoint it restores exactly (save() then writes the same bytes back)
// or refused with checkpoint_error and nothing changed; never a crash, a
// read out of bounds or undefined behaviour (built with ASan and UBSan).
//
//   checkpoint_fuzz -max_total_time=60
//
// The first input byte picks how the rest is used: as it is, resealed (the
// header's length and the checksum made right, so the fuzzer gets past the
// envelope), or as edits (offset, value) to a valid checkpoint, resealed
// (so it reaches the body's and the values' checks).
#include <gradcomp/gradcomp.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using namespace gradcomp;
using reducer =
    allreducer<powersgd<>, error_feedback::residual, single_rank<host_space>, allreduce_aggregator, host_space>;

struct state {
  single_rank<host_space> world;
  reducer reduce;
  std::vector<std::byte> pristine;

  state()
      : reduce(powersgd<>{.matrix_rank = 2, .min_compression_rate = 1}, world, layout(), host_space{},
               {.warmup_steps = 1}) {
    std::vector<float> g(reduce.layout().size());
    for (int step = 0; step < 3; ++step) {
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 7 + step) % 13) - 6.0f;
      reduce({g.data(), g.size()});
    }
    pristine = reduce.save();
  }
  static bucket_layout layout() {
    bucket_layout l;
    l.add({12, 9}).add({9});
    return l;
  }
};

void reseal(std::vector<std::byte>& b) {
  if (b.size() < detail::checkpoint_header_bytes + 8) return;
  std::uint64_t const length = b.size() - detail::checkpoint_header_bytes - 8;
  std::memcpy(b.data() + detail::checkpoint_header_bytes - 8, &length, 8);
  std::uint64_t const sum = detail::checksum(b.data(), b.size() - 8);
  std::memcpy(b.data() + b.size() - 8, &sum, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size) {
  static state s;
  if (size == 0) return 0;
  std::vector<std::byte> bytes;
  switch (data[0] % 3) {
    case 0:
      bytes.assign(reinterpret_cast<std::byte const*>(data + 1), reinterpret_cast<std::byte const*>(data + size));
      break;
    case 1:
      bytes.assign(reinterpret_cast<std::byte const*>(data + 1), reinterpret_cast<std::byte const*>(data + size));
      reseal(bytes);
      break;
    default:
      bytes = s.pristine;
      for (std::size_t i = 1; i + 2 < size; i += 3) {  // (offset: 2 bytes, value: 1 byte)
        std::size_t const at = (static_cast<std::size_t>(data[i]) << 8 | data[i + 1]) % (bytes.size() + 16);
        if (at < bytes.size())
          bytes[at] = static_cast<std::byte>(data[i + 2]);
        else
          bytes.resize(at - bytes.size() < 8 ? at : bytes.size() - (at - bytes.size()));  // grow or cut
      }
      reseal(bytes);
  }
  try {
    s.reduce.restore({bytes.data(), bytes.size()});
  } catch (checkpoint_error const&) {
    if (s.reduce.save() != s.pristine) std::abort();  // a refused restore changed something
    return 0;
  }
  if (s.reduce.save() != bytes) std::abort();  // what was restored is not what save() writes
  s.reduce.restore({s.pristine.data(), s.pristine.size()});
  return 0;
}
