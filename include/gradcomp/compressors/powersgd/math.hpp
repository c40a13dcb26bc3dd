// PowerSGD's per-element math, shared by the host loops and the CUDA kernels.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/detail/mean_codec.hpp>
#include <gradcomp/random.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace gradcomp::detail {

/// Gram-Schmidt passes over each set of vectors (see gram_schmidt).
inline constexpr int gram_schmidt_passes = 2;

/// The factor Gram-Schmidt scales a column of squared norm `norm2` by:
/// 1 / (||col|| + eps), as PyTorch's hook does; a zero column stays zero
/// (factor 0) instead of becoming 0 / 0 = NaN when eps is 0.
GRADCOMP_HOST_DEVICE float gram_schmidt_scale(float norm2, float eps) {
  float const norm = sqrtf(norm2);
  return norm > 0.0f ? 1.0f / (norm + eps) : 0.0f;
}

/// A standard normal value for element i of the shared stream (Box-Muller).
struct psgd_normal_fill {
  random_stream stream;
  float* out;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    uint4x32 const w = stream(i);
    float const u1 = (static_cast<float>(w.v[0] >> 8) + 0.5f) * 0x1.0p-24f;  // in (0, 1)
    float const u2 = static_cast<float>(w.v[1] >> 8) * 0x1.0p-24f;
    out[i] = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
  }
};

/// Float values into the wire type (P and Q travel unscaled: they are
/// orthogonalized or divided after the sum).
template <class Wire>
struct psgd_to_wire {
  float const* from;
  Wire* to;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { to[i] = static_cast<Wire>(from[i]); }
};

/// Summed wire values back to float, times `scale` (1, or 1/n for Q).
template <class Wire>
struct psgd_from_wire {
  Wire const* from;
  float* to;
  float scale;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { to[i] = static_cast<float>(from[i]) * scale; }
};

/// An uncompressed tensor's values ride with P as means (mean_codec).
template <class Wire>
struct psgd_pack_plain {
  float const* acc;  // the tensor's acc
  Wire* wire;        // its slot in the P payload
  float ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const { wire[i] = mean_codec<Wire>::encode(acc[i], ranks); }
};

template <class Wire, class EF>
struct psgd_unpack_plain {
  float const* acc;
  Wire const* wire;
  float* gradient;
  EF ef;
  std::size_t offset;  // of the tensor in the bucket
  float ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    float const a = acc[offset + i];
    gradient[offset + i] = mean_codec<Wire>::mean(wire[i], ranks);
    ef.update(offset + i, a - mean_codec<Wire>::sent(mean_codec<Wire>::encode(a, ranks), ranks),
              mean_codec<float>::fits(a));
  }
};

/// Before start_step: the mean of the summed acc; nothing is kept (PyTorch's
/// hook runs a plain all-reduce then).
template <class EF>
struct psgd_warm_up {
  float const* summed;
  float* gradient;
  EF ef;
  float ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    gradient[i] = mean_codec<float>::mean(summed[i], ranks);
    ef.update(i, 0.0f, mean_codec<float>::fits(summed[i]));
  }
};

/// Output and residual of one matrix in one pass: M_hat = P Q^T into the
/// gradient, e = acc - M_hat. Per element on the device, per row on the host.
template <class EF>
struct psgd_output {
  float const* acc;  // bucket
  float* gradient;   // bucket
  EF ef;
  float const* p;      // rows x rank
  float const* q_t;    // rank x cols
  std::size_t offset;  // of the matrix in the bucket
  std::size_t cols;
  std::size_t rank;

  GRADCOMP_HOST_DEVICE void store(std::size_t i, float m_hat) const {
    float const a = acc[offset + i];
    gradient[offset + i] = m_hat;
    ef.update(offset + i, a - m_hat, mean_codec<float>::fits(a));
  }
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i) const {
    std::size_t const row = i / cols, col = i % cols;
    float m_hat = 0.0f;
    for (std::size_t k = 0; k < rank; ++k) m_hat += p[row * rank + k] * q_t[k * cols + col];
    store(i, m_hat);
  }
  // The same sums, k by k over the whole row, so the inner loops vectorize.
  void chunk(std::size_t row, std::size_t begin, std::size_t end) const {
    // Distinct buffers (__restrict), so the row loops vectorize.
    float* __restrict out = gradient + offset + begin;
    float const* __restrict a = acc + offset + begin;
    std::size_t const n = end - begin;
    for (std::size_t c = 0; c < n; ++c) out[c] = 0.0f;
    for (std::size_t k = 0; k < rank; ++k) {
      float const pk = p[row * rank + k];
      float const* __restrict qk = q_t + k * cols;
      for (std::size_t c = 0; c < n; ++c) out[c] += pk * qk[c];
    }
    EF const e = ef;  // a local copy: its pointers stay in registers
    std::size_t const first = offset + begin;
    for (std::size_t c = 0; c < n; ++c) e.update(first + c, a[c] - out[c], mean_codec<float>::fits(a[c]));
  }
};

}  // namespace gradcomp::detail
