// What a rank of the training example saves to resume a run, one file per
// rank, and the weights' hash that runs are compared by.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

/// What a rank saves to resume a run: the weights, the optimizer's momentum
/// (of this rank's shards: all of them unless the optimizer is sharded), the
/// reducer's state and where the run was. One file per rank.
struct checkpoint {
  std::uint64_t step = 0;
  double wall_s = 0, loss_sum = 0;
  std::uint64_t loss_count = 0, wire = 0;
  std::vector<float> weights, velocity;
  std::vector<std::byte> reducer;

  static std::string file(std::string const& path, int rank) { return path + ".rank" + std::to_string(rank); }

  void write(std::string const& path) const {
    std::string const tmp = path + ".partial";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      auto put = [&](void const* p, std::size_t n) { out.write(static_cast<char const*>(p), static_cast<long>(n)); };
      std::uint64_t const sizes[3] = {weights.size(), velocity.size(), reducer.size()};
      put(magic, sizeof magic);
      put(&step, 8), put(&wall_s, 8), put(&loss_sum, 8), put(&loss_count, 8), put(&wire, 8), put(sizes, sizeof sizes);
      put(weights.data(), weights.size() * 4), put(velocity.data(), velocity.size() * 4);
      put(reducer.data(), reducer.size());
      if (!out) throw std::runtime_error("cannot write the checkpoint " + tmp);
    }
    std::rename(tmp.c_str(), path.c_str());  // a crash mid-write leaves the last whole checkpoint
  }

  /// Reads a file write() wrote for a model of `d` parameters, of which
  /// this rank owns `owned` (its momentum's length).
  static checkpoint read(std::string const& path, std::size_t d, std::size_t owned) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open the checkpoint " + path);
    checkpoint c;
    auto get = [&](void* p, std::size_t n) {
      if (!in.read(static_cast<char*>(p), static_cast<long>(n)))
        throw std::runtime_error("the checkpoint " + path + " is truncated");
    };
    char m[sizeof magic];
    std::uint64_t sizes[3];
    get(m, sizeof m);
    if (std::memcmp(m, magic, sizeof m) != 0) throw std::runtime_error(path + " is not a training checkpoint");
    get(&c.step, 8), get(&c.wall_s, 8), get(&c.loss_sum, 8), get(&c.loss_count, 8), get(&c.wire, 8),
        get(sizes, sizeof sizes);
    if (sizes[0] != d)
      throw std::runtime_error("the checkpoint " + path + " is of a model of " + std::to_string(sizes[0]) +
                               " parameters; this one has " + std::to_string(d));
    if (sizes[1] != owned)
      throw std::runtime_error("the checkpoint " + path + " holds the momentum of " + std::to_string(sizes[1]) +
                               " parameters; this rank updates " + std::to_string(owned) +
                               " (is the optimizer sharded in one run and not the other?)");
    if (sizes[2] > (std::uint64_t{1} << 32)) throw std::runtime_error("the checkpoint " + path + " is corrupt");
    c.weights.resize(d), c.velocity.resize(owned), c.reducer.resize(sizes[2]);
    get(c.weights.data(), d * 4), get(c.velocity.data(), owned * 4), get(c.reducer.data(), c.reducer.size());
    return c;
  }

  static constexpr char magic[8] = {'G', 'C', 'T', 'R', 'A', 'I', 'N', '1'};
};

inline std::uint64_t weights_hash(std::vector<float> const& w) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (float v : w) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    hash = (hash ^ bits) * 0x100000001b3ull;
  }
  return hash;
}

}  // namespace train
