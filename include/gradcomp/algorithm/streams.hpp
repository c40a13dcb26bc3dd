// Streams: what an element pass reads and writes, element by element.
//
// transform() and segmented_reduce() take their inputs and outputs as
// streams rather than as a functor that dereferences pointers itself, so they
// own the memory accesses: the CUDA kernels load and store each stream with
// 16-byte vectors where its alignment allows, the host loops hand the
// compiler plain arrays it vectorizes. A stream is
//   - a pointer (T const* to read, T* to write);
//   - zeros<T>: reads as zero, touches no memory;
//   - discard<T>: writes go nowhere;
//   - selected<T>: one of two buffers, picked by an index word in memory
//     (a double buffer whose current side the device flips: error feedback);
//   - rounding_noise: 16-bit uniforms in [0, 1), eight per Philox call of a
//     random_stream, the same numbers on host and device;
//   - widened<T>: 16-bit floats (bfloat16, half) a pass reads and writes as
//     float: 16-bit gradients, with no fp32 copy.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/random.hpp>
#include <gradcomp/span.hpp>
#include <gradcomp/types.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Reads as zero; writes nothing. The error-feedback residual of
/// error_feedback::none.
template <class T>
struct zeros {
  using value_type = T;  ///< Element type.
};

/// Takes writes and drops them.
template <class T>
struct discard {
  using value_type = T;  ///< Element type.
};

/// One of two buffers, chosen when a pass starts by the word at `index`:
/// buffers[*index ^ flip], from element `offset` on. The word lives where the
/// buffers do, so a device pass picks the side without the host looking.
template <class T>
struct selected {
  using value_type = std::remove_const_t<T>;  ///< Element type.
  T* buffers[2];                              ///< The two sides.
  std::uint32_t const* index;                 ///< 0 or 1.
  std::uint32_t flip;                         ///< 1 picks the other side.
  std::size_t offset = 0;                     ///< First element of the stream.
  /// The buffer this pass uses.
  GRADCOMP_HOST_DEVICE T* resolve() const { return (((*index ^ flip) & 1u) != 0 ? buffers[1] : buffers[0]) + offset; }
};

/// Rounding uniforms: element i reads uniform16(stream(i / 8), i % 8), 16-bit
/// uniforms on a 2^-16 grid, eight from each Philox call.
struct rounding_noise {
  using value_type = float;  ///< Uniform in [0, 1).
  random_stream stream;      ///< Whose numbers.
  /// The uniform of element i (one Philox call; loops share calls).
  GRADCOMP_HOST_DEVICE float at(std::size_t i) const { return uniform16(stream(i / 8), static_cast<unsigned>(i % 8)); }
};

/// 16-bit floats in memory that a pass sees as float: loads widen exactly,
/// stores round to nearest even (and overflow to infinity as the type does).
/// A 16-bit gradient bucket is read and written through it.
template <class T>
struct widened {
  static_assert(std::is_same_v<T, bfloat16> || std::is_same_v<T, half>, "widened<T>: T is bfloat16 or half");
  using value_type = float;  ///< What the pass sees.
  T* data;                   ///< The 16-bit elements.
};

namespace detail {

/// A gradient's elements from `offset` on, as a stream of floats: the
/// pointer itself for float, widened<G> for 16-bit storage.
template <gradient_element G, class Memory>
GRADCOMP_HOST_DEVICE auto gradient_stream(span<G, Memory> g, std::size_t offset = 0) {
  if constexpr (std::is_same_v<G, float>)
    return g.data() + offset;
  else
    return widened<G>{g.data() + offset};
}
template <gradient_element G>
GRADCOMP_HOST_DEVICE auto gradient_stream(G* g, std::size_t offset = 0) {
  if constexpr (std::is_same_v<G, float>)
    return g + offset;
  else
    return widened<G>{g + offset};
}

/// A gradient element as float, and a float stored as one (for the passes
/// that gather or scatter at computed indices).
template <gradient_element G>
GRADCOMP_HOST_DEVICE float load_gradient(G const* g, std::size_t i) {
  return static_cast<float>(g[i]);
}
template <gradient_element G>
GRADCOMP_HOST_DEVICE void store_gradient(G* g, std::size_t i, float value) {
  g[i] = G(value);
}

/// Element type of a stream.
template <class S>
struct stream_value {
  using type = typename S::value_type;
};
template <class T>
struct stream_value<T*> {
  using type = std::remove_const_t<T>;
};
template <class S>
using stream_value_t = typename stream_value<S>::type;

/// What a pass touches once it starts: pointers for memory streams, the
/// stream itself otherwise.
template <class S>
GRADCOMP_HOST_DEVICE S resolve(S const& s) {
  return s;
}
template <class T>
GRADCOMP_HOST_DEVICE T* resolve(selected<T> const& s) {
  return s.resolve();
}
template <class S>
using resolved_t = decltype(resolve(std::declval<S const&>()));

/// Bytes of memory a stream moves per element (0: none).
template <class S>
inline constexpr int stream_bytes = 0;
template <class T>
inline constexpr int stream_bytes<T*> = sizeof(T);
template <class T>
inline constexpr int stream_bytes<selected<T>> = sizeof(T);
template <class T>
inline constexpr int stream_bytes<widened<T>> = sizeof(T);

/// The fewest items per thread a device pass should give a stream: enough
/// for an 8-byte vector of memory, a whole Philox call of noise.
template <class S>
inline constexpr int stream_min_items = 1;
template <class T>
inline constexpr int stream_min_items<T*> = sizeof(T) >= 8 ? 1 : 8 / static_cast<int>(sizeof(T));
template <class T>
inline constexpr int stream_min_items<selected<T>> = stream_min_items<T*>;
template <class T>
inline constexpr int stream_min_items<widened<T>> = stream_min_items<T*>;
template <>
inline constexpr int stream_min_items<rounding_noise> = 8;

/// A stream from what callers pass: spans become their pointers.
template <class S>
GRADCOMP_HOST_DEVICE S as_stream(S s) {
  return s;
}
template <class T, class Memory>
GRADCOMP_HOST_DEVICE T* as_stream(span<T, Memory> s) {
  return s.data();
}

/// A minimal heterogeneous list that host and device code can both use
/// (std::tuple's members are host-only under nvcc).
template <class... S>
struct pack;
template <>
struct pack<> {};
template <class Head, class... Tail>
struct pack<Head, Tail...> {
  Head head;
  pack<Tail...> tail;
};

/// Number of elements of a pack.
template <class P>
inline constexpr std::size_t pack_size = 0;
template <class... S>
inline constexpr std::size_t pack_size<pack<S...>> = sizeof...(S);

template <std::size_t I, class Head, class... Tail>
GRADCOMP_HOST_DEVICE auto& get(pack<Head, Tail...>& p) {
  if constexpr (I == 0)
    return p.head;
  else
    return get<I - 1>(p.tail);
}
template <std::size_t I, class Head, class... Tail>
GRADCOMP_HOST_DEVICE auto const& get(pack<Head, Tail...> const& p) {
  if constexpr (I == 0)
    return p.head;
  else
    return get<I - 1>(p.tail);
}

GRADCOMP_HOST_DEVICE pack<> make_pack() { return {}; }
template <class Head, class... Tail>
GRADCOMP_HOST_DEVICE pack<Head, Tail...> make_pack(Head head, Tail... tail) {
  return {head, make_pack(tail...)};
}

/// The pack of resolved streams. (By value: a kernel that took the address
/// of its parameters would copy them to local memory first.)
template <class... S, std::size_t... I>
GRADCOMP_HOST_DEVICE pack<resolved_t<S>...> resolve_all([[maybe_unused]] pack<S...> p, std::index_sequence<I...>) {
  return make_pack(resolve(get<I>(p))...);
}
template <class... S>
GRADCOMP_HOST_DEVICE pack<resolved_t<S>...> resolve_all(pack<S...> p) {
  return resolve_all(p, std::index_sequence_for<S...>{});
}

/// An element functor after binding: op.bind() when it has one (it reads the
/// step's scalars from memory once per thread), else the functor itself.
template <class Op>
GRADCOMP_HOST_DEVICE auto bind_op(Op op) {
  if constexpr (requires { op.bind(); })
    return op.bind();
  else
    return op;
}

}  // namespace detail

/// The streams a pass reads.
template <class... S>
struct input_streams {
  detail::pack<S...> streams;  ///< In call order.
};
/// The streams a pass writes.
template <class... S>
struct output_streams {
  detail::pack<S...> streams;  ///< In call order.
};

/// Streams to read: pointers, spans or the stream types above.
template <class... S>
auto inputs(S... s) -> input_streams<decltype(detail::as_stream(s))...> {
  return {detail::make_pack(detail::as_stream(s)...)};
}
/// Streams to write: pointers, spans or the stream types above.
template <class... S>
auto outputs(S... s) -> output_streams<decltype(detail::as_stream(s))...> {
  return {detail::make_pack(detail::as_stream(s)...)};
}

/// Lets a word in memory switch a pass off without the host looking: while
/// *flag is zero (or there is no flag) the pass runs; otherwise it is
/// skipped, or, with `poison`, writes NaN to every output instead. The
/// pipeline gates a step's commit passes on the ranks' verdict this way.
struct gate {
  std::uint64_t const* flag = nullptr;  ///< The word to test; null: always open.
  bool poison = false;                  ///< Closed: write NaN rather than nothing.
};

namespace detail {
enum class gate_state { open, closed, poisoned };
GRADCOMP_HOST_DEVICE gate_state read_gate(gate g) {
  if (g.flag == nullptr || *g.flag == 0) return gate_state::open;
  return g.poison ? gate_state::poisoned : gate_state::closed;
}
/// What a poisoned pass writes.
template <class T>
GRADCOMP_HOST_DEVICE T poison_value() {
  if constexpr (std::is_integral_v<T>)
    return T(0);
  else
    return T(__builtin_nanf(""));
}
}  // namespace detail

}  // namespace gradcomp
