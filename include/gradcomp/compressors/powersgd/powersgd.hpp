// PowerSGD (Vogels et al., NeurIPS 2019): low-rank compression by one step of
// power iteration per training step, with PyTorch's powerSGD_hook semantics.
//
// Each tensor of the bucket with 2+ dimensions is viewed as a matrix
// M = tensor.view(shape[0], -1), n x m, of rank r' = min(n, m, r); it is
// compressed when (n + m) r' * min_compression_rate < n m. The others (biases,
// norms, small matrices) travel uncompressed, as means, with the first
// all-reduce. Per step, with M = g + e:
//   1. Q (kept from the last step, or drawn from a stream all ranks share)
//      is copied and orthogonalized;
//   2. acc pass: acc = g + e into the workspace, P = M Q [reads g, e; writes
//      acc] (on the GPU, P = M Q by cuBLAS afterwards [reads M]);
//   3. all-reduce(sum) of every P and the uncompressed tensors, one message;
//   4. P is orthogonalized (Gram-Schmidt, norms in double); Q = M^T P
//      [reads M];
//   5. all-reduce(sum) of every Q, one message; Q /= n;
//   6. output pass: M_hat = P Q^T into the gradient, e = M - M_hat
//      [reads acc; writes g, e]; Q is kept for the next step (committed with
//      the step: a vetoed step leaves it as it was).
// Wire bytes per step: (sum of (n + m) r' + uncompressed elements) x wire size.
// PyTorch's start_powerSGD_iter is allreducer_options::warmup_steps (plain
// fp32 means first; Q is drawn at the first compressed step). Q is kept
// transposed (r x m), so its columns are contiguous. The host multiplies with
// OpenMP loops (host.hpp); the CUDA path with cuBLAS (powersgd.cuh, link
// CUDA::cublas), its handle made once per allreducer.
#pragma once

#include <gradcomp/algorithm/transform.hpp>
#include <gradcomp/compressors/powersgd/host.hpp>
#include <gradcomp/compressors/powersgd/math.hpp>
#include <gradcomp/detail/hash.hpp>
#include <gradcomp/pipeline/compressor.hpp>
#include <gradcomp/types.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace gradcomp::inline GRADCOMP_ABI {
namespace detail {

/// One tensor's part in PowerSGD: a compressed matrix or a plain tensor.
struct psgd_tensor {
  std::size_t offset, rows, cols, rank;  // rank 0: sent uncompressed
  std::size_t p_offset, q_offset;        // into the P and Q buffers (compressed)
  std::size_t plain_offset;              // into the plain part of the P payload (uncompressed)
};

/// What PowerSGD keeps per space beyond its workspace: nothing on the host;
/// on CUDA a cuBLAS handle (powersgd.cuh).
template <class Tag, class Space>
struct psgd_resources {
  explicit psgd_resources(Space const&) {}
};

/// The CUDA side (powersgd.cuh): cuBLAS products and the Gram-Schmidt kernel.
template <class Tag, class Dependent = void>
struct psgd_device {
  static_assert(always_false<Tag, Dependent>,
                "PowerSGD's CUDA path needs <gradcomp/compressors/powersgd/powersgd.cuh> in a .cu file (and "
                "CUDA::cublas)");
};

#if GRADCOMP_HAS_CUDA
// Templates, so the device struct is looked up where they are used (after
// powersgd.cuh), not here.
template <class Resources>
void gram_schmidt(cuda_space const& s, Resources& r, float* a, std::size_t length, std::size_t count,
                  std::size_t element_stride, std::size_t vector_stride, float eps) {
  psgd_device<cuda_kernels_tag, Resources>::gram_schmidt(s, r, a, length, count, element_stride, vector_stride, eps);
}
template <class Resources>
void multiply_mq(cuda_space const& s, Resources& r, float const* m, float const* q_t, float* p, std::size_t rows,
                 std::size_t cols, std::size_t rank) {
  psgd_device<cuda_kernels_tag, Resources>::multiply_mq(s, r, m, q_t, p, rows, cols, rank);
}
template <class Resources>
void multiply_mtp(cuda_space const& s, Resources& r, float const* m, float const* p, float* q_t, std::size_t rows,
                  std::size_t cols, std::size_t rank) {
  psgd_device<cuda_kernels_tag, Resources>::multiply_mtp(s, r, m, p, q_t, rows, cols, rank);
}
template <class EF, class G>
void write_output(cuda_space const& space, std::size_t rows, std::size_t cols, psgd_output<EF, G> const& f) {
  transform(space, rows * cols, inputs(f.acc + f.offset),
            outputs(gradient_stream(f.gradient, f.offset), f.ef.next(f.offset)),
            psgd_output_element{f.p, f.q_t, cols, f.rank}, {.when = f.when});
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
  /// Shards by whole tensors: a step needs each matrix whole.
  static constexpr shard_kind sharding = shard_kind::tensors;

  /// Spec: matrix_rank.
  static constexpr bool integer_lane = false;
  static constexpr bool error_feedback_by_default = true;
  /// make(the compressor the spec sets).
  template <class Spec, class Make>
  static decltype(auto) from_spec(Spec const& s, int, Make&& make) {
    return make(with_parameters<powersgd>(s));
  }

  std::size_t matrix_rank = 1;             ///< r (PyTorch: matrix_approximation_rank).
  double min_compression_rate = 2.0;       ///< Compress only if (n + m) r' * rate < n m.
  bool warm_start = true;                  ///< Reuse last step's Q.
  float orthogonalization_epsilon = 0.0f;  ///< Added to column norms in Gram-Schmidt.
  std::optional<std::uint64_t> seed{};     ///< Seeds the initial Q; unset: the bucket's own.

  /// What a spec sets (pipeline/registration.hpp).
  static constexpr auto parameters = std::tuple{
      parameter{"matrix_rank", &powersgd::matrix_rank, "r, the rank of each matrix's approximation", "1 or more"}};

  /// What PowerSGD needs per space beyond its workspace (a cuBLAS handle on CUDA).
  template <class Space>
  using resources = detail::psgd_resources<detail::cuda_kernels_tag, Space>;

  /// Calls f(part) for each tensor of `layout`, in order: compressed at
  /// which rank (0: plain), and where its pieces go. Allocates nothing, so
  /// steps can call it.
  template <class F>
  void for_each_part(bucket_layout const& layout, F&& f) const {
    std::size_t p = 0, q = 0, plain = 0;
    for (auto const& t : layout.tensors()) {
      detail::psgd_tensor x{t.offset, t.rows(), t.cols(), 0, 0, 0, 0};
      std::size_t const r = std::min({x.rows, x.cols, matrix_rank});
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

  /// The largest |g + e| a compressed step admits: a product of M with an
  /// orthonormal or a standard normal Q sums a row's or a column's worth of
  /// terms, each under 8 |M|, so with |M| below max(float) / (8 x the
  /// longest side) no product overflows.
  float range(bucket_layout const& layout) const {
    std::size_t longest = 1;
    for_each_part(layout, [&](detail::psgd_tensor const& t) {
      if (t.rank != 0) longest = std::max({longest, t.rows, t.cols});
    });
    return static_cast<float>(3.4028234663852886e38 / (8.0 * static_cast<double>(longest)));
  }

  /// Throws for a rank of 0 or a negative compression rate.
  void validate(bucket_layout const& layout, int /*ranks*/) const {
    GRADCOMP_EXPECTS(matrix_rank >= 1, "powersgd: matrix_rank=0 must be 1 or more");
    GRADCOMP_EXPECTS(min_compression_rate >= 0.0, "powersgd: min_compression_rate must be >= 0");
    for_each_part(layout, [](detail::psgd_tensor const& x) {
      GRADCOMP_EXPECTS(x.rows < (std::size_t{1} << 31) && x.cols < (std::size_t{1} << 31),
                       "powersgd: a matrix side beyond 2^31 exceeds BLAS's int dimensions");
    });
  }

  /// Hash of the parameters.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash_combine(detail::hash(name), matrix_rank);
    h = detail::hash_combine(h, std::bit_cast<std::uint64_t>(min_compression_rate));
    h = detail::hash_combine(h, warm_start);
    h = detail::hash_combine(h, std::bit_cast<std::uint32_t>(orthogonalization_epsilon));
    h = detail::hash_optional(h, seed);
    return detail::hash_combine(h, static_cast<std::uint64_t>(dtype_of_v<Wire>));
  }

  /// The workspace's first bytes, kept across steps: q_state.
  std::size_t state_bytes(bucket_layout const& layout, int) const { return size_of(layout).q * sizeof(float); }
  /// Why checkpointed state cannot be a Q (null where it can).
  char const* state_problem(span<std::byte const> state) const {
    for (std::size_t at = 0; at + sizeof(float) <= state.size(); at += sizeof(float)) {
      float q;
      std::memcpy(&q, state.data() + at, sizeof q);
      if (!detail::is_finite(q)) return "PowerSGD's Q holds NaN or infinite values";
    }
    return nullptr;
  }

  /// Workspace pieces. q_state persists from step to step (the warm start).
  template <class Memory>
  struct workspace {
    span<float, Memory> q_state;  ///< Every Q, transposed (rank x cols), as the last committed step left it.
    span<float, Memory> acc;      ///< g + e, the matrices M.
    span<float, Memory> p;        ///< Every P.
    span<float, Memory> q_work;   ///< This step's Q.
    span<Wire, Memory> p_wire;    ///< Every P, then the plain tensors: the first message.
    span<Wire, Memory> q_wire;    ///< Every Q: the second message.
    span<std::byte, Memory> scratch;
  };

  /// Takes the workspace pieces (measures when the carver is empty).
  template <class Aggregator, class Memory>
  workspace<Memory> carve(workspace_carver<Memory>& w, bucket_layout const& layout, int ranks) const {
    sizes const s = size_of(layout);
    workspace<Memory> ws;
    ws.q_state = w.template take<float>(s.q);
    ws.acc = w.template take<float>(layout.size());
    ws.p = w.template take<float>(s.p);
    ws.q_work = w.template take<float>(s.q);
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
  template <class Context, gradient_element G>
  void step(Context& ctx, span<G, typename Context::memory> gradient) const {
    using EF = typename Context::error_feedback_ref;
    auto const ws = ctx.carve(*this);
    auto const& space = ctx.space();
    auto const& ef = ctx.error_feedback();
    auto& resources = ctx.resources();
    float const n = static_cast<float>(ctx.ranks());
    std::size_t const d = gradient.size();

    // Q first: it depends on the kept state alone, so the pass that forms
    // M = g + e can multiply by it.
    if (ctx.step() == 0 || !warm_start)  // the same Q on every rank
      transform(space, ws.q_work.size(), inputs(), outputs(ws.q_work),
                detail::psgd_normal_fill{ctx.random(seed, random_purpose::projection, random_stream::shared)});
    else
      transform(space, ws.q_work.size(), inputs(ws.q_state), outputs(ws.q_work), detail::psgd_copy{});
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank > 0)  // Q's columns are q_t's rows
        detail::gram_schmidt(space, resources, ws.q_work.data() + t.q_offset, t.cols, t.rank, 1, t.cols,
                             orthogonalization_epsilon);
    });

    // M = g + e, counting bad values; P = M Q per matrix: on the host in the
    // same pass (its rows still in cache), on the GPU by cuBLAS after it.
    float const limit = range(ctx.layout());
    if constexpr (std::is_same_v<typename Context::memory, host_memory>) {
      for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
        if (t.rank == 0)
          transform(space, t.rows * t.cols, inputs(detail::gradient_stream(gradient, t.offset), ef.previous(t.offset)),
                    outputs(ws.acc.data() + t.offset), detail::psgd_accumulate{limit}, {.count = ctx.bad_count()});
        else
          *ctx.bad_count() +=
              detail::accumulate_multiply(space, gradient.data(), ef, ws.acc.data(), ws.q_work.data() + t.q_offset,
                                          ws.p.data() + t.p_offset, t.offset, t.rows, t.cols, t.rank, limit);
      });
    } else {
      transform(space, d, inputs(detail::gradient_stream(gradient), ef.previous()), outputs(ws.acc),
                detail::psgd_accumulate{limit}, {.count = ctx.bad_count()});
    }
    ctx.agree_all_finite("NaN, infinite or beyond PowerSGD's range (max(float) / (8 x the longest matrix side))");
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank == 0)  // the plain tensors join the first message
        transform(space, t.rows * t.cols, inputs(ws.acc.data() + t.offset),
                  outputs(ws.p_wire.data() + ws.p.size() + t.plain_offset), detail::psgd_pack_plain<Wire>{1.0f / n});
#if GRADCOMP_HAS_CUDA
      else if constexpr (!std::is_same_v<typename Context::memory, host_memory>)
        detail::multiply_mq(space, resources, ws.acc.data() + t.offset, ws.q_work.data() + t.q_offset,
                            ws.p.data() + t.p_offset, t.rows, t.cols, t.rank);
#endif
    });
    transform(space, ws.p.size(), inputs(ws.p), outputs(ws.p_wire), detail::psgd_to_wire<Wire>{});
    ctx.aggregate(ws.p_wire, ws.scratch);
    transform(space, ws.p.size(), inputs(ws.p_wire), outputs(ws.p), detail::psgd_from_wire<Wire>{1.0f});

    // Orthogonalize the summed P; Q = M^T P.
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank == 0) return;
      float* p = ws.p.data() + t.p_offset;  // P's columns: stride rank
      detail::gram_schmidt(space, resources, p, t.rows, t.rank, t.rank, 1, orthogonalization_epsilon);
      detail::multiply_mtp(space, resources, ws.acc.data() + t.offset, p, ws.q_work.data() + t.q_offset, t.rows, t.cols,
                           t.rank);
    });
    transform(space, ws.q_work.size(), inputs(ws.q_work), outputs(ws.q_wire), detail::psgd_to_wire<Wire>{});
    ctx.aggregate(ws.q_wire, ws.scratch);
    transform(space, ws.q_work.size(), inputs(ws.q_wire), outputs(ws.q_work), detail::psgd_from_wire<Wire>{1.0f / n});

    // Output and residual, matrix by matrix; the plain tensors' means.
    gate const when = ctx.output_gate();
    for_each_part(ctx.layout(), [&](detail::psgd_tensor const& t) {
      if (t.rank == 0) {
        transform(space, t.rows * t.cols,
                  inputs(ws.acc.data() + t.offset, ws.p_wire.data() + ws.p.size() + t.plain_offset),
                  outputs(detail::gradient_stream(gradient, t.offset), ef.next(t.offset)),
                  detail::psgd_unpack_plain<Wire>{1.0f / n, n}, {.when = when});
        return;
      }
      detail::write_output(
          space, t.rows, t.cols,
          detail::psgd_output<EF, G>{when, ws.acc.data(), gradient.data(), ef, ws.p.data() + t.p_offset,
                                     ws.q_work.data() + t.q_offset, t.offset, t.cols, t.rank});
    });
    transform(space, ws.q_work.size(), inputs(ws.q_work), outputs(ws.q_state), detail::psgd_copy{},
              {.when = ctx.state_gate()});
  }
};

static_assert(compressor<powersgd<>>);

}  // namespace gradcomp
