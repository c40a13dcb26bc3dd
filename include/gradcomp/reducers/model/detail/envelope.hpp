// The format of a model's checkpoint (model_buckets::save): one envelope for
// every model-level entry point, holding the steps counted and each bucket's
// own checkpoint with its index, its compressor and its parameters, so it
// loads on any number of lanes and into buckets built later.
#pragma once

#include <gradcomp/detail/hash.hpp>
#include <gradcomp/reducers/detail/checkpoint.hpp>
#include <gradcomp/reducers/model/options.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI::detail::model {

/// One bucket in an envelope.
struct saved_bucket {
  std::size_t index = 0;
  std::string spec;                    ///< The compressor it was built with ("" where unknown).
  std::vector<std::size_t> positions;  ///< The model's parameters it holds (handed-over buckets).
  std::vector<std::byte> bytes;        ///< Its reducer's checkpoint.
};

/// What an envelope holds.
struct envelope {
  std::uint64_t steps = 0;
  std::vector<saved_bucket> buckets;  ///< By increasing index.
};

/// The hash of what every rank's envelope must agree on: the compressors,
/// the bucket rules and the reducers' options (not the lanes, nor whether
/// they overlap).
inline std::uint64_t fingerprint_of(model_reducer_options const& o) {
  std::uint64_t h = hash("model_buckets");
  h = hash(o.compressor.str(), h);
  for (auto const& c : o.compressors) h = hash(c.str(), h);
  h = hash(o.small.str(), h);
  for (std::uint64_t word :
       {std::uint64_t{o.min_compression_elements}, std::uint64_t{o.vectors_uncompressed},
        std::uint64_t{o.bucket_cap_bytes}, std::uint64_t{o.first_bucket_cap_bytes},
        static_cast<std::uint64_t>(o.reduce.nonfinite), o.reduce.seed.value_or(~0ull),
        std::uint64_t{o.reduce.seed.has_value()}, o.reduce.warmup_steps, std::uint64_t{o.bf16_within_node}})
    h = hash_combine(h, word);
  return h;
}

/// The envelope of `buckets` after `steps` steps, sealed with `id`.
inline std::vector<std::byte> write_envelope(checkpoint_identity const& id, std::uint64_t steps,
                                             std::vector<saved_bucket> const& buckets) {
  checkpoint_writer w(id);
  w.word(steps);
  w.word(buckets.size());
  for (auto const& b : buckets) {
    w.word(b.index);
    w.word(b.spec.size());
    w.raw(b.spec.data(), b.spec.size());
    w.word(b.positions.size());
    for (std::size_t p : b.positions) w.word(p);
    w.word(b.bytes.size());
    w.raw(b.bytes.data(), b.bytes.size());
  }
  return std::move(w).finish();
}

/// Reads and checks an envelope sealed with `id` (its buckets' own
/// checkpoints are checked when they are restored); throws checkpoint_error.
inline envelope read_envelope(span<std::byte const> bytes, checkpoint_identity const& id) {
  checkpoint_reader r(open(bytes, id));
  envelope out;
  out.steps = r.word("the step count");
  std::uint64_t const count = r.word("the bucket count");
  for (std::uint64_t k = 0; k < count; ++k) {
    saved_bucket b;
    b.index = static_cast<std::size_t>(r.word("a bucket's index"));
    if (!out.buckets.empty() && b.index <= out.buckets.back().index)
      throw checkpoint_error("checkpoint: the buckets are not in increasing order of index");
    auto const spec = r.block("a bucket's compressor");
    b.spec.assign(reinterpret_cast<char const*>(spec.data()), spec.size());
    std::uint64_t const params = r.word("a bucket's parameter count");
    for (std::uint64_t p = 0; p < params; ++p) b.positions.push_back(static_cast<std::size_t>(r.word("a parameter")));
    auto const blob = r.block("a bucket's checkpoint");
    b.bytes.assign(blob.data(), blob.data() + blob.size());
    out.buckets.push_back(std::move(b));
  }
  r.finish();
  return out;
}

}  // namespace gradcomp::inline GRADCOMP_ABI::detail::model
