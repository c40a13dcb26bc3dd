// PowerSGD's per-element math, shared by the host loops and the CUDA kernels.
#pragma once

#include <gradcomp/algorithm/streams.hpp>
#include <gradcomp/compressors/detail/mean_codec.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/random.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Gram-Schmidt passes over each set of vectors (see gram_schmidt).
inline constexpr int gram_schmidt_passes = 2;

/// The factor Gram-Schmidt scales a column of squared norm `norm2` by:
/// 1 / (||col|| + eps), as PyTorch's hook does; a zero column stays zero
/// (factor 0) instead of becoming 0 / 0 = NaN when eps is 0. Norms, factors
/// and projections are doubles: squares of gradients near 1e-25 or 1e30 are
/// out of float's range, and the factor of a column of denormals out of it.
GRADCOMP_HOST_DEVICE double gram_schmidt_scale(double norm2, float eps) {
  double const norm = sqrt(norm2);
  return norm > 0.0 ? 1.0 / (norm + static_cast<double>(eps)) : 0.0;
}

/// v x scale, computed in double.
GRADCOMP_HOST_DEVICE float scaled(float v, double scale) { return static_cast<float>(static_cast<double>(v) * scale); }
/// w - projection x v, computed in double.
GRADCOMP_HOST_DEVICE float projected(float w, double projection, float v) {
  return static_cast<float>(static_cast<double>(w) - projection * static_cast<double>(v));
}

/// acc = g + e, bad when NaN or beyond `limit`, where the products P = M Q
/// and Q = M^T P could overflow (the acc pass of a compressed step).
struct psgd_accumulate {
  float limit;
  GRADCOMP_HOST_DEVICE bool operator()(std::size_t, float g, float e, float& acc) const {
    acc = g + e;
    return !within(acc, limit);
  }
};

/// A standard normal value for element i of the shared stream (Box-Muller).
struct psgd_normal_fill {
  static constexpr bool vectorizes = false;  // (it calls log and cos)
  random_stream stream;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i, float& out) const {
    uint4x32 const w = stream(i);
    float const u1 = (static_cast<float>(w.v[0] >> 8) + 0.5f) * 0x1.0p-24f;  // in (0, 1)
    float const u2 = static_cast<float>(w.v[1] >> 8) * 0x1.0p-24f;
    out = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
  }
};

/// Copies values (Q into the step's work copy, and back at the commit).
struct psgd_copy {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float from, float& to) const { to = from; }
};

/// Float values into the wire type (P and Q travel unscaled: they are
/// orthogonalized or divided after the sum).
template <class Wire>
struct psgd_to_wire {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float from, Wire& to) const { to = static_cast<Wire>(from); }
};

/// Summed wire values back to float, times `scale` (1, or 1/n for Q).
template <class Wire>
struct psgd_from_wire {
  float scale;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, Wire from, float& to) const {
    to = static_cast<float>(from) * scale;
  }
};

/// An uncompressed tensor's values ride with P as means (mean_codec).
template <class Wire>
struct psgd_pack_plain {
  float inverse;  // 1/n
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float acc, Wire& wire) const {
    wire = mean_codec<Wire>::encode(acc, inverse);
  }
};

/// An uncompressed tensor's output: the mean, and the rounding kept.
template <class Wire>
struct psgd_unpack_plain {
  float inverse, ranks;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float acc, Wire sum, float& g, float& e_next) const {
    g = mean_codec<Wire>::mean(sum);
    e_next = mean_codec<Wire>::residual(acc, mean_codec<Wire>::encode(acc, inverse), ranks);
  }
};

/// Output and residual of one matrix in one pass: M_hat = P Q^T into the
/// gradient, e = acc - M_hat, gated on the step's verdict. The CUDA space
/// runs it per element (psgd_output_element, a transform); the host per row,
/// in tiles of columns summed k by k, so the inner loops vectorize (and a
/// 16-bit gradient is written once, rounded from the same float sums).
template <class EF, class G = float>
struct psgd_output {
  gate when;
  float const* acc;  // bucket
  G* gradient;       // bucket
  EF ef;
  float const* p;      // rows x rank
  float const* q_t;    // rank x cols
  std::size_t offset;  // of the matrix in the bucket
  std::size_t cols;
  std::size_t rank;

  void row(std::size_t r) const {
    gate_state const state = read_gate(when);
    if (state == gate_state::closed) return;
    // Distinct buffers (__restrict), so the row loops vectorize.
    G* __restrict out = gradient + offset + r * cols;
    float const* __restrict a = acc + offset + r * cols;
    if (state == gate_state::poisoned) {
      for (std::size_t c = 0; c < cols; ++c) out[c] = G(poison_value<float>());
      return;
    }
    auto const e = ef.bind();  // a local copy: its pointers stay in registers
    std::size_t const first = offset + r * cols;
    constexpr std::size_t tile = 512;
    alignas(64) float m_hat[tile];
    for (std::size_t c0 = 0; c0 < cols; c0 += tile) {
      std::size_t const width = cols - c0 < tile ? cols - c0 : tile;
      if (rank == 4)  // (the common rank: its sums in registers, not in m_hat)
        sum_rank<4>(m_hat, p + r * rank, q_t + c0, cols, width);
      else
        sum_rank<0>(m_hat, p + r * rank, q_t + c0, cols, width, rank);
      for (std::size_t c = 0; c < width; ++c) {
        out[c0 + c] = G(m_hat[c]);
        e.update(first + c0 + c, a[c0 + c] - m_hat[c]);
      }
    }
  }

  /// m_hat[c] = sum over k of p_k x q_t[k x stride + c], k in order from a
  /// zero; Rank 0 for a rank known at run time only.
  template <std::size_t Rank>
  static void sum_rank(float* __restrict m_hat, float const* p_row, float const* __restrict q, std::size_t stride,
                       std::size_t width, std::size_t rank = Rank) {
    if constexpr (Rank > 0) {
      float pk[Rank];
      for (std::size_t k = 0; k < Rank; ++k) pk[k] = p_row[k];
      for (std::size_t c = 0; c < width; ++c) {
        float s = 0.0f;
        for (std::size_t k = 0; k < Rank; ++k) s += pk[k] * q[k * stride + c];
        m_hat[c] = s;
      }
    } else {
      for (std::size_t c = 0; c < width; ++c) m_hat[c] = 0.0f;
      for (std::size_t k = 0; k < rank; ++k) {
        float const pk = p_row[k];
        for (std::size_t c = 0; c < width; ++c) m_hat[c] += pk * q[k * stride + c];
      }
    }
  }
};

/// One element of psgd_output: the same sums in the same order.
struct psgd_output_element {
  static constexpr bool vectorizes = false;  // (it gathers or scatters at indices it computes)
  float const* p;
  float const* q_t;
  std::size_t cols, rank;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t i, float acc, float& g, float& e_next) const {
    std::size_t const row = i / cols, col = i % cols;
    float m_hat = 0.0f;
    for (std::size_t k = 0; k < rank; ++k) m_hat += p[row * rank + k] * q_t[k * cols + col];
    g = m_hat;
    e_next = acc - m_hat;
  }
};

}  // namespace gradcomp::detail
