// Two-level aggregation: fast links inside a node, slow ones between nodes,
// and compression only where it pays.
//
//   1. reduce-scatter inside the node (fp32, or bf16 for half the bytes): each
//      of the node's L ranks receives the node's sum of its 1/L shard;
//   2. each rank compresses its shard (divided by L: the node's mean) and runs
//      the compressed all-reduce across nodes with its rail, the ranks of the
//      same local rank on every node (L rails in parallel);
//   3. all-gather inside the node: every rank holds the whole mean.
//
// Buckets of 16-bit gradients (bfloat16, half) are widened to fp32 for the
// node's reduce-scatter (or sent as bf16), and the shard's mean is rounded
// once, to the gradient's type, before the all-gather: the fp32 path's
// result, rounded, for half its all-gather bytes.
//
// Error feedback lives on the shard, and integer lanes are sized by the
// number of nodes, not of ranks: only the nodes' sums cross the slow link.
//
// Shards are runs of elements, whole rotation blocks and chunks, except for
// PowerSGD, whose step needs whole matrices: its shards are runs of whole
// tensors, as even as the tensors allow, each in a slot of the node's
// reduce-scatter as large as the largest. A bucket with fewer tensors than
// the node has ranks leaves some ranks without a tensor; they reduce one
// zero across nodes, so that every rail steps and agrees alike. Buckets
// rotate which rank takes the first run, so one-matrix buckets spread over
// the node. PowerSGD is linear in the gradient, so its two-level step is the
// flat step up to rounding, with error feedback on each node's mean.
// A step's verdict (non-finite values, a lane that would overflow) is agreed
// by every rank of the world, so the rails of a node commit or fail a step
// together and no shard's state moves alone.
#pragma once

#include <gradcomp/reducers/agreement.hpp>
#include <gradcomp/reducers/allreducer.hpp>
#include <gradcomp/reducers/shards.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A world in two levels: this rank's node, and its rail across nodes.
template <class Collective>
struct node_groups {
  Collective local;  ///< The ranks of this rank's node.
  Collective cross;  ///< One rank per node: those with this rank's local rank (its rail).
  /// Number of nodes.
  int nodes() const { return cross.size(); }
  /// Ranks per node.
  int ranks_per_node() const { return local.size(); }
};

namespace detail {
/// True when compressor C shards by whole tensors across a node's ranks: its
/// payload sums, but its step needs the tensors' shapes (PowerSGD).
template <class C>
inline constexpr bool shards_by_tensors =
    C::summable_payload && requires { typename C::template resources<host_space>; };

/// True when C can be reduced in two levels.
template <class C>
inline constexpr bool shards_in_two_levels = shards_by_elements<C> || shards_by_tensors<C>;

/// Runs of whole tensors, one per rank, each cut at the tensor edge nearest
/// to an even share of the elements; run j goes to rank (first + j) % parts.
inline node_parts tensor_parts(bucket_layout const& layout, int parts, int first) {
  auto const& tensors = layout.tensors();
  std::size_t const d = layout.size(), n = static_cast<std::size_t>(parts);
  std::vector<std::size_t> cut(n + 1, d);  // run j: elements [cut[j], cut[j + 1])
  cut[0] = 0;
  std::size_t t = 0;
  for (std::size_t j = 1; j < n; ++j) {
    std::size_t const even = d * j / n;
    while (t < tensors.size() && tensors[t].offset + tensors[t].elements <= even) ++t;
    std::size_t edge = d;  // the nearer edge of tensor t (the one holding `even`)
    if (t < tensors.size()) {
      std::size_t const lo = tensors[t].offset, hi = lo + tensors[t].elements;
      edge = even - lo <= hi - even ? lo : hi;
    }
    cut[j] = std::max(cut[j - 1], edge);
  }
  node_parts p{std::vector<element_range>(n), 1};  // (a slot of one element at least)
  for (std::size_t j = 0; j < n; ++j) {
    p.of_rank[(static_cast<std::size_t>(first) + j) % n] = {cut[j], cut[j + 1] - cut[j]};
    p.slot = std::max(p.slot, cut[j + 1] - cut[j]);
  }
  return p;
}

/// The tensors of `layout` within `r` (whole tensors), or one element when
/// there are none: a rank without a tensor still steps.
inline bucket_layout tensors_within(bucket_layout const& layout, element_range r) {
  bucket_layout out;
  for (auto const& t : layout.tensors())
    if (t.offset >= r.first && t.offset + t.elements <= r.first + r.count && t.elements > 0) out.add(t.shape);
  return out.size() > 0 ? out : bucket_layout(1);
}

}  // namespace detail

/// Splits `world` into nodes, and each rank's rail across them. Nodes are
/// runs of `ranks_per_node` consecutive ranks when it is given (emulation,
/// clusters the backend cannot see), else what the backend detects
/// (split_node(): MPI's shared-memory groups, NCCL's host names). Every node
/// must hold the same number of ranks. Collective.
template <splittable Collective>
node_groups<Collective> split_nodes(Collective& world, int ranks_per_node = 0) {
  int const n = world.size(), rank = world.rank();
  GRADCOMP_EXPECTS(ranks_per_node >= 0, "split_nodes: ranks_per_node must not be negative");
  auto local = [&]() -> Collective {
    if (ranks_per_node > 0) {
      GRADCOMP_EXPECTS(n % ranks_per_node == 0, "split_nodes: " + std::to_string(n) + " ranks do not make nodes of " +
                                                    std::to_string(ranks_per_node));
      return world.split(rank / ranks_per_node, rank);
    }
    if constexpr (requires { world.split_node(); })
      return world.split_node();
    else
      throw invalid_argument("split_nodes: this collective cannot detect nodes; give ranks_per_node");
  }();
  default_space_t<Collective> const space = default_space(world);
  std::int64_t const sizes[2] = {local.size(), -static_cast<std::int64_t>(local.size())};
  buffer<std::int64_t, default_space_t<Collective>> words(2, space);
  space.from_host(words.data(), sizes, sizeof sizes);
  world.all_reduce(words.data(), words.data(), 2, reduce_op::max);
  std::int64_t range[2];
  space.to_host(range, words.data(), sizeof range);
  GRADCOMP_EXPECTS(range[0] == -range[1], "split_nodes: nodes hold different numbers of ranks (from " +
                                              std::to_string(-range[1]) + " to " + std::to_string(range[0]) +
                                              "); hierarchical aggregation needs equal nodes");
  Collective cross = world.split(local.rank(), rank);
  return {std::move(local), std::move(cross)};
}

/// One rail of a two-level world as a collective: data moves among the rail's
/// ranks (one per node), while a step's agreement (agree) runs over the whole
/// world, so that all rails commit or fail a step together.
template <class Collective>
class rail_collective {
 public:
  rail_collective(Collective& cross, Collective& local) : cross_(&cross), local_(&local) {}

  int rank() const { return cross_->rank(); }
  int size() const { return cross_->size(); }
  bool accepts(memory_kind kind) const { return cross_->accepts(kind); }
  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    cross_->all_reduce(send, recv, count, op);
  }
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    cross_->all_gather(send, recv, count);
  }
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    cross_->broadcast(buffer, count, root);
  }
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
    cross_->reduce_scatter(send, recv, count, op);
  }
  /// The step's status words summed over the world: over the rail, then
  /// over the node (each rank counted once).
  void agree(std::uint64_t const* send, std::uint64_t* recv) {
    cross_->all_reduce(send, recv, 1, reduce_op::sum);
    local_->all_reduce(recv, recv, 1, reduce_op::sum);
  }
  auto stream() const
    requires requires(Collective const& c) { c.stream(); }
  {
    return cross_->stream();
  }
  void check_async()
    requires requires(Collective& c) { c.check_async(); }
  {
    cross_->check_async();
    local_->check_async();
  }
  /// The execution space of a rail: its backend's.
  friend auto default_space(rail_collective const& r) { return default_space(*r.cross_); }

 private:
  Collective* cross_;
  Collective* local_;
};


/// Options of a hierarchical_allreducer.
struct hierarchical_options {
  /// The rail's compressor options: non-finite policy, seed, warm-up.
  allreducer_options reduce{};
  /// Reduce-scatter inside the node in bf16 (half the bytes, one rounding
  /// of each rank's value) rather than fp32.
  bool bf16_within_node = false;
};

namespace detail {
// (16-bit elements travel through these as widened streams: read as float,
// written rounded once.)
struct divide_by {
  float n;
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x / n; }
};
struct same_value {
  GRADCOMP_HOST_DEVICE void operator()(std::size_t, float x, float& out) const { out = x; }
};

/// The first level of a two-level step, which the hierarchical all-reduce and
/// reduce-scatter share: the node's reduce-scatter of a bucket (fp32, or bf16
/// for half the bytes), after which this rank holds the node's mean of its
/// slot, in fp32. Owns the padded bucket, which the all-gather reuses.
template <class Space, class Gradient>
class node_reduction {
  static constexpr bool wide = std::is_same_v<Gradient, float>;

 public:
  using memory = typename Space::memory;

  node_reduction(node_parts parts, Space space, bool bf16)
      : parts_(std::move(parts)), in_place_(parts_.in_place()), space_(space), bf16_(bf16) {
    std::size_t const slot = parts_.slot, padded = slot * parts_.of_rank.size();
    whole_ = buffer<Gradient, Space>(padded, space_);
    part_ = buffer<float, Space>(slot, space_);
    if (bf16)  // the node's sum, after the bucket in bf16 unless it is already
      narrow_ = buffer<bfloat16, Space>(std::is_same_v<Gradient, bfloat16> ? slot : slot + padded, space_);
    else if (!wide)
      widened_ = buffer<float, Space>(padded, space_);
    space_.fill_zero(whole_.data(), padded * sizeof(Gradient));
  }

  /// Reduce-scatters `gradient` (the bucket, or when `ok` is false the padded
  /// bucket's old contents, so that a rank with a wrong size still takes part)
  /// over the node `local`, and returns this rank's slot of the node's mean.
  template <class Collective>
  float* operator()(Collective& local, span<Gradient, memory> gradient, bool ok) {
    std::size_t const slot = parts_.slot, padded = whole_.size();
    float const per_node = static_cast<float>(local.size());
    Gradient* send = !ok         ? whole_.data()
                     : in_place_ ? padded_bucket(space_, gradient, whole_.data(), padded)
                                 : pack(gradient);
    if (bf16_) {
      bfloat16* node_in = narrow_.data() + slot;
      if constexpr (std::is_same_v<Gradient, bfloat16>)
        node_in = send;
      else
        transform(space_, padded, inputs(gradient_stream(send)), outputs(widened<bfloat16>{node_in}), same_value{});
      local.reduce_scatter(node_in, narrow_.data(), slot, reduce_op::sum);
      transform(space_, slot, inputs(widened<bfloat16>{narrow_.data()}), outputs(part_.data()), divide_by{per_node});
    } else {
      float* node_in = widened_.data();
      if constexpr (wide)
        node_in = send;
      else
        transform(space_, padded, inputs(gradient_stream(send)), outputs(node_in), same_value{});
      local.reduce_scatter(node_in, part_.data(), slot, reduce_op::sum);
      transform(space_, slot, inputs(part_.data()), outputs(part_.data()), divide_by{per_node});
    }
    return part_.data();
  }

  /// Each local rank's part of the bucket, and the slot it travels in.
  node_parts const& parts() const { return parts_; }
  /// True when the padded bucket is the slots in order (parts_.in_place()).
  bool in_place() const { return in_place_; }
  /// The padded bucket: the slots of every local rank.
  Gradient* whole() { return whole_.data(); }
  std::size_t padded() const { return whole_.size(); }
  /// Bytes each rank sends into the node's reduce-scatter.
  std::size_t bytes() const { return whole_.size() * (bf16_ ? sizeof(bfloat16) : sizeof(float)); }

  /// The all-gathered slots back into the bucket (runs of tensors).
  void unpack(span<Gradient, memory> gradient) {
    for (std::size_t r = 0; r < parts_.of_rank.size(); ++r) {
      auto const [first, count] = parts_.of_rank[r];
      space_.copy(gradient.data() + first, whole_.data() + r * parts_.slot, count * sizeof(Gradient));
    }
  }

 private:
  // The bucket in slots, for a reduce-scatter whose slots are not where the
  // parts are in the bucket (runs of tensors): each part, then zeros.
  Gradient* pack(span<Gradient, memory> gradient) {
    Gradient* whole = whole_.data();
    for (std::size_t r = 0; r < parts_.of_rank.size(); ++r) {
      auto const [first, count] = parts_.of_rank[r];
      Gradient* slot = whole + r * parts_.slot;
      space_.copy(slot, gradient.data() + first, count * sizeof(Gradient));
      space_.fill_zero(slot + count, (parts_.slot - count) * sizeof(Gradient));
    }
    return whole;
  }

  node_parts parts_;
  bool in_place_;
  Space space_;
  bool bf16_;
  buffer<Gradient, Space> whole_;   // the padded bucket (padding, and the all-gather)
  buffer<float, Space> part_;       // this rank's slot: the node's mean
  buffer<bfloat16, Space> narrow_;  // bf16 within the node: the slot's sum, then the bucket in bf16
  buffer<float, Space> widened_;    // a 16-bit bucket in fp32, for an fp32 reduce-scatter
};

/// The identity of a two-level reducer's checkpoints: the world's size, and
/// this rank's place in it counted node by node.
template <class Collective>
checkpoint_identity two_level_identity(node_groups<Collective> const& g, std::uint64_t fingerprint) {
  return {checkpoint_kind::hierarchical, fingerprint, static_cast<std::uint32_t>(g.nodes() * g.ranks_per_node()),
          static_cast<std::uint32_t>(g.cross.rank() * g.ranks_per_node() + g.local.rank())};
}

/// A two-level reducer's checkpoint: its rail's state, in an envelope that
/// names the world.
inline std::vector<std::byte> wrap_rail_state(checkpoint_identity const& id, std::vector<std::byte> const& rail) {
  checkpoint_writer w(id);
  w.word(rail.size());
  w.raw(rail.data(), rail.size());
  return std::move(w).finish();
}

/// The rail's state inside a two-level checkpoint (checkpoint_error if the
/// envelope does not match `id`).
inline span<std::byte const> unwrap_rail_state(span<std::byte const> bytes, checkpoint_identity const& id) {
  checkpoint_reader r(open(bytes, id));
  auto const rail = r.block("the shard's state");
  r.finish();
  return rail;
}

/// Restores `reducer` (a two-level reducer) from `bytes` on every rank of
/// the world together, or on none (checkpoint_error naming the problem).
template <class Reducer, class Collective, class Space>
void restore_on_every_rank(Reducer& reducer, node_groups<Collective>& g, Space const& space,
                           span<std::byte const> bytes) {
  bucket_checkpoint c;
  std::string failure;
  try {
    c = reducer.parse_checkpoint(bytes);
  } catch (checkpoint_error const& e) {
    failure = e.what();
  }
  expect_restorable(agreement(g.local, g.cross, space, failure.empty() ? c.steps : 0, 0, failure), failure);
  reducer.restore(c);
}

/// Sets a two-level reducer (named `who`) up on every rank of the world
/// together, or on none. First every rank states its bucket size `d` and
/// `fingerprint` (two_level_terms), and sees
/// every other's, before any rail exchanges anything; then `build` runs, and
/// if it throws on any rank (a lane that would overflow), every rank throws
/// invalid_argument naming the first rank that failed.
template <class Collective, class Space, class Build>
void set_up_on_every_rank(node_groups<Collective>& g, Space const& space, std::size_t d, std::uint64_t fingerprint,
                          char const* who, Build&& build) {
  agreement const all(g.local, g.cross, space, d, fingerprint, d == 0 ? "the bucket is empty" : "");
  std::string const name(who);
  if (int const r = all.first_failed(); r >= 0)
    throw invalid_argument(name + ": rank " + std::to_string(r) + " cannot use this configuration: " + all.why(r));
  if (int const r = all.first_other_a(); r >= 0)
    throw invalid_argument(name + ": ranks disagree on the bucket size: rank 0 has " + std::to_string(all.of(0).a) +
                           " elements, rank " + std::to_string(r) + " has " + std::to_string(all.of(r).a));
  if (int const r = all.first_other_b(); r >= 0)
    throw invalid_argument(name + ": rank " + std::to_string(r) +
                           "'s compressor, its parameters, its options or the gradients' type differ from rank 0's");
  std::string failure;
  try {
    build();
  } catch (std::exception const& e) {
    failure = "across " + std::to_string(g.nodes()) + " nodes of " + std::to_string(g.ranks_per_node()) +
              " ranks (lanes sum one value per node): " + e.what();
  }
  expect_none_failed(agreement(g.local, g.cross, space, 0, 0, failure), failure, who, "this configuration");
}

/// How a two-level reducer's buckets are stored, for the ranks' agreement
/// (float: 0, as before 16-bit buckets existed, so that fp32 checkpoints keep
/// their identity).
template <class Gradient>
inline constexpr std::uint64_t gradient_tag = std::is_same_v<Gradient, float>      ? 0
                                              : std::is_same_v<Gradient, bfloat16> ? 1
                                                                                   : 2;

/// What every rank of the world must share to reduce a bucket in two levels:
/// the compressor and its parameters, error feedback, how buckets are stored,
/// the node's precision and the rail's options (a rank of another rail with
/// other options would still exchange with this one inside the node).
template <class ErrorFeedback, class Gradient, class Compressor>
std::uint64_t two_level_terms(Compressor const& compressor, hierarchical_options const& o) {
  std::uint64_t h = hash(ErrorFeedback::name, hash_combine(compressor.fingerprint(), gradient_tag<Gradient>));
  h = hash_combine(h, o.bf16_within_node ? 1 : 0);
  h = hash_combine(h, static_cast<std::uint64_t>(o.reduce.nonfinite));
  h = hash_combine(h, o.reduce.warmup_steps);
  h = hash_combine(h, o.reduce.bucket);
  h = hash_combine(h, o.reduce.seed.has_value() ? 1 : 0);
  return hash_combine(h, o.reduce.seed.value_or(0));
}
}  // namespace detail

/// A bucket reduced in two levels (see the top of this header): the result is
/// the mean over every rank of the world, bitwise identical on every rank.
/// Construction is collective over the world; if any rank cannot use the
/// configuration, every rank throws invalid_argument.
///
/// For compressors whose payload is summed element by element (bf16, fp32,
/// fp16, TopK-Chunked, THC, the QSGDs, GlobalRandK, IntSGD), and for
/// PowerSGD, sharded by whole tensors. Classic TopK, whose pairs do not sum,
/// does not compile. Buckets are stored as `Gradient`: float, bfloat16 or
/// half; error feedback keeps its fp32 residual on the shard either way.
template <class Compressor, class ErrorFeedback, class Collective, class Space = default_space_t<Collective>,
          class Gradient = float>
class hierarchical_allreducer {
  static_assert(detail::shards_in_two_levels<Compressor>,
                "hierarchical_allreducer shards buckets across a node's ranks: the compressor's payload must sum "
                "(classic TopK's pairs do not: run it flat)");
  static_assert(gradient_element<Gradient>, "gradients are stored as float, bfloat16 or half");
  static constexpr bool wide = std::is_same_v<Gradient, float>;

 public:
  using memory = typename Space::memory;  ///< Where gradients live.

  /// The bucket `layout` over `groups` (see split_nodes), in the local
  /// collective's default space. `groups` is borrowed and must outlive the
  /// allreducer.
  hierarchical_allreducer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout,
                          hierarchical_options options = {})
      : hierarchical_allreducer(std::move(compressor), groups, std::move(layout), default_space(groups.local),
                                options) {}

  /// The same, running in `space`.
  hierarchical_allreducer(Compressor compressor, node_groups<Collective>& groups, bucket_layout layout, Space space,
                          hierarchical_options options = {})
      : groups_(&groups), layout_(std::move(layout)), space_(space), options_(options), rail_(groups.cross, groups.local) {
    int const per_node = groups.ranks_per_node();
    std::size_t const d = layout_.size();
    int const first = static_cast<int>(options_.reduce.bucket % static_cast<std::uint64_t>(per_node));
    detail::node_parts parts;
    if constexpr (detail::shards_by_tensors<Compressor>)
      parts = detail::tensor_parts(layout_, per_node, first);
    else
      parts = detail::element_parts(d, per_node, detail::shard_alignment(compressor));
    auto const local_rank = static_cast<std::size_t>(groups.local.rank());
    detail::set_up_on_every_rank(
        groups, space_, d, detail::two_level_terms<ErrorFeedback, Gradient>(compressor, options_),
        "hierarchical_allreducer", [&] {
          allreducer_options o = options_.reduce;
          o.bucket = o.bucket * static_cast<std::uint64_t>(per_node) + local_rank;
          if constexpr (detail::shards_by_tensors<Compressor>)
            inner_.emplace(std::move(compressor), rail_, detail::tensors_within(layout_, parts.of_rank[local_rank]),
                           space_, o);
          else
            inner_.emplace(std::move(compressor), rail_, bucket_layout(parts.slot), space_, o);
          node_.emplace(std::move(parts), space_, options_.bf16_within_node);
          if (!wide) rounded_ = buffer<Gradient, Space>(node_->parts().slot, space_);
        });
  }
  // (Not copied or moved: the rail's reducer keeps the address of rail_.)
  hierarchical_allreducer(hierarchical_allreducer const&) = delete;
  hierarchical_allreducer& operator=(hierarchical_allreducer const&) = delete;

  /// Reduces `gradient` (layout().size() values) in place: on return every
  /// rank holds the mean over all ranks. A step that any rank of the world
  /// found bad commits nothing on any rank (see nonfinite_policy).
  void operator()(span<Gradient, memory> gradient) {
    auto& local = groups_->local;
    std::size_t const d = layout_.size(), padded = node_->padded(), slot = node_->parts().slot;
    bool const ok = gradient.size() == d;
    // A wrong size still takes part in the step (with the old contents), so the
    // rail's agreement fails every rank instead of leaving peers waiting.
    float* part = (*node_)(local, gradient, ok);
    std::size_t const reduced = inner_->layout().size();  // the slot, or this rank's tensors
    try {
      (*inner_)(span<float, memory>(part, ok ? reduced : reduced - 1));  // (refused: every rank fails the step)
    } catch (invalid_argument const&) {
      if (ok) throw;
      throw invalid_argument("hierarchical_allreducer: the gradient has " + std::to_string(gradient.size()) +
                             " elements but the bucket was set up for " + std::to_string(d) +
                             " (every rank skips this step)");
    }
    Gradient* out = node_->in_place() && padded == d ? gradient.data() : node_->whole();
    if constexpr (wide) {
      local.all_gather(part, out, slot);
    } else {
      transform(space_, slot, inputs(part), outputs(detail::gradient_stream(rounded_.data())), detail::same_value{});
      local.all_gather(rounded_.data(), out, slot);
    }
    if (out != gradient.data()) node_->unpack(gradient);
  }

  /// Waits for every step enqueued so far (see allreducer::synchronize).
  void synchronize() { inner_->synchronize(); }
  /// Bytes the last step sent across nodes, per rank (its rail's wire bytes).
  std::size_t wire_bytes() const { return inner_->wire_bytes(); }
  /// Bytes the last step moved inside the node, per rank: the reduce-scatter
  /// and the all-gather.
  std::size_t node_bytes() const { return node_->bytes() + node_->padded() * sizeof(Gradient); }
  /// Steps committed, warm-up included.
  std::uint64_t steps() const { return inner_->steps(); }
  /// True while the next step sends the plain fp32 mean.
  bool warming_up() const { return inner_->warming_up(); }
  /// The bucket.
  bucket_layout const& layout() const { return layout_; }
  /// The elements of each rank's slot in the node's reduce-scatter: the
  /// shard (a multiple of the compressor's block or chunk; the last shards
  /// may cover padding), or for PowerSGD the largest run of whole tensors.
  std::size_t shard_size() const { return node_->parts().slot; }
  /// The compressor and its parameters.
  Compressor const& compressor() const { return inner_->compressor(); }
  /// The elements of the bucket this rank reduces across nodes, with its
  /// rail: its residual's first rail_elements().count values are theirs.
  element_range rail_elements() const {
    return node_->parts().of_rank[static_cast<std::size_t>(groups_->local.rank())];
  }
  /// This rank's shard's error-feedback residual (PowerSGD: of its tensors).
  auto residual() const
    requires ErrorFeedback::enabled
  {
    return inner_->residual();
  }
  /// A hash of the configuration: the rail's, the node's size, the
  /// intra-node precision, the bucket and how it is stored.
  std::uint64_t fingerprint() const {
    std::uint64_t h = detail::hash("hierarchical", inner_->fingerprint());
    h = detail::hash_combine(h, layout_.fingerprint());
    h = detail::hash_combine(h, static_cast<std::uint64_t>(groups_->ranks_per_node()));
    h = detail::hash_combine(h, options_.bf16_within_node ? 1 : 0);
    return wide ? h : detail::hash_combine(h, detail::gradient_tag<Gradient>);
  }

  /// @name Checkpoints: this rank's shard state (see allreducer::save)
  /// @{
  std::vector<std::byte> save() { return detail::wrap_rail_state(identity(), inner_->save()); }
  bucket_checkpoint parse_checkpoint(span<std::byte const> bytes) const {
    return inner_->parse_checkpoint(detail::unwrap_rail_state(bytes, identity()));
  }
  void restore(bucket_checkpoint const& c) { inner_->restore(c); }
  /// Restores what save() wrote, on every rank of the world together, or on
  /// none (checkpoint_error naming the problem).
  void restore(span<std::byte const> bytes) { detail::restore_on_every_rank(*this, *groups_, space_, bytes); }
  /// @}

 private:
  detail::checkpoint_identity identity() const { return detail::two_level_identity(*groups_, fingerprint()); }

  using inner_type = allreducer<Compressor, ErrorFeedback, rail_collective<Collective>,
                                default_aggregator_t<Compressor>, Space>;

  node_groups<Collective>* groups_;
  bucket_layout layout_;
  Space space_;
  hierarchical_options options_;
  rail_collective<Collective> rail_;
  std::optional<inner_type> inner_;
  std::optional<detail::node_reduction<Space, Gradient>> node_;  // the first level, and the padded bucket
  buffer<Gradient, Space> rounded_;  // a 16-bit bucket: the shard's mean, rounded for the all-gather
};

}  // namespace gradcomp
