// Aggregators: how a compressed payload is combined across ranks.
//
// A payload is summable (homomorphic) when adding the payloads of all ranks
// element by element gives the payload of the sum: 16-bit casts, integer
// quantization levels, TopK-Chunked's agreed chunks. Those can ride one
// all-reduce, whose traffic per rank does not grow with the number of ranks.
// Payloads that are not summable (classic TopK's (index, value) pairs, each
// rank picking its own indices) must be all-gathered and merged locally, and
// their traffic grows with n: the cost the evaluation exists to expose.
#pragma once

#include <gradcomp/detail/reduce.hpp>
#include <gradcomp/execution.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Sums payloads with one all-reduce. Only for summable payloads.
struct allreduce_aggregator {
  /// Name for messages and reports.
  static constexpr std::string_view name = "all-reduce";
  /// All-reduce can only add payloads that add element by element.
  static constexpr bool requires_summable_payload = true;

  /// Scratch bytes needed for a payload of `payload_bytes` over `ranks`.
  static constexpr std::size_t scratch_bytes(std::size_t /*payload_bytes*/, int /*ranks*/) { return 0; }

  /// payload <- sum over ranks of payload.
  template <class Context, class T, class Memory>
  static void sum(Context& ctx, span<T, Memory> payload, span<std::byte, Memory> /*scratch*/) {
    ctx.all_reduce(payload, reduce_op::sum);
  }
};

/// All-gathers every rank's payload, then reduces locally: the path for
/// payloads that are not summable, and a parameter-server-like alternative
/// for those that are. Sums locally in rank order, so every rank gets the
/// same bits.
struct allgather_aggregator {
  /// Name for messages and reports.
  static constexpr std::string_view name = "all-gather";
  /// Works for any payload; the compressor merges the gathered copies.
  static constexpr bool requires_summable_payload = false;

  /// Room for every rank's copy of the payload.
  static constexpr std::size_t scratch_bytes(std::size_t payload_bytes, int ranks) {
    return payload_bytes * static_cast<std::size_t>(ranks);
  }

  /// payload <- sum over ranks of payload, by all-gather and a local sum.
  template <class Context, class T, class Memory>
  static void sum(Context& ctx, span<T, Memory> payload, span<std::byte, Memory> scratch) {
    span<T, Memory> const gathered = gather(ctx, span<T const, Memory>(payload), scratch);
    parallel_for(
        ctx.space(), payload.size(),
        detail::reduce_gathered<T>{gathered.data(), payload.data(), payload.size(), ctx.ranks(), reduce_op::sum});
  }

  /// Every rank's payload, rank r's at [r * size, (r + 1) * size) of the
  /// returned view (which lives in `scratch`).
  template <class Context, class T, class Memory>
  static span<T, Memory> gather(Context& ctx, span<T const, Memory> payload, span<std::byte, Memory> scratch) {
    using U = std::remove_const_t<T>;
    span<U, Memory> const gathered(reinterpret_cast<U*>(scratch.data()), payload.size() * ctx.ranks());
    ctx.all_gather(payload, gathered);
    return gathered;
  }
};

/// True when compressor C's payload can be combined by aggregator A.
template <class C, class A>
inline constexpr bool can_aggregate = !A::requires_summable_payload || C::summable_payload;

/// The aggregator a compressor uses unless told otherwise: all-reduce for
/// summable payloads, all-gather for the rest.
template <class C>
using default_aggregator_t = std::conditional_t<C::summable_payload, allreduce_aggregator, allgather_aggregator>;

}  // namespace gradcomp
