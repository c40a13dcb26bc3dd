// Test bodies for PowerSGD, instantiated per setup (host here; CUDA in the
// gpu tests). Needs CBLAS (host) or cuBLAS (device).
#pragma once

#include "harness.hpp"

#include <gradcomp/compressors/powersgd/powersgd.hpp>

#include <cmath>

namespace gradcomp::testing {

/// rows x cols row-major matrix of rank `rank`: U diag(s) V^T with random
/// orthonormal U, V (Gram-Schmidt in double) and singular values in [1, 2],
/// so float arithmetic can recover it to ~1e-6 (an ill-conditioned one loses
/// digits in proportion to its condition number, in any float algorithm).
inline std::vector<float> low_rank(std::uint64_t seed, std::size_t rows, std::size_t cols, std::size_t rank) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal;
  auto orthonormal = [&](std::size_t n) {
    std::vector<std::vector<double>> basis;
    while (basis.size() < rank) {
      std::vector<double> v(n);
      for (auto& x : v) x = normal(rng);
      for (auto const& b : basis) {
        double dot = 0;
        for (std::size_t i = 0; i < n; ++i) dot += v[i] * b[i];
        for (std::size_t i = 0; i < n; ++i) v[i] -= dot * b[i];
      }
      double norm = 0;
      for (double x : v) norm += x * x;
      for (auto& x : v) x /= std::sqrt(norm);
      basis.push_back(v);
    }
    return basis;
  };
  auto const u = orthonormal(rows), v = orthonormal(cols);
  std::vector<float> m(rows * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      double x = 0;
      for (std::size_t k = 0; k < rank; ++k) x += (1.0 + double(k) / rank) * u[k][i] * v[k][j];
      m[i * cols + j] = static_cast<float>(x);
    }
  return m;
}

inline double frobenius(std::vector<double> const& a) {
  double s = 0;
  for (double x : a) s += x * x;
  return std::sqrt(s);
}

/// The best rank-r approximation of a rows x cols matrix, in double: the
/// eigenvectors of M^T M by cyclic Jacobi rotations, then M V_r V_r^T.
inline std::vector<double> best_rank(std::vector<float> const& m, std::size_t rows, std::size_t cols, std::size_t r) {
  std::vector<double> a(cols * cols, 0.0), v(cols * cols, 0.0);
  for (std::size_t i = 0; i < cols; ++i)
    for (std::size_t j = 0; j < cols; ++j)
      for (std::size_t k = 0; k < rows; ++k) a[i * cols + j] += double(m[k * cols + i]) * m[k * cols + j];
  for (std::size_t i = 0; i < cols; ++i) v[i * cols + i] = 1.0;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (std::size_t p = 0; p < cols; ++p)
      for (std::size_t q = p + 1; q < cols; ++q) off += a[p * cols + q] * a[p * cols + q];
    if (off < 1e-24) break;
    for (std::size_t p = 0; p < cols; ++p)
      for (std::size_t q = p + 1; q < cols; ++q) {
        double const apq = a[p * cols + q];
        if (std::fabs(apq) < 1e-300) continue;
        double const theta = (a[q * cols + q] - a[p * cols + p]) / (2 * apq);
        double const t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        double const c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (std::size_t k = 0; k < cols; ++k) {  // A <- J^T A J, V <- V J
          double const akp = a[k * cols + p], akq = a[k * cols + q];
          a[k * cols + p] = c * akp - s * akq;
          a[k * cols + q] = s * akp + c * akq;
        }
        for (std::size_t k = 0; k < cols; ++k) {
          double const apk = a[p * cols + k], aqk = a[q * cols + k];
          a[p * cols + k] = c * apk - s * aqk;
          a[q * cols + k] = s * apk + c * aqk;
        }
        for (std::size_t k = 0; k < cols; ++k) {
          double const vkp = v[k * cols + p], vkq = v[k * cols + q];
          v[k * cols + p] = c * vkp - s * vkq;
          v[k * cols + q] = s * vkp + c * vkq;
        }
      }
  }
  std::vector<std::size_t> order(cols);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto x, auto y) { return a[x * cols + x] > a[y * cols + y]; });
  std::vector<double> out(rows * cols, 0.0);
  for (std::size_t k = 0; k < r; ++k) {
    std::size_t const e = order[k];
    for (std::size_t i = 0; i < rows; ++i) {
      double mv = 0;
      for (std::size_t j = 0; j < cols; ++j) mv += m[i * cols + j] * v[j * cols + e];
      for (std::size_t j = 0; j < cols; ++j) out[i * cols + j] += mv * v[j * cols + e];
    }
  }
  return out;
}

inline double relative_error(std::vector<float> const& got, std::vector<double> const& want) {
  std::vector<double> diff(got.size());
  for (std::size_t i = 0; i < got.size(); ++i) diff[i] = got[i] - want[i];
  return frobenius(diff) / frobenius(want);
}

inline std::vector<double> widen(std::vector<float> const& a) { return {a.begin(), a.end()}; }

}  // namespace gradcomp::testing

// A matrix of rank <= r is in the span of P after one step, so one step
// recovers it (random Q at the first compressed step, warm or not). How
// exactly depends on the random Q: rounding is amplified by 1 / cos of the
// angle between Q and the matrix's row space, which a fresh draw makes small
// now and then; so the first step must be right to 1e-2 (a wrong step is off
// by O(1)), and the second, whose warm Q = M^T P lies in that row space, to
// float precision.
TEST_CASE_TEMPLATE_DEFINE("PowerSGD recovers a matrix of rank <= r in one step", Space, psgd_exact) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    for (std::size_t r : {std::size_t{1}, std::size_t{2}, std::size_t{4}}) {
      auto const m = low_rank(shared_seed(comm), 96, 64, r);
      allreducer<powersgd<>, error_feedback::none, local_group::communicator, allreduce_aggregator, Space> reduce(
          powersgd<>{.matrix_rank = r}, comm, bucket_layout{{96, 64}}, space);
      INFO("rank " << r);
      auto g = upload(space, m);
      reduce(g.view());
      CHECK(relative_error(download(space, g.data(), m.size()), widen(m)) < 1e-2);
      g = upload(space, m);
      reduce(g.view());
      CHECK(relative_error(download(space, g.data(), m.size()), widen(m)) < 1e-5);
    }
  });
}

// Repeated steps on the same matrix with warm start are power iteration:
// they converge to the best rank-r approximation (checked against a Jacobi
// SVD in double).
TEST_CASE_TEMPLATE_DEFINE("PowerSGD with warm start converges to the best rank-r approximation", Space,
                          psgd_converges) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    std::size_t const rows = 40, cols = 30, r = 2;
    // A clear spectral gap after r, and noise below it.
    auto m = low_rank(shared_seed(comm), rows, cols, r);
    auto const noise = low_rank(shared_seed(comm) + 1, rows, cols, 6);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = 3 * m[i] + 0.3f * noise[i];
    auto const best = best_rank(m, rows, cols, r);
    allreducer<powersgd<>, error_feedback::none, local_group::communicator, allreduce_aggregator, Space> reduce(
        powersgd<>{.matrix_rank = r}, comm, bucket_layout{{rows, cols}}, space);
    double error = 1;
    for (int step = 0; step < 40; ++step) {
      auto g = upload(space, m);
      reduce(g.view());
      error = relative_error(download(space, g.data(), m.size()), best);
    }
    CHECK(error < 1e-4);
  });
}

// Four ranks: every rank ends with bitwise the same output, and it is P Q^T
// with P orthonormal and Q = mean(M)^T P: the projection of the mean onto
// span(P), so output^T (mean - output) = 0. Biases and a matrix below the
// compression threshold travel plain and come out as exact means.
TEST_CASE_TEMPLATE_DEFINE("PowerSGD on four ranks: identical outputs, projections of the mean", Setup, psgd_ranks) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  typename Setup::world{}.run([](auto& comm) {
    using collective_t = std::remove_cvref_t<decltype(comm)>;
    auto const space = Setup::make_space();
    std::uint64_t const seed = shared_seed(comm);
    int const n = comm.size();
    bucket_layout layout;
    layout.add({64, 80}).add({80}).add({8, 6}).add({3, 2, 5});  // compressed, bias, too small, too small (3-D)
    std::size_t const d = layout.size(), rows = 64, cols = 80;
    auto const grads = random_gradients(seed, n, d);
    allreducer<powersgd<>, error_feedback::residual, collective_t, allreduce_aggregator, typename Setup::space> reduce(
        powersgd<>{.matrix_rank = 3}, comm, layout, space);
    auto g = upload(space, grads[comm.rank()]);
    reduce(g.view());
    auto const out = download(space, g.data(), d);

    CHECK(same_as_rank0(comm, out));

    std::vector<double> mean(d, 0.0);
    for (auto const& gr : grads)
      for (std::size_t i = 0; i < d; ++i) mean[i] += gr[i];
    for (auto& x : mean) x /= n;
    double orthogonality = 0, scale = 0;  // || out^T (mean - out) || / ||mean||^2
    for (std::size_t a = 0; a < cols; ++a)
      for (std::size_t b = 0; b < cols; ++b) {
        double s = 0;
        for (std::size_t i = 0; i < rows; ++i) s += out[i * cols + a] * (mean[i * cols + b] - out[i * cols + b]);
        orthogonality += s * s;
      }
    for (std::size_t i = 0; i < rows * cols; ++i) scale += mean[i] * mean[i];
    CHECK(std::sqrt(orthogonality) < 1e-4 * scale);
    std::size_t plain_wrong = 0;  // the plain tensors: the rank-order float sum of g x fl(1/n), exactly
    float const inverse = 1.0f / static_cast<float>(n);
    for (std::size_t i = rows * cols; i < d; ++i) {
      float sum = grads[0][i] * inverse;
      double magnitude = std::fabs(grads[0][i]);  // the sum's rounding is relative to this
      for (int r = 1; r < n; ++r) sum += grads[r][i] * inverse, magnitude += std::fabs(grads[r][i]);
      bool const local = std::is_same_v<typename Setup::world, local_world>;
      plain_wrong += (local ? same_bits(out[i], sum) : std::fabs(out[i] - mean[i]) <= 1e-6 * magnitude / n) ? 0 : 1;
    }
    CHECK(plain_wrong == 0);
    CHECK(reduce.wire_bytes() == ((64 * 3 + 80 + 48 + 30) + 80 * 3) * 4 + 8);
  });
}

// Error feedback: what a step outputs plus what it keeps is what it had,
// to float rounding (the residual is acc - M_hat, computed in float).
TEST_CASE_TEMPLATE_DEFINE("PowerSGD's residual keeps what the approximation missed", Space, psgd_residual) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    std::uint64_t const seed = shared_seed(comm);
    bucket_layout layout;
    layout.add({50, 70}).add({70}).add({70, 50});
    std::size_t const d = layout.size();
    allreducer<powersgd<bfloat16>, error_feedback::residual, local_group::communicator, allreduce_aggregator, Space>
        reduce(powersgd<bfloat16>{.matrix_rank = 2}, comm, layout, space);
    std::vector<float> residual(d, 0.0f);
    double worst = 0;
    for (int step = 0; step < 10; ++step) {
      auto const g = random_gradient(seed + step, 0, d);
      auto device = upload(space, g);
      reduce(device.view());
      auto const out = download(space, device.data(), d);
      auto const next = download(space, reduce.residual().data(), d);
      for (std::size_t i = 0; i < d; ++i) {
        double const had = double(g[i]) + residual[i];
        // acc - M_hat rounds once, relative to the larger of the two
        worst =
            std::max(worst, std::fabs(double(out[i]) + next[i] - had) / (std::fabs(had) + std::fabs(out[i]) + 1e-30));
      }
      residual = next;
    }
    CHECK(worst < 1e-6);
  });
}

// A rank beyond min(rows, cols) is clamped; with min_compression_rate 0
// every matrix is compressed, and a 5 x 200 matrix at r = 8 (r' = 5) comes
// back whole. An all-zero gradient with epsilon 0 yields zeros, not NaN.
// Warm-up steps are plain means.
TEST_CASE_TEMPLATE_DEFINE("PowerSGD clamps the rank, survives zero columns, warms up plainly", Space, psgd_edges) {
  using namespace gradcomp;
  using namespace gradcomp::testing;
  local_group::run(1, [](local_group::communicator& comm) {
    Space const space{};
    auto const m = random_gradient(shared_seed(comm), 0, 5 * 200);
    allreducer<powersgd<>, error_feedback::none, local_group::communicator, allreduce_aggregator, Space> clamped(
        powersgd<>{.matrix_rank = 8, .min_compression_rate = 0}, comm, bucket_layout{{5, 200}}, space);
    auto g = upload(space, m);
    clamped(g.view());
    CHECK(relative_error(download(space, g.data(), m.size()), widen(m)) < 1e-5);
    CHECK(clamped.wire_bytes() == (5 * 5 + 200 * 5) * 4 + 8);

    allreducer<powersgd<>, error_feedback::residual, local_group::communicator, allreduce_aggregator, Space> zeros(
        powersgd<>{.matrix_rank = 2}, comm, bucket_layout{{30, 40}}, space);
    auto z = upload(space, std::vector<float>(1200, 0.0f));
    zeros(z.view());
    auto const out = download(space, z.data(), 1200);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));

    allreducer<powersgd<>, error_feedback::residual, local_group::communicator, allreduce_aggregator, Space> later(
        powersgd<>{.matrix_rank = 1}, comm, bucket_layout{{30, 40}}, space, {.warmup_steps = 2});
    auto const w = random_gradient(9, 0, 1200);
    for (int step = 0; step < 3; ++step) {
      auto x = upload(space, w);
      later(x.view());
      auto const o = download(space, x.data(), 1200);
      if (step < 2)
        CHECK(std::memcmp(o.data(), w.data(), 1200 * 4) == 0);  // the mean of one rank: itself
      else
        CHECK(relative_error(o, widen(w)) > 1e-2);  // rank 1 of a random matrix: lossy
    }
  });
}
