// transform: the element-wise pass every compressor is made of.
//
//   transform(space, n, inputs(g, e), outputs(payload, e_next), op, options)
//
// calls op(i, g[i], e[i], payload[i], e_next[i]) for every i in [0, n): op
// reads the input values and assigns the outputs through references. An op
// that returns bool marks an element bad (true), and options.count adds up
// the bad ones; an op with bind() has it called once per thread before its
// elements (to read a step's scalars from memory once). An op whose element
// work a compiler cannot vectorize (it gathers or scatters at indices it
// computes, or calls a math library function) says so with
// `static constexpr bool vectorizes = false`: its host loop is then left to
// the compiler instead of being declared vectorizable. The streams are
// pointers, spans or the kinds of <gradcomp/algorithm/streams.hpp>.
//
// Host: OpenMP threads over chunks of 2048 elements; inside a chunk every
// stream is a plain array (noise drawn for the chunk first), so the element
// loop vectorizes; an output larger than the cache is written with streaming
// stores (host_space::streamed_bytes). CUDA (transform.cuh): a tile of 256
// threads x `items` per block, each thread's items loaded and stored as
// 16-byte vectors where the stream's alignment allows (a scalar tail
// otherwise); `items` is chosen in one place, transform_shape, from the bytes
// the pass reads per element.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/detail/convert.hpp>
#include <gradcomp/detail/streaming_store.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/tuning.hpp>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// What transform counts, and what may switch it off.
struct transform_options {
  /// Adds the number of elements op marked bad here (memory of the space).
  std::uint64_t* count = nullptr;
  /// The pass runs only while this gate is open (see gate).
  gate when{};
};

namespace detail {

/// Elements per host chunk (tuning::transform_policy).
inline constexpr std::size_t host_chunk = tuning::transform_policy::host_chunk;

template <class T>
struct zero_cursor {
  T operator[](std::size_t) const { return T{}; }
};
// A discarded output still gets an element of its own per lane: one shared
// sink would be a store every lane makes to one address, which keeps the
// element loop from vectorizing (the stores die with the chunk).
template <class T>
struct discard_cursor {
  T sink[host_chunk];
  T& operator[](std::size_t k) { return sink[k]; }
};

// Input cursors of one host chunk [begin, begin + len): element k at [k].
template <class T>
T const* host_input(T const* p, std::size_t begin, std::size_t, float*) {
  return p + begin;
}
template <class T>
T const* host_input(T* p, std::size_t begin, std::size_t, float*) {
  return p + begin;
}
template <class T>
zero_cursor<T> host_input(zeros<T>, std::size_t, std::size_t, float*) {
  return {};
}
// A 16-bit input: the chunk widened into its staging floats first.
template <class T>
float const* host_input(widened<T> s, std::size_t begin, std::size_t len, float* staging) {
  widen_run(s.data + begin, staging, len);
  return staging;
}
inline float const* host_input(rounding_noise const& noise, std::size_t begin, std::size_t len, float* uniforms) {
  uint4x32 words[host_chunk / 8];
  std::size_t const calls = (len + 7) / 8;
  noise.stream.blocks(begin / 8, calls, words);
  static_assert(std::endian::native == std::endian::little, "the 16-bit uniforms are read as halves of words");
  auto const* halves = reinterpret_cast<std::uint16_t const*>(words);  // uniform16's order: low half first
  for (std::size_t k = 0; k < calls * 8; ++k) uniforms[k] = to_unit_float16(halves[k]);
  return uniforms;
}

// Outputs go straight to memory, except 16-bit ones: the chunk's floats are
// staged, then narrowed (flush) once the chunk's elements are done. A
// discarded float output (no error feedback's residual) is staged too, and
// dropped: a pointer like the others, so the element loop keeps every cursor
// in a register.
template <class S>
inline constexpr bool is_widened = false;
template <class T>
inline constexpr bool is_widened<widened<T>> = true;
template <class S>
inline constexpr bool is_staged = is_widened<S> || std::is_same_v<S, discard<float>>;

// An output of more than host_space::streamed_bytes is written around the
// cache: its chunk's elements go to a chunk buffer, which the flush copies
// out with streaming stores (so the pass does not read the lines it
// overwrites). A chunk whose memory is not 16-byte aligned is written as usual.
template <class S>
struct stream_chunk {};
template <class T>
struct stream_chunk<T*> {
  alignas(64) T data[host_chunk];
};
template <class T>
struct stream_chunk<widened<T>> {
  alignas(64) T data[host_chunk];
};
// The memory a resolved stream reads or writes (null: none of its own).
template <class S>
void const* stream_memory(S) {
  return nullptr;
}
template <class T>
void const* stream_memory(T* p) {
  return p;
}
template <class T>
void const* stream_memory(widened<T> s) {
  return s.data;
}
// Whether output `s` streams in the chunk at `begin` of an n-element pass
// that reads `inputs` (streams_output).
template <class T, class... In>
bool host_streams(std::size_t above, T* s, std::size_t begin, std::size_t n, In const&... inputs) {
  return streams_output(above, s, begin, n, stream_memory(inputs)...);
}
template <class T, class... In>
bool host_streams(std::size_t above, widened<T> s, std::size_t begin, std::size_t n, In const&... inputs) {
  return streams_output(above, s.data, begin, n, stream_memory(inputs)...);
}
template <class T, class... In>
bool host_streams(std::size_t, discard<T>, std::size_t, std::size_t, In const&...) {
  return false;
}

// Output K's row of the chunk's staging floats where it is staged, else none.
template <std::size_t K, class S, std::size_t Rows>
float* staging_row(float (&staging)[Rows][host_chunk]) {
  if constexpr (is_staged<S>)
    return staging[K];
  else
    return nullptr;
}

template <class T>
T* host_output(T* p, std::size_t begin, float*, stream_chunk<T*>& chunk, bool streamed) {
  return streamed ? chunk.data : p + begin;
}
template <class T>
discard_cursor<T> host_output(discard<T>, std::size_t, float*, stream_chunk<discard<T>>&, bool) {
  return {};
}
inline float* host_output(discard<float>, std::size_t, float* staging, stream_chunk<discard<float>>&, bool) {
  return staging;
}
template <class T>
float* host_output(widened<T>, std::size_t, float* staging, stream_chunk<widened<T>>&, bool) {
  return staging;
}

template <class T>
void host_flush(T* p, std::size_t begin, std::size_t len, float const*, stream_chunk<T*> const& chunk, bool streamed) {
  if (streamed) stream_copy(p + begin, chunk.data, len * sizeof(T));
}
template <class T>
void host_flush(discard<T>, std::size_t, std::size_t, float const*, stream_chunk<discard<T>> const&, bool) {}
template <class T>
void host_flush(widened<T> s, std::size_t begin, std::size_t len, float const* staging, stream_chunk<widened<T>>& chunk,
                bool streamed) {
  if (!streamed) return narrow_run(staging, s.data + begin, len);
  narrow_run(staging, chunk.data, len);
  stream_copy(s.data + begin, chunk.data, len * sizeof(T));
}

/// False for an op that declares its element work unvectorizable.
template <class Op>
constexpr bool vectorizes() {
  if constexpr (requires { Op::vectorizes; })
    return Op::vectorizes;
  else
    return true;
}

template <class Declared, class Op, class In, class Out, std::size_t... I, std::size_t... O>
std::uint64_t host_chunk_run(Op const& op, In const& inputs, Out const& outputs, std::size_t begin, std::size_t len,
                             std::index_sequence<I...>, std::index_sequence<O...>) {
  // The cursors (pointers) copied here: the loop then keeps them in
  // registers, where through references GCC reloads them at every element
  // once an output has an input's element type (and gathers and scatters).
  auto const in = make_pack(get<I>(inputs)...);
  auto out = make_pack(get<O>(outputs)...);
  if constexpr (!vectorizes<Declared>()) {  // the compiler decides
    std::uint64_t bad = 0;
    for (std::size_t k = 0; k < len; ++k) {
      if constexpr (std::is_same_v<decltype(op(begin, get<I>(in)[0]..., get<O>(out)[0]...)), bool>)
        bad += op(begin + k, get<I>(in)[k]..., get<O>(out)[k]...) ? 1u : 0u;
      else
        op(begin + k, get<I>(in)[k]..., get<O>(out)[k]...);
    }
    return bad;
  } else if constexpr (std::is_same_v<decltype(op(begin, get<I>(in)[0]..., get<O>(out)[0]...)), bool>) {
    std::uint64_t bad = 0;
    GRADCOMP_OMP(simd reduction(+ : bad))
    for (std::size_t k = 0; k < len; ++k) bad += op(begin + k, get<I>(in)[k]..., get<O>(out)[k]...) ? 1u : 0u;
    return bad;
  } else {
    GRADCOMP_OMP(simd)
    for (std::size_t k = 0; k < len; ++k) op(begin + k, get<I>(in)[k]..., get<O>(out)[k]...);
    return 0;
  }
}

template <class T>
void host_poison(T* p, std::size_t begin, std::size_t len) {
  for (std::size_t k = 0; k < len; ++k) p[begin + k] = poison_value<T>();
}
template <class T>
void host_poison(discard<T>, std::size_t, std::size_t) {}
template <class T>
void host_poison(widened<T> s, std::size_t begin, std::size_t len) {
  host_poison(s.data, begin, len);
}

template <class Op, class... I, class... O, std::size_t... Is, std::size_t... Os>
void host_transform(host_space const& space, std::size_t n, pack<I...> const& in, pack<O...> const& out, Op const& op,
                    transform_options const& options, std::index_sequence<Is...> is, std::index_sequence<Os...> os) {
  gate_state const state = read_gate(options.when);
  if (n == 0 || state == gate_state::closed) return;
  std::size_t const chunks = (n + host_chunk - 1) / host_chunk;
  [[maybe_unused]] int const threads = space.threads_for(n);
  std::uint64_t bad = 0;
  GRADCOMP_OMP(parallel num_threads(threads) reduction(+ : bad)) {
    GRADCOMP_OMP(for schedule(static) nowait)
    for (std::size_t c = 0; c < chunks; ++c) {
      std::size_t const begin = c * host_chunk, len = begin + host_chunk <= n ? host_chunk : n - begin;
      [[maybe_unused]] auto const rout = resolve_all(out);
      if (state == gate_state::poisoned) {
        (host_poison(get<Os>(rout), begin, len), ...);
        continue;
      }
      [[maybe_unused]] auto const rin = resolve_all(in);
      [[maybe_unused]] alignas(
          64) float uniforms[host_chunk];  // noise streams' chunk (each stream its own would need more; one suffices)
      [[maybe_unused]] alignas(64) float widened_in[(is_widened<I> || ...) ? sizeof...(I) : 1][host_chunk];
      [[maybe_unused]] alignas(64) float staging[(is_staged<O> || ...) ? sizeof...(O) : 1][host_chunk];
      [[maybe_unused]] pack<stream_chunk<resolved_t<O>>...> streamed_chunks;
      // (one more than the outputs: a pass may have none)
      [[maybe_unused]] bool const streamed[sizeof...(O) + 1] = {
          host_streams(space.streamed_bytes, get<Os>(rout), begin, n, get<Is>(rin)...)..., false};
      auto const cin = make_pack(host_input(get<Is>(rin), begin, len,
                                            is_widened<I> ? widened_in[(is_widened<I> || ...) ? Is : 0] : uniforms)...);
      auto const cout = make_pack(
          host_output(get<Os>(rout), begin, staging_row<Os, O>(staging), get<Os>(streamed_chunks), streamed[Os])...);
      bad += host_chunk_run<Op>(bind_op(op), cin, cout, begin, len, is, os);
      (host_flush(get<Os>(rout), begin, len, staging_row<Os, O>(staging), get<Os>(streamed_chunks), streamed[Os]), ...);
    }
    stream_fence();  // before the region's barrier: other threads may read the outputs next
  }
  if (options.count != nullptr) *options.count += bad;
}

template <class Tag, class... T>
struct cuda_transform {
  static_assert(always_false<Tag, T...>,
                "gradcomp's CUDA transform is compiled by nvcc: include <gradcomp/cuda.cuh> from a .cu file");
};

/// At most one noise stream per pass (its chunk of uniforms has one buffer).
template <class... S>
inline constexpr bool at_most_one_noise = (0 + ... + (std::is_same_v<S, rounding_noise> ? 1 : 0)) <= 1;

}  // namespace detail

/// Calls op(i, inputs[i]..., outputs[i]...) for every i in [0, n) on the
/// host (see the top of this header).
template <class Op, class... I, class... O>
void transform(host_space const& space, std::size_t n, input_streams<I...> const& in, output_streams<O...> const& out,
               Op const& op, transform_options const& options = {}) {
  static_assert(detail::at_most_one_noise<I...>, "transform: one rounding_noise stream per pass");
  detail::host_transform(space, n, in.streams, out.streams, op, options, std::index_sequence_for<I...>{},
                         std::index_sequence_for<O...>{});
}

#if GRADCOMP_HAS_CUDA
/// The same on the CUDA space, asynchronously on its stream
/// (transform.cuh; options.count is device memory).
template <class Op, class... I, class... O>
void transform(cuda_space const& space, std::size_t n, input_streams<I...> const& in, output_streams<O...> const& out,
               Op const& op, transform_options const& options = {}) {
  detail::cuda_transform<detail::cuda_kernels_tag, Op, detail::pack<I...>, detail::pack<O...>>::run(
      space, n, in.streams, out.streams, op, options);
}
#endif

}  // namespace gradcomp
