// Every compressor in one small configuration, for the tests that check a
// property of all of them (property_test, checkpoint_test).
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <cstddef>
#include <string>
#include <type_traits>

namespace gradcomp::testing {

/// Why compressor_spec::parse refuses `text`, or "(accepted)".
inline std::string error_of(std::string const& text) {
  try {
    (void)compressor_spec::parse(text);
  } catch (invalid_argument const& e) {
    return e.what();
  }
  return "(accepted)";
}

/// Shapes of odd sizes: a matrix (PowerSGD compresses it), a bias, a 3-D tensor.
inline bucket_layout odd_layout(std::size_t scale) {
  bucket_layout layout;
  layout.add({17 * scale, 23}).add({5 * scale + 2}).add({3, 3, 3});
  return layout;
}

/// The test configuration of registered compressor C: make() is small
/// enough for 7 ranks and sanitizers; unit is the roundoff that bounds one
/// step's bookkeeping error (what a lane's sum or a decode rounds away; zero
/// where integers sum exactly). Every registry entry needs one.
template <class C>
struct catalogue {
  static_assert(detail::always_false<C>, "a registered compressor needs its test configuration here");
};
template <class W>
struct catalogue<cast<W>> {
  static cast<W> make() { return {}; }
  static constexpr double unit = std::is_same_v<W, float>      ? 0x1.0p-23
                                 : std::is_same_v<W, bfloat16> ? 0x1.0p-8
                                                               : 0x1.0p-10;
};
template <>
struct catalogue<topkc<>> {
  static topkc<> make() { return {.chunk_size = 16, .fraction = 0.2}; }
  static constexpr double unit = 0x1.0p-8;
};
template <>
struct catalogue<topk<bfloat16>> {
  static topk<bfloat16> make() { return {.fraction = 0.1}; }
  static constexpr double unit = 0x1.0p-22;
};
template <>
struct catalogue<thc<>> {
  static thc<> make() { return {.block = 64}; }
  static constexpr double unit = 0x1.0p-16;
};
template <>
struct catalogue<qsgd<>> {
  static qsgd<std::int32_t> make() { return {.bits = 8}; }
  static constexpr double unit = 0x1.0p-20;
};
template <>
struct catalogue<qsgd_multiscale> {
  static qsgd_multiscale make() { return {}; }
  static constexpr double unit = 0x1.0p-20;
};
template <>
struct catalogue<global_randk<>> {
  static global_randk<> make() { return {.k = 40}; }
  static constexpr double unit = 0x1.0p-20;
};
template <>
struct catalogue<intsgd<>> {
  static intsgd<> make() { return {}; }
  static constexpr double unit = 0x1.0p-20;
};
template <>
struct catalogue<powersgd<>> {
  static powersgd<> make() { return {.matrix_rank = 2, .min_compression_rate = 1}; }
  static constexpr double unit = 0x1.0p-18;
};

/// Calls f(compressor, unit) for every registered compressor, in its test
/// configuration (catalogue).
template <class F>
void for_each_compressor(F&& f) {
  for_each_registered([&]<class C>(std::type_identity<C>) { f(catalogue<C>::make(), catalogue<C>::unit); });
}

/// An allreducer on the host space.
template <class C, class EF, class Collective>
using host_reducer = allreducer<C, EF, Collective, default_aggregator_t<C>, host_space>;

}  // namespace gradcomp::testing
