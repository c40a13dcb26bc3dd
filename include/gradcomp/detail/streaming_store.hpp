// Stores that go around the cache, for host passes that write more than the
// cache holds: an ordinary store first reads the line it writes (a
// read-for-ownership), so a pass that only writes an array moves its bytes
// twice; a streaming store writes whole lines without reading them. Worth it
// only where nothing reads the data back soon: the line is evicted too.
#pragma once

#include <gradcomp/config.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__) && !defined(__CUDA_ARCH__)
#if defined(__AVX512F__) && !defined(__CUDACC__)  // (nvcc's front end takes SSE2's header, not AVX-512's)
#include <immintrin.h>
#else
#include <emmintrin.h>
#endif
#define GRADCOMP_HOST_STREAMING_STORES 1
#else
#define GRADCOMP_HOST_STREAMING_STORES 0
#endif

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Whether stream_copy streams to `p` (16-byte aligned; elsewhere it copies).
inline bool streams_to(void const* p) {
  return GRADCOMP_HOST_STREAMING_STORES && reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

/// Whether a pass that writes n elements at `out` streams element `begin`
/// on: the elements are more than `above` bytes (host_space::streamed_bytes),
/// their memory from `begin` is 16-byte aligned, and `out` is none of the
/// arrays the pass reads (`reads`, null for none): in place, its lines are
/// cached already, and a streaming store would evict them first.
template <class T, class... R>
bool streams_output(std::size_t above, T const* out, std::size_t begin, std::size_t n, R const*... reads) {
  return n * sizeof(T) > above && ((static_cast<void const*>(reads) != out) && ...) && streams_to(out + begin);
}

/// Copies `bytes` from `from` (16-byte aligned) to `to` with streaming stores
/// where streams_to(to), else with memcpy. Their order against other
/// threads' reads holds only after stream_fence().
inline void stream_copy(void* to, void const* from, std::size_t bytes) {
  std::size_t done = 0;
#if GRADCOMP_HOST_STREAMING_STORES
  if (streams_to(to)) {
#if defined(__AVX512F__) && !defined(__CUDACC__)
    if (reinterpret_cast<std::uintptr_t>(to) % 64 == 0 && reinterpret_cast<std::uintptr_t>(from) % 64 == 0)
      for (; done + 64 <= bytes; done += 64)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(static_cast<char*>(to) + done),
                            _mm512_load_si512(static_cast<char const*>(from) + done));
#endif
    auto* out = reinterpret_cast<__m128i*>(static_cast<char*>(to) + done);
    auto const* in = reinterpret_cast<__m128i const*>(static_cast<char const*>(from) + done);
    for (; done + 16 <= bytes; done += 16) _mm_stream_si128(out++, _mm_load_si128(in++));
  }
#endif
  std::memcpy(static_cast<char*>(to) + done, static_cast<char const*>(from) + done, bytes - done);
}

/// Orders this thread's streaming stores before its later stores (call it
/// before other threads may read what stream_copy wrote).
inline void stream_fence() {
#if GRADCOMP_HOST_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace gradcomp::detail
