// PowerSGD's host products and orthogonalization: OpenMP loops.
//
// The two products are skinny (r is small): they read M once and are bound
// by memory, not arithmetic, so the first is taken in the pass that writes
// M = g + e (accumulate_multiply). On the host they are OpenMP loops sharing the
// threads of the other passes (a BLAS library's own thread pool fights them
// for the cores, and OpenBLAS's GEMM is slow at r = 1: measured); on the GPU,
// cuBLAS (powersgd.cuh).
#pragma once

#include <gradcomp/compressors/powersgd/math.hpp>
#include <gradcomp/execution.hpp>

#include <cstddef>
#include <cstdint>

#if GRADCOMP_HAS_OPENMP
#include <omp.h>
#endif

namespace gradcomp::inline GRADCOMP_ABI::detail {

/// Gram-Schmidt on `count` vectors of `length` elements; element i of vector
/// k is at a[i * element_stride + k * vector_stride] (P: the columns of a
/// row-major rows x r matrix; Q^T: its rows). Two passes ("twice is
/// enough"): a single classical pass loses orthogonality in proportion to the
/// matrix's condition number, and P P^T is then no projector. Norms and dot
/// products accumulate in double.
template <class Resources>
void gram_schmidt(host_space const&, Resources&, float* a, std::size_t length, std::size_t count,
                  std::size_t element_stride, std::size_t vector_stride, float eps) {
  for (int pass = 0; pass < gram_schmidt_passes; ++pass) {
    for (std::size_t k = 0; k < count; ++k) {
      float* v = a + k * vector_stride;
      double norm2 = 0.0;
      for (std::size_t i = 0; i < length; ++i)
        norm2 += static_cast<double>(v[i * element_stride]) * v[i * element_stride];
      double const scale = gram_schmidt_scale(norm2, eps);
      for (std::size_t i = 0; i < length; ++i) v[i * element_stride] = scaled(v[i * element_stride], scale);
      for (std::size_t j = k + 1; j < count; ++j) {
        float* w = a + j * vector_stride;
        double dot = 0.0;
        for (std::size_t i = 0; i < length; ++i)
          dot += static_cast<double>(v[i * element_stride]) * w[i * element_stride];
        for (std::size_t i = 0; i < length; ++i)
          w[i * element_stride] = projected(w[i * element_stride], dot, v[i * element_stride]);
      }
    }
  }
}

/// acc = g + e over one matrix's rows (a value beyond `limit` is bad, and
/// counted) and, from each row just written (still in cache), its dot
/// products with the rows of q_t: P = M Q in the same pass over the matrix,
/// where the CUDA path makes two. Q is stored transposed (q_t: rank x cols).
/// Returns the number of bad values.
template <class EF, class G>
std::uint64_t accumulate_multiply(host_space const& space, G const* gradient, EF const& ef, float* acc,
                                  float const* q_t, float* p, std::size_t offset, std::size_t rows, std::size_t cols,
                                  std::size_t rank, float limit) {
  [[maybe_unused]] int const threads = space.threads_for(rows * cols);
  std::uint64_t bad = 0;
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads) reduction(+ : bad))
  for (std::size_t i = 0; i < rows; ++i) {
    auto const e = ef.bind();  // a local copy: its pointers stay in registers
    std::size_t const first = offset + i * cols;
    float* __restrict row = acc + first;
    G const* __restrict g = gradient + first;
    std::uint64_t bad_here = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      float a;
      if constexpr (decltype(e)::keeps_residual)
        a = static_cast<float>(g[c]) + e.previous[first + c];
      else
        a = static_cast<float>(g[c]) + 0.0f;  // (as a zero residual adds: -0 becomes +0)
      row[c] = a;
      bad_here += within(a, limit) ? 0u : 1u;
    }
    bad += bad_here;
    for (std::size_t k = 0; k < rank; ++k) {
      float const* q = q_t + k * cols;
      float dot = 0.0f;
      GRADCOMP_OMP(simd reduction(+ : dot))
      for (std::size_t c = 0; c < cols; ++c) dot += row[c] * q[c];
      p[i * rank + k] = dot;
    }
  }
  return bad;
}

/// q[c] += p_j x m[j x stride + c] for j = 0, 1, ..., `rows` - 1 in turn, for
/// c in [0, n): the sum over rows in the order of one row at a time, with each
/// q[c] loaded and stored once per block of rows instead of once per row (the
/// store port, not memory, bounded the row-at-a-time loop).
template <std::size_t Rows>
void add_row_block(float* __restrict q, float const* __restrict m, std::size_t stride, float const* p_block,
                   std::size_t n) {
  float p[Rows];
  for (std::size_t j = 0; j < Rows; ++j) p[j] = p_block[j];
  for (std::size_t c = 0; c < n; ++c) {
    float s = q[c];
    for (std::size_t j = 0; j < Rows; ++j) s += p[j] * m[j * stride + c];
    q[c] = s;
  }
}

/// Q^T = P^T M (q_t: rank x cols): each thread owns a slice of the columns
/// and adds p[i, k] x M[i, slice] row by row, eight rows at a time over
/// tiles of the slice that stay in L1 while Q's rank rows pass over them.
template <class Resources>
void multiply_mtp(host_space const& space, Resources&, float const* m, float const* p, float* q_t, std::size_t rows,
                  std::size_t cols, std::size_t rank) {
  constexpr std::size_t block = 8, tile = 512;
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
    float p_block[block];
    for (std::size_t i = 0; i < rows; i += block) {
      std::size_t const height = rows - i < block ? rows - i : block;
      for (std::size_t c = begin; c < end; c += tile) {
        std::size_t const width = end - c < tile ? end - c : tile;
        float const* tile_rows = m + i * cols + c;
        for (std::size_t k = 0; k < rank; ++k) {
          float* q = q_t + k * cols + c;
          for (std::size_t j = 0; j < height; ++j) p_block[j] = p[(i + j) * rank + k];
          if (height == block)
            add_row_block<block>(q, tile_rows, cols, p_block, width);
          else
            for (std::size_t j = 0; j < height; ++j)
              add_row_block<1>(q, tile_rows + j * cols, cols, p_block + j, width);
        }
      }
    }
  }
}

/// The output pass of one matrix on the host: a row per iteration.
template <class EF, class G>
void write_output(host_space const& space, std::size_t rows, std::size_t cols, psgd_output<EF, G> const& f) {
  [[maybe_unused]] int const threads = space.threads_for(rows * cols);
  GRADCOMP_OMP(parallel for schedule(static) num_threads(threads))
  for (std::size_t r = 0; r < rows; ++r) f.row(r);
}

}  // namespace gradcomp::detail
