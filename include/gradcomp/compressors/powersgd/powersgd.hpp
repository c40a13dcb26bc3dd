// PowerSGD (Vogels et al., NeurIPS 2019): low-rank compression by one step of
// power iteration per training step, with PyTorch's powerSGD_hook semantics.
//
// Each tensor of the bucket with 2+ dimensions is viewed as a matrix
// M = tensor.view(shape[0], -1), n x m, of rank r' = min(n, m, r); it is
// compressed when (n + m) r' * min_compression_rate < n m. The others (biases,
// norms, small matrices) travel uncompressed, as means, with the first
// all-reduce. Per step, with M = g + e:
//   1. acc pass: acc = g + e into the workspace [reads g, e; writes acc];
//   2. Q (kept from the last step, or drawn from a seed shared by all ranks)
//      is orthogonalized; P = M Q                    [reads M];
//   3. all-reduce(sum) of every P and the uncompressed tensors, one message;
//   4. P is orthogonalized (Gram-Schmidt, fp32); Q = M^T P   [reads M];
//   5. all-reduce(sum) of every Q, one message; Q /= n;
//   6. output pass: M_hat = P Q^T into the gradient, e = M - M_hat
//      [reads acc; writes g, e].
// Wire bytes per step: (sum of (n + m) r' + uncompressed elements) x wire size.
// Before start_step it is a plain fp32 all-reduce (residual zero). Q is kept
// transposed (r x m), so its columns are contiguous. The host path multiplies
// with OpenMP loops; the CUDA path with cuBLAS (include
// <gradcomp/compressors/powersgd/powersgd.cuh>, link CUDA::cublas).
#pragma once

#include <gradcomp/compressor.hpp>
#include <gradcomp/compressors/powersgd/math.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/types.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif
#include <string>
#include <string_view>

namespace gradcomp {
namespace detail {

/// One tensor's part in PowerSGD: a compressed matrix or a plain tensor.
struct psgd_tensor {
  std::size_t offset, rows, cols, rank;  // rank 0: sent uncompressed
  std::size_t p_offset, q_offset;        // into the P and Q buffers (compressed)
  std::size_t plain_offset;              // into the plain part of the P payload (uncompressed)
};

/// The CUDA side (powersgd.cuh): cuBLAS products and the Gram-Schmidt kernel.
template <class Tag, class Dependent = void>
struct psgd_device {
  static_assert(always_false<Tag, Dependent>,
                "PowerSGD's CUDA path needs <gradcomp/compressors/powersgd/powersgd.cuh> in a .cu file (and "
                "CUDA::cublas)");
};
struct psgd_device_tag;

/// Gram-Schmidt on `count` vectors of `length` elements; element i of vector
/// k is at a[i * element_stride + k * vector_stride] (P: the columns of a
/// row-major rows x r matrix; Q^T: its rows). Two passes ("twice is
/// enough"): a single classical pass loses orthogonality in proportion to the
/// matrix's condition number, and P P^T is then no projector.
inline void gram_schmidt(host_space const&, float* a, std::size_t length, std::size_t count, std::size_t element_stride,
                         std::size_t vector_stride, float eps) {
  for (int pass = 0; pass < gram_schmidt_passes; ++pass) {
    for (std::size_t k = 0; k < count; ++k) {
      float* v = a + k * vector_stride;
      float norm2 = 0.0f;
      for (std::size_t i = 0; i < length; ++i) norm2 += v[i * element_stride] * v[i * element_stride];
      float const scale = gram_schmidt_scale(norm2, eps);
      for (std::size_t i = 0; i < length; ++i) v[i * element_stride] *= scale;
      for (std::size_t j = k + 1; j < count; ++j) {
        float* w = a + j * vector_stride;
        float dot = 0.0f;
        for (std::size_t i = 0; i < length; ++i) dot += v[i * element_stride] * w[i * element_stride];
        for (std::size_t i = 0; i < length; ++i) w[i * element_stride] -= dot * v[i * element_stride];
      }
    }
  }
}

// The two products are skinny (r is small): they read M once and are bound
// by memory, not arithmetic. On the host they are OpenMP loops sharing the
// threads of the other passes (a BLAS library's own thread pool fights them
// for the cores, and OpenBLAS's GEMM is slow at r = 1: measured); on the GPU,
// cuBLAS.

/// P = M Q, with Q stored transposed (q_t: rank x cols): one dot product of
/// a row of M with each row of q_t.
inline void multiply_mq(host_space const& space, float const* m, float const* q_t, float* p, std::size_t rows,
                        std::size_t cols, std::size_t rank) {
  [[maybe_unused]] int const threads = space.threads_for(rows * cols);
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads))
  for (std::size_t i = 0; i < rows; ++i) {
    float const* row = m + i * cols;
    for (std::size_t k = 0; k < rank; ++k) {
      float const* q = q_t + k * cols;
      float dot = 0.0f;
      GRADCOMP_OMP(simd reduction(+ : dot))
      for (std::size_t c = 0; c < cols; ++c) dot += row[c] * q[c];
      p[i * rank + k] = dot;
    }
  }
}

/// Q^T = P^T M (q_t: rank x cols): each thread owns a slice of the columns
/// and adds p[i, k] * M[i, slice] row by row.
inline void multiply_mtp(host_space const& space, float const* m, float const* p, float* q_t, std::size_t rows,
                         std::size_t cols, std::size_t rank) {
  [[maybe_unused]] int const threads = space.threads_for(rows * cols);
  GRADCOMP_OMP(parallel num_threads(threads)) {
#if GRADCOMP_HAS_OPENMP
    std::size_t const t = static_cast<std::size_t>(omp_get_thread_num());
    std::size_t const team = static_cast<std::size_t>(omp_get_num_threads());
#else
    std::size_t const t = 0, team = 1;
#endif
    std::size_t const begin = cols * t / team, end = cols * (t + 1) / team;
    for (std::size_t k = 0; k < rank; ++k)
      for (std::size_t c = begin; c < end; ++c) q_t[k * cols + c] = 0.0f;
    for (std::size_t i = 0; i < rows; ++i) {
      float const* row = m + i * cols;
      for (std::size_t k = 0; k < rank; ++k) {
        float const pk = p[i * rank + k];
        float* q = q_t + k * cols;
        for (std::size_t c = begin; c < end; ++c) q[c] += pk * row[c];
      }
    }
  }
}

#if GRADCOMP_HAS_CUDA
// Templates, so the device struct is looked up where they are used (after
// powersgd.cuh), not here.
template <class Space = cuda_space>
void gram_schmidt(cuda_space const& s, float* a, std::size_t length, std::size_t count, std::size_t element_stride,
                  std::size_t vector_stride, float eps) {
  psgd_device<psgd_device_tag, Space>::gram_schmidt(s, a, length, count, element_stride, vector_stride, eps);
}
template <class Space = cuda_space>
void multiply_mq(cuda_space const& s, float const* m, float const* q_t, float* p, std::size_t rows, std::size_t cols,
                 std::size_t rank) {
  psgd_device<psgd_device_tag, Space>::multiply_mq(s, m, q_t, p, rows, cols, rank);
}
template <class Space = cuda_space>
void multiply_mtp(cuda_space const& s, float const* m, float const* p, float* q_t, std::size_t rows, std::size_t cols,
                  std::size_t rank) {
  psgd_device<psgd_device_tag, Space>::multiply_mtp(s, m, p, q_t, rows, cols, rank);
}
#endif

}  // namespace detail

/// PowerSGD (see the top of this header).
///
/// \tparam Wire wire type of P, Q and the uncompressed tensors: float or bfloat16.
template <class Wire = float>
struct powersgd {
  static_assert(std::is_same_v<Wire, float> || std::is_same_v<Wire, bfloat16>,
                "powersgd sends P and Q as float or bfloat16");

  /// Name for messages and reports.
  static constexpr std::string_view name = "powersgd";
  /// Every rank multiplies by the same Q (shared seed, then the summed
  /// one), so the P's and Q's add element by element.
  static constexpr bool summable_payload = true;

  std::size_t rank = 1;                    ///< r (PyTorch: matrix_approximation_rank).
  double min_compression_rate = 2.0;       ///< Compress only if (n + m) r' * rate < n m.
  bool warm_start = true;                  ///< Reuse last step's Q.
  std::uint64_t start_step = 0;            ///< Plain fp32 all-reduce before this step (PyTorch: 1000).
  float orthogonalization_epsilon = 0.0f;  ///< Added to column norms in Gram-Schmidt.
  std::uint64_t seed = 0;                  ///< Shared seed for the initial Q.

  /// Calls f(part) for each tensor of `layout`, in order: compressed at
  /// which rank (0: plain), and where its pieces go. Allocates nothing, so
  /// steps can call it.
  template <class F>
  void for_each_part(bucket_layout const& layout, F&& f) const {
    std::size_t p = 0, q = 0, plain = 0;
    for (auto const& t : layout.tensors()) {
      detail::psgd_tensor x{t.offset, t.rows(), t.cols(), 0, 0, 0, 0};
      std::size_t const r = std::min({x.rows, x.cols, rank});
      bool const compress =
          !t.is_vector() && r > 0 &&
          static_cast<double>((x.rows + x.cols) * r) * min_compression_rate < static_cast<double>(x.rows * x.cols);
      if (compress) {
        x.rank = r;
        x.p_offset = p;
        x.q_offset = q;
        p += x.rows * r;
        q += x.cols * r;
      } else {
        x.plain_offset = plain;
        plain += t.numel();
      }
      f(x);
    }
  }

  /// Element counts of the P, Q and plain parts.
  struct sizes {
    std::size_t p = 0, q = 0, plain = 0;
  };
  sizes size_of(bucket_layout const& layout) const {
    sizes s;
    for_each_part(layout, [&](detail::psgd_tensor const& x) {
      s.p += x.rows * x.rank;
      s.q += x.cols * x.rank;
      if (x.rank == 0) s.plain += x.rows * x.cols;
    });
    return s;
  }

  /// Throws for a rank of 0 or a negative compression rate.
  void validate(bucket_layout const& layout, int /*ranks*/) const {
    GRADCOMP_EXPECTS(rank >= 1, "powersgd: the rank must be at least 1");
    GRADCOMP_EXPECTS(min_compression_rate >= 0.0, "powersgd: min_compression_rate must be >= 0");
    for_each_part(layout, [](detail::psgd_tensor const& x) {
      GRADCOMP_EXPECTS(x.rows < (std::size_t{1} << 31) && x.cols < (std::size_t{1} << 31),
                       "powersgd: a matrix side beyond 2^31 exceeds BLAS's int dimensions");
    });
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), rank);
    h = detail::hash_combine(h, std::bit_cast<std::uint64_t>(min_compression_rate));
    h = detail::hash_combine(h, warm_start);
    h = detail::hash_combine(h, start_step);
    h = detail::hash_combine(h, std::bit_cast<std::uint32_t>(orthogonalization_epsilon));
    h = detail::hash_combine(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Wire>));
  }

  /// Workspace pieces. q persists from step to step (the warm start).
  template <class Memory>
  struct workspace {
    span<std::uint64_t, Memory> counters;
    span<float, Memory> acc;    ///< g + e, the matrices M.
    span<float, Memory> p;      ///< Every P.
    span<float, Memory> q_t;    ///< Every Q, transposed (rank x cols), kept across steps.
    span<Wire, Memory> p_wire;  ///< Every P, then the plain tensors: the first message.
    span<Wire, Memory> q_wire;  ///< Every Q: the second message.
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    sizes const s = size_of(layout);
    workspace<Memory> ws;
    ws.counters = w.template take<std::uint64_t>(2);
    ws.acc = w.template take<float>(layout.size());
    ws.p = w.template take<float>(s.p);
    ws.q_t = w.template take<float>(s.q);
    ws.p_wire = w.template take<Wire>(s.p + s.plain);
    ws.q_wire = w.template take<Wire>(s.q);
    std::size_t const largest =
        std::max({(s.p + s.plain) * sizeof(Wire), s.q * sizeof(Wire), layout.size() * sizeof(float)});
    ws.scratch = w.template take<std::byte>(Aggregator::scratch_bytes(largest, ranks));
    return ws;
  }

  /// Bytes of a compressed step: the P message and the Q message.
  template <class Aggregator>
  std::size_t wire_bytes(bucket_layout const& layout, int ranks) const {
    sizes const s = size_of(layout);
    return detail::aggregated_wire_bytes<Aggregator>((s.p + s.plain) * sizeof(Wire), ranks) +
           detail::aggregated_wire_bytes<Aggregator>(s.q * sizeof(Wire), ranks);
  }

  /// One step: gradient <- P Q^T per compressed matrix, the mean elsewhere.
  template <class Context>
  void step(Context& ctx, span<float, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto carver = ctx.carver();
    auto ws = carve<typename Context::aggregator>(carver, ctx.layout(), ctx.ranks());
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    float const n = static_cast<float>(ctx.ranks());
    std::size_t const d = gradient.size();

    space.fill_zero(ws.counters.data(), ws.counters.size_bytes());
    parallel_count(space, d, detail::accumulate_into<float, EF>{gradient.data(), ef, ws.acc.data()},
                   ws.counters.data());
    ctx.agree_all_finite(ws.counters.data(), "NaN or infinite");

    if (ctx.step() < start_step) {  // warm-up: a plain fp32 all-reduce, nothing kept
      ctx.aggregate(ws.acc, ws.scratch);
      parallel_for(space, d, detail::psgd_warm_up<EF>{ws.acc.data(), gradient.data(), ef, n});
      return;
    }
    if (ctx.step() == start_step || !warm_start)  // the same Q on every rank
      parallel_for(space, ws.q_t.size(),
                   detail::psgd_normal_fill{random_stream(seed, static_cast<std::uint32_t>(warm_start ? 0 : ctx.step()),
                                                          random_stream::shared),
                                            ws.q_t.data()});

    // P = M Q per matrix; the plain tensors join the first message.
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank == 0) {
        parallel_for(space, t.rows * t.cols,
                     detail::psgd_pack_plain<Wire>{ws.acc.data() + t.offset,
                                                   ws.p_wire.data() + ws.p.size() + t.plain_offset, n});
        return;
      }
      float* q_t = ws.q_t.data() + t.q_offset;  // Q's columns are q_t's rows
      detail::gram_schmidt(space, q_t, t.cols, t.rank, 1, t.cols, orthogonalization_epsilon);
      detail::multiply_mq(space, ws.acc.data() + t.offset, q_t, ws.p.data() + t.p_offset, t.rows, t.cols, t.rank);
    });
    parallel_for(space, ws.p.size(), detail::psgd_to_wire<Wire>{ws.p.data(), ws.p_wire.data()});
    ctx.aggregate(ws.p_wire, ws.scratch);
    parallel_for(space, ws.p.size(), detail::psgd_from_wire<Wire>{ws.p_wire.data(), ws.p.data(), 1.0f});

    // Orthogonalize the summed P; Q = M^T P.
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank == 0) return;
      float* p = ws.p.data() + t.p_offset;  // P's columns: stride rank
      detail::gram_schmidt(space, p, t.rows, t.rank, t.rank, 1, orthogonalization_epsilon);
      detail::multiply_mtp(space, ws.acc.data() + t.offset, p, ws.q_t.data() + t.q_offset, t.rows, t.cols, t.rank);
    });
    parallel_for(space, ws.q_t.size(), detail::psgd_to_wire<Wire>{ws.q_t.data(), ws.q_wire.data()});
    ctx.aggregate(ws.q_wire, ws.scratch);
    parallel_for(space, ws.q_t.size(), detail::psgd_from_wire<Wire>{ws.q_wire.data(), ws.q_t.data(), 1.0f / n});

    // Output and residual, matrix by matrix; the plain tensors' means.
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank == 0) {
        parallel_for(space, t.rows * t.cols,
                     detail::psgd_unpack_plain<Wire, EF>{ws.acc.data(), ws.p_wire.data() + ws.p.size() + t.plain_offset,
                                                         gradient.data(), ef, t.offset, n});
        return;
      }
      float const* q_t = ws.q_t.data() + t.q_offset;
      parallel_for_chunks(space, t.rows * t.cols, t.cols,
                          detail::psgd_output<EF>{ws.acc.data(), gradient.data(), ef, ws.p.data() + t.p_offset, q_t,
                                                  t.offset, t.cols, t.rank});
    });
  }
};

static_assert(compressor<powersgd<>>);

}  // namespace gradcomp
