// The options of a bucket's reducers that are not the compressor's
// parameters, and a bucket's checkpointed state.
#pragma once

#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/pipeline/nonfinite.hpp>
#include <gradcomp/reducers/detail/checkpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Options of an allreducer that are not the compressor's parameters.
struct allreducer_options {
  /// What a step does with NaN, infinity or out-of-lane values.
  nonfinite_policy nonfinite = nonfinite_policy::raise;
  /// This bucket's position in the model: buckets of the same shapes draw
  /// different random numbers when their compressor sets no seed.
  std::uint64_t bucket = 0;
  /// Seeds this bucket's random streams when the compressor sets no seed;
  /// unset: derived from the bucket's identity (its layout and `bucket`).
  std::optional<std::uint64_t> seed{};
  /// The first `warmup_steps` committed steps send the plain fp32 mean, with
  /// no error feedback (PyTorch's start_powerSGD_iter, for every
  /// compressor); the compressor starts at the next one with a zero
  /// residual and fresh state, counting its own steps from 0.
  std::uint64_t warmup_steps = 0;
};

/// One bucket's state, read from a checkpoint and checked, not yet applied
/// (allreducer::parse_checkpoint; restore applies it).
struct bucket_checkpoint {
  std::uint64_t steps = 0;       ///< Committed steps, warm-up included.
  std::vector<float> residual;   ///< The error-feedback residual (empty without).
  std::vector<std::byte> state;  ///< The compressor's state kept across steps.
};

namespace detail {
/// What `parse` (a checkpoint's parse) returns, or the checkpoint_error it
/// threw, for the agreement of every rank before any restores.
template <class Parse>
auto parsed_or_why(Parse&& parse) -> std::pair<decltype(parse()), std::string> {
  try {
    return {parse(), {}};
  } catch (checkpoint_error const& e) {
    return {{}, e.what()};
  }
}

/// A bucket's checkpoint sealed with `id`: its committed steps, its residual
/// and its compressor's kept state, read from `space`.
template <class Space>
std::vector<std::byte> write_bucket_checkpoint(checkpoint_identity const& id, Space const& space, std::uint64_t steps,
                                               span<float const, typename Space::memory> residual,
                                               span<std::byte const, typename Space::memory> state) {
  checkpoint_writer w(id);
  w.word(steps);
  w.block_from(space, residual.data(), residual.size_bytes());
  w.block_from(space, state.data(), state.size());
  return std::move(w).finish();
}

/// Reads and checks a bucket's checkpoint sealed with `id` (a residual of
/// `residual_elements` floats, `state_bytes` of `compressor`'s kept state);
/// throws checkpoint_error naming what is wrong.
template <class Compressor>
bucket_checkpoint parse_bucket_checkpoint(span<std::byte const> bytes, checkpoint_identity const& id,
                                          std::size_t residual_elements, std::size_t state_bytes,
                                          Compressor const& compressor) {
  checkpoint_reader r(open(bytes, id));
  bucket_checkpoint c;
  c.steps = r.word("the step count");
  auto const residual = r.block(residual_elements * sizeof(float), "the residual");
  c.residual.resize(residual.size() / sizeof(float));
  if (!residual.empty()) std::memcpy(c.residual.data(), residual.data(), residual.size());
  for (float x : c.residual)
    if (!is_finite(x)) throw checkpoint_error("checkpoint: the residual holds NaN or infinite values");
  auto const state = r.block(state_bytes, "the compressor's state");
  if (char const* why = state_problem_of(compressor, state)) throw checkpoint_error(std::string("checkpoint: ") + why);
  c.state.assign(state.data(), state.data() + state.size());
  r.finish();
  return c;
}
}  // namespace detail

}  // namespace gradcomp
