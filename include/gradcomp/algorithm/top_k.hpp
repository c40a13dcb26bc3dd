// top_k: the `count` largest of n 32-bit keys, ties to the lower index,
// reported in index order. The result is a pure function of the keys: the
// same on host and device, whatever the thread count, so ranks holding the
// same keys select the same elements.
//
//   top_k(space, n, count, key, emit, scratch)
//
// calls emit(i, r) for each selected i, r = 0, 1, ... in increasing i.
//
// Host, for a million keys and more: one pass. A threshold is guessed from
// a sample (256 runs of 256 keys spread evenly over them), a few deviations
// below the count-th largest sampled key; the keys at or above it are copied
// out, each thread's in index order into its share of the scratch, and the
// count-th largest is found among those copies alone. Where the guess was
// too high (fewer than count copies) or a thread's share overflows, that
// work is dropped for two passes: the first counts, per thread, the keys of
// each value of their top 11 bits (histograms small enough for L1), which
// names the bin holding the count-th largest key; the second copies out the
// indices above that bin and the bin's keys (the candidates), both in index
// order at offsets the histograms give. The threshold is then found among
// the candidates alone, and the two lists merge into the emission. Where the
// lists would not fit the scratch (a bin of many equal keys, count a large
// part of n), an MSD radix select over all keys (16-bit digits for large n,
// 8-bit for small) finds the threshold, and one pass counts and one emits.
// The three give the same result; the first costs one read of the keys.
// Each host strategy is a file of algorithm/detail/top_k/; its constants are
// tuning::top_k_policy. CUDA (top_k.cuh): three histogram rounds
// (11, 11, 10 bits) find the threshold on the device, then an index-ordered
// compaction (per-tile counts, a scan, an emit pass); nothing is sorted and
// the host never looks at a count.
#pragma once

#include <gradcomp/algorithm/detail/top_k/device.hpp>
#include <gradcomp/algorithm/detail/top_k/radix_select.hpp>
#include <gradcomp/algorithm/detail/top_k/sampled_select.hpp>
#include <gradcomp/algorithm/detail/top_k/two_pass_select.hpp>
#include <gradcomp/config.hpp>
#include <gradcomp/detail/checked.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/execution/workspace.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace gradcomp::inline GRADCOMP_ABI {

/// Bytes of scratch top_k needs for n keys in memory of kind Memory.
template <class Memory>
std::size_t top_k_scratch_bytes(std::size_t n) {
  workspace_carver<Memory> measure;
  if constexpr (std::is_same_v<Memory, host_memory>) {
    std::size_t const threads = static_cast<std::size_t>(host_thread_capacity());
    std::size_t const radix = detail::checked_mul(detail::host_select_bins(n), threads, "top_k");
    std::size_t const passes = detail::checked_add(
        detail::checked_mul(detail::pass_select_stride, threads, "top_k"),
        detail::checked_add(detail::checked_mul(detail::pass_select_room(n), 4, "top_k"), 3 * threads, "top_k"),
        "top_k");
    measure.template take<std::uint32_t>(std::max(radix, passes));
  } else
    detail::carve_device_select(measure, n);
  return measure.bytes();
}

/// Calls emit(i, r) for the `count` largest keys key(i), i in [0, n), ties
/// to the lower index, r = 0, 1, ... in index order (see the top of this
/// header). Host version.
template <class Key, class Emit>
void top_k(host_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
           span<std::byte, host_memory> scratch) {
  if (count == 0 || n == 0) return;
  if (count >= n) {
    parallel_for(space, n, [&](std::size_t i) { emit(i, i); });
    return;
  }
  auto* histograms = reinterpret_cast<std::uint32_t*>(scratch.data());
  int const capacity = static_cast<int>(scratch.size() / (detail::host_select_bins(n) * sizeof(std::uint32_t)));
  int const threads = std::max(1, std::min(space.threads_for(n), capacity));
  int const slots = detail::pass_select_slots(space, n, scratch);
  if (detail::sampled_select(slots, n, count, key, emit, histograms)) return;
  if (detail::two_pass_select(slots, n, count, key, emit, histograms)) return;
  detail::radix_select(threads, n, count, key, emit, histograms);
}

#if GRADCOMP_HAS_CUDA
/// The same on the CUDA space, asynchronously on its stream (top_k.cuh;
/// scratch is device memory, key and emit run in kernels).
template <class Key, class Emit>
void top_k(cuda_space const& space, std::size_t n, std::size_t count, Key const& key, Emit const& emit,
           span<std::byte, device_memory> scratch) {
  detail::cuda_top_k<detail::cuda_kernels_tag, Key, Emit>::run(space, n, count, key, emit, scratch);
}
#endif

}  // namespace gradcomp
