// Checkpoints: the byte format an allreducer's or a reducer's state is saved
// in, and the checks a restore makes before it changes anything.
//
// A checkpoint is an envelope around a body:
//
//   magic "gradcomp"  8 bytes
//   format            u32   (checkpoint_format; a reader refuses others)
//   kind              u32   (what saved it: an allreducer, a reducer)
//   fingerprint       u64   (the configuration's hash: compressor and its
//                            parameters, shapes, error feedback, options)
//   world size, rank  u32, u32
//   body length       u64
//   body              (kind-specific, little-endian words and raw floats)
//   checksum          u64   (FNV-1a over everything before it)
//
// open() checks them in that order and names the first that fails, so a
// truncated, corrupted, foreign or mismatched checkpoint gets a message that
// says which; nothing is restored until every check has passed.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/span.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A checkpoint that cannot be restored here: truncated, corrupted, of
/// another format version, saved by another rank, world size or
/// configuration. Nothing was changed.
class checkpoint_error : public invalid_argument {
 public:
  using invalid_argument::invalid_argument;
};

/// The checkpoint format this build writes and reads.
inline constexpr std::uint32_t checkpoint_format = 1;

/// What saved a checkpoint.
enum class checkpoint_kind : std::uint32_t {
  allreducer = 1,    ///< One bucket's allreducer.
  reducer = 2,       ///< A model-level reducer: its buckets' checkpoints.
  hierarchical = 3,  ///< One bucket's two-level reducer (all-reduce or reduce-scatter): its rail's checkpoint.
};

namespace detail {

static_assert(std::endian::native == std::endian::little, "checkpoints are written little-endian");

inline constexpr char checkpoint_magic[8] = {'g', 'r', 'a', 'd', 'c', 'o', 'm', 'p'};
inline constexpr std::size_t checkpoint_header_bytes = 8 + 4 + 4 + 8 + 4 + 4 + 8;

/// FNV-1a over bytes.
inline std::uint64_t checksum(std::byte const* data, std::size_t bytes, std::uint64_t h = hash_seed) {
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ static_cast<std::uint64_t>(data[i])) * 0x100000001b3ull;
  return h;
}

/// Who saved a checkpoint, and what configuration.
struct checkpoint_identity {
  checkpoint_kind kind;
  std::uint64_t fingerprint;
  std::uint32_t world_size, rank;
};

/// Writes a checkpoint: the header (its length patched by finish()), words
/// and length-prefixed blocks of the body, then the checksum.
class checkpoint_writer {
 public:
  explicit checkpoint_writer(checkpoint_identity const& id) {
    bytes_.reserve(256);  // the header and the first words without regrowing (and no false GCC 12 overflow warning)
    raw(checkpoint_magic, sizeof checkpoint_magic);
    std::uint32_t const format = checkpoint_format, kind = static_cast<std::uint32_t>(id.kind);
    raw(&format, 4);
    raw(&kind, 4);
    word(id.fingerprint);
    raw(&id.world_size, 4);
    raw(&id.rank, 4);
    word(0);  // the body's length
  }
  void word(std::uint64_t value) { raw(&value, sizeof value); }
  void raw(void const* data, std::size_t bytes) {
    auto const* p = static_cast<std::byte const*>(data);
    bytes_.insert(bytes_.end(), p, p + bytes);
  }
  /// A length-prefixed block copied from `space`'s memory.
  template <class Space>
  void block_from(Space const& space, void const* data, std::size_t bytes) {
    word(bytes);
    std::size_t const at = bytes_.size();
    bytes_.resize(at + bytes);
    if (bytes > 0) space.to_host(bytes_.data() + at, data, bytes);
  }
  /// The checkpoint.
  std::vector<std::byte> finish() && {
    std::uint64_t const length = bytes_.size() - checkpoint_header_bytes;
    std::memcpy(bytes_.data() + checkpoint_header_bytes - 8, &length, 8);
    word(checksum(bytes_.data(), bytes_.size()));
    return std::move(bytes_);
  }

 private:
  std::vector<std::byte> bytes_;
};

/// Reads a body back, throwing checkpoint_error naming what it was reading
/// when the body ends too soon.
class checkpoint_reader {
 public:
  explicit checkpoint_reader(span<std::byte const> body) : body_(body) {}
  std::uint64_t word(char const* what) {
    std::uint64_t value = 0;
    std::memcpy(&value, take(sizeof value, what).data(), sizeof value);
    return value;
  }
  /// A length-prefixed block that must hold `expected` bytes.
  span<std::byte const> block(std::size_t expected, char const* what) {
    std::uint64_t const bytes = word(what);
    if (bytes != expected)
      throw checkpoint_error(std::string("checkpoint: ") + what + " holds " + std::to_string(bytes) +
                             " bytes where this configuration has " + std::to_string(expected));
    return take(expected, what);
  }
  /// A length-prefixed block of any length.
  span<std::byte const> block(char const* what) { return take(word(what), what); }
  /// Throws unless the body was read to its end.
  void finish() const {
    if (at_ != body_.size())
      throw checkpoint_error("checkpoint: " + std::to_string(body_.size() - at_) + " unexpected bytes after the state");
  }

 private:
  span<std::byte const> take(std::uint64_t bytes, char const* what) {
    if (bytes > body_.size() - at_)
      throw checkpoint_error(std::string("checkpoint: the body ends before ") + what + " (" +
                             std::to_string(body_.size() - at_) + " bytes left, " + std::to_string(bytes) + " needed)");
    span<std::byte const> out(body_.data() + at_, static_cast<std::size_t>(bytes));
    at_ += static_cast<std::size_t>(bytes);
    return out;
  }
  span<std::byte const> body_;
  std::size_t at_ = 0;
};

inline char const* kind_name(std::uint32_t kind) {
  switch (kind) {
    case static_cast<std::uint32_t>(checkpoint_kind::allreducer):
      return "an allreducer";
    case static_cast<std::uint32_t>(checkpoint_kind::reducer):
      return "a reducer";
    case static_cast<std::uint32_t>(checkpoint_kind::hierarchical):
      return "a hierarchical reducer";
    default:
      return "an unknown kind of object";
  }
}

/// The body of `bytes`, after checking the envelope against `expected`
/// (throws checkpoint_error naming the first check that fails).
inline span<std::byte const> open(span<std::byte const> bytes, checkpoint_identity const& expected) {
  auto fail = [](std::string const& why) { throw checkpoint_error("checkpoint: " + why); };
  if (bytes.size() < sizeof checkpoint_magic || std::memcmp(bytes.data(), checkpoint_magic, 8) != 0)
    fail(bytes.size() < sizeof checkpoint_magic ? "truncated: " + std::to_string(bytes.size()) + " bytes"
                                                : std::string("not a gradcomp checkpoint (no magic)"));
  if (bytes.size() < checkpoint_header_bytes + 8)
    fail("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the header");
  auto u32 = [&](std::size_t at) {
    std::uint32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    return v;
  };
  auto u64 = [&](std::size_t at) {
    std::uint64_t v;
    std::memcpy(&v, bytes.data() + at, 8);
    return v;
  };
  std::uint32_t const format = u32(8), kind = u32(12), world = u32(24), rank = u32(28);
  std::uint64_t const fingerprint = u64(16), length = u64(32);
  if (format != checkpoint_format)
    fail("format version " + std::to_string(format) + " is not supported (this build reads version " +
         std::to_string(checkpoint_format) + ")");
  if (length > bytes.size() - checkpoint_header_bytes - 8 || bytes.size() != checkpoint_header_bytes + length + 8)
    fail("truncated or padded: " + std::to_string(bytes.size()) + " bytes where the header announces " +
         (length > bytes.size() ? std::string("more") : std::to_string(checkpoint_header_bytes + length + 8)));
  std::size_t const sealed = checkpoint_header_bytes + static_cast<std::size_t>(length);
  if (checksum(bytes.data(), sealed) != u64(sealed)) fail("corrupted: the checksum does not match the contents");
  if (kind != static_cast<std::uint32_t>(expected.kind))
    fail(std::string("saved by ") + kind_name(kind) + ", restored into " +
         kind_name(static_cast<std::uint32_t>(expected.kind)));
  if (world != expected.world_size)
    fail("saved on " + std::to_string(world) + " ranks, restored on " + std::to_string(expected.world_size) +
         " (residuals are per rank: a checkpoint restores only on the world size that saved it)");
  if (rank != expected.rank)
    fail("saved by rank " + std::to_string(rank) + ", restored on rank " + std::to_string(expected.rank));
  if (fingerprint != expected.fingerprint)
    fail(
        "saved with a different configuration (compressor, its parameters, tensor shapes, error feedback, "
        "aggregator or options)");
  return bytes.subspan(checkpoint_header_bytes, static_cast<std::size_t>(length));
}

/// Several reducers' checkpoints in one (a model's buckets): their count,
/// then each one's bytes, under `id`. `reducers` holds pointers.
template <class Reducers>
std::vector<std::byte> save_each(checkpoint_identity const& id, Reducers const& reducers) {
  checkpoint_writer w(id);
  w.word(reducers.size());
  for (auto const& r : reducers) {
    auto const blob = r->save();
    w.word(blob.size());
    w.raw(blob.data(), blob.size());
  }
  return std::move(w).finish();
}

/// Checks and parses what save_each wrote, reducer by reducer (each one's
/// parse_checkpoint), changing nothing; throws checkpoint_error.
template <class Reducers>
auto parse_each(span<std::byte const> bytes, checkpoint_identity const& id, Reducers const& reducers) {
  std::vector<decltype(reducers.front()->parse_checkpoint(span<std::byte const>{}))> parsed;
  checkpoint_reader r(open(bytes, id));
  std::uint64_t const count = r.word("the bucket count");
  if (count != reducers.size())
    throw checkpoint_error("checkpoint: " + std::to_string(count) + " buckets where this model has " +
                           std::to_string(reducers.size()));
  for (auto const& reducer : reducers) parsed.push_back(reducer->parse_checkpoint(r.block("a bucket")));
  r.finish();
  return parsed;
}

}  // namespace detail
}  // namespace gradcomp
