// Data-parallel training of an MLP on Fashion-MNIST, written against
// gradcomp's public API as a user would write it. One call of train_rank
// runs one rank; ranks are threads (local_group) or processes (MPI).
#pragma once

#include "../common/timed_collective.hpp"
#include "fashion_mnist.hpp"
#include "mlp.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

/// What to train, how, and how gradients travel.
struct options {
  std::string compressor = "bf16";               ///< fp32, fp16, bf16, topk, topkc.
  double ratio = 0.01;                           ///< topk: share of elements; topkc: share of chunks.
  std::size_t chunk = 256;                       ///< topkc: chunk size.
  std::size_t rank = 4;                          ///< powersgd: approximation rank.
  int bits = 4;                                  ///< thc: bits per level (uniform quantizer).
  std::size_t block = 1024;                      ///< thc: rotation block.
  std::size_t k = 10000;                         ///< randk: coordinates sent per step.
  std::optional<bool> error_feedback;            ///< Residual error feedback; unset: the compressor's default.
  std::uint64_t warmup = 0;                      ///< Steps that send the plain fp32 mean first.
  int ranks = 4;                                 ///< In-process ranks (MPI: the world's size).
  std::size_t batch = 64;                        ///< Examples per rank per step.
  float lr = 0.05f;                              ///< SGD learning rate.
  float momentum = 0.9f;                         ///< SGD momentum.
  double epochs = 3;                             ///< Passes over the training set.
  double time_budget = 0;                        ///< Stop after this many training seconds (0: no limit).
  double target = 0.85;                          ///< Test accuracy whose first crossing is the time-to-accuracy.
  bool stop_at_target = false;                   ///< End the run when the target is reached.
  std::uint64_t seed = 1;                        ///< Model initialization and data order.
  std::vector<std::size_t> hidden = {512, 256};  ///< Hidden layer widths.
  std::size_t eval_every = 100;                  ///< Steps between test evaluations.
  std::size_t max_steps = 0;                     ///< Stop after this many steps (0: no limit).
  bool check_replicas = false;  ///< After each step, ranks compare their weights (throws if they differ).

  /// The compressor these options name (throws invalid_argument for an unknown name).
  gradcomp::compressor_spec spec() const {
    gradcomp::compressor_spec s = gradcomp::compressor_spec::parse(compressor);
    if (compressor == "topk" || compressor == "topkc") s.fraction = ratio;
    if (compressor == "topkc") s.chunk = chunk;
    if (compressor == "powersgd") s.rank = rank;
    if (compressor == "thc" || compressor == "qsgd" || compressor == "randk") s.bits = bits;
    if (compressor == "thc") s.block = block;
    if (compressor == "randk") s.k = k;
    s.error_feedback = error_feedback;
    return s;
  }
};

/// One evaluation, as rank 0 saw it.
struct record {
  std::size_t step;        ///< Steps done.
  double epoch;            ///< Epochs done.
  double wall_s;           ///< Training seconds (evaluations excluded).
  double compress_s;       ///< Seconds in the allreducer outside collectives.
  double comm_s;           ///< Seconds in collectives.
  std::size_t wire_bytes;  ///< Bytes put on the wire so far.
  double loss;             ///< Mean training loss since the last evaluation.
  double test_accuracy;    ///< On the 10000 test images.
};

/// A run, as rank 0 saw it.
struct result {
  std::vector<record> records;
  double time_to_target = -1;  ///< Training seconds until test accuracy >= target; -1: not reached.
  std::size_t wire_bytes_per_step = 0;
};

/// An allreducer of any compressor, behind one interface.
class reducer {
 public:
  virtual ~reducer() = default;
  /// gradient <- the mean over ranks, in place (host memory).
  virtual void reduce(float* gradient, std::size_t size) = 0;
  /// Bytes the last step put on the wire.
  virtual std::size_t wire_bytes() const = 0;
  /// Seconds spent in collectives so far (0 where they cannot be told apart
  /// from the compression kernels: NCCL runs both on one stream).
  virtual double comm_seconds() const = 0;
};

/// Makes the reducer for a model's parameter layout.
using reducer_factory = std::function<std::unique_ptr<reducer>(gradcomp::bucket_layout const&)>;

/// A host reducer over `Collective`, timing its collectives.
template <class Collective>
class host_reducer : public reducer {
 public:
  host_reducer(options const& o, Collective& comm, gradcomp::bucket_layout const& layout)
      : timed_(comm),
        reduce_(o.spec(), timed_, layout, gradcomp::host_space{.threads = 1},  // the ranks are the threads
                {.warmup_steps = o.warmup}) {}
  void reduce(float* gradient, std::size_t size) override { reduce_({gradient, size}); }
  std::size_t wire_bytes() const override { return reduce_.wire_bytes(); }
  double comm_seconds() const override { return timed_.seconds(); }

 private:
  timed_collective<Collective> timed_;
  gradcomp::any_allreducer<timed_collective<Collective>, gradcomp::host_space> reduce_;
};

/// The host reducer `o` names, over `comm`.
template <class Collective>
reducer_factory host_reducers(options const& o, Collective& comm) {
  return [&o, &comm](gradcomp::bucket_layout const& layout) -> std::unique_ptr<reducer> {
    return std::make_unique<host_reducer<Collective>>(o, comm, layout);
  };
}

/// Test accuracy of `model`.
inline double accuracy(mlp& model, dataset const& test) {
  std::size_t correct = 0;
  for (std::size_t begin = 0; begin < test.count; begin += 1000) {
    std::size_t const batch = std::min<std::size_t>(1000, test.count - begin);
    auto const predicted = model.predict(test.images.data() + begin * test.pixels, batch);
    for (std::size_t b = 0; b < batch; ++b) correct += predicted[b] == test.labels[begin + b];
  }
  return static_cast<double>(correct) / static_cast<double>(test.count);
}

/// Trains one rank of `comm`; every rank must call it with the same options.
/// Gradients travel through the reducer `make` builds (by default over `comm`
/// itself); `comm` also carries the few control messages. Returns rank 0's
/// records (other ranks return an empty result).
template <class Collective>
result train_rank(Collective& comm, options const& o, dataset const& train_set, dataset const& test_set,
                  reducer_factory make = {}) {
  using clock = std::chrono::steady_clock;
  int const rank = comm.rank(), ranks = comm.size();
  std::vector<std::size_t> sizes{train_set.pixels};
  sizes.insert(sizes.end(), o.hidden.begin(), o.hidden.end());
  sizes.push_back(10);
  mlp model(sizes, o.seed);  // the same weights on every rank
  std::size_t const d = model.layout().size();

  auto reduce = (make ? make : host_reducers(o, comm))(model.layout());

  // This rank's shard: every ranks-th example, reshuffled each epoch.
  std::vector<std::size_t> shard;
  for (std::size_t i = rank; i < train_set.count; i += ranks) shard.push_back(i);
  std::size_t const steps_per_epoch = shard.size() / o.batch;
  std::size_t const total_steps = static_cast<std::size_t>(o.epochs * static_cast<double>(steps_per_epoch));
  std::vector<float> images(o.batch * train_set.pixels), gradient(d), velocity(d, 0.0f);
  std::vector<std::uint8_t> labels(o.batch);

  result out;
  double eval_seconds = 0, reduce_seconds = 0, loss_sum = 0;
  std::size_t loss_count = 0, wire = 0;
  auto const start = clock::now();
  std::int32_t stop = 0;
  for (std::size_t step = 0; step < total_steps && !stop && (o.max_steps == 0 || step < o.max_steps); ++step) {
    std::size_t const in_epoch = step % steps_per_epoch;
    if (in_epoch == 0)
      std::shuffle(shard.begin(), shard.end(), std::mt19937_64(o.seed * 7919 + step / steps_per_epoch * 131 + rank));
    for (std::size_t b = 0; b < o.batch; ++b) {
      std::size_t const example = shard[in_epoch * o.batch + b];
      std::memcpy(images.data() + b * train_set.pixels, train_set.images.data() + example * train_set.pixels,
                  train_set.pixels * sizeof(float));
      labels[b] = train_set.labels[example];
    }
    loss_sum += model.loss_and_gradient(images.data(), labels.data(), o.batch, gradient.data());
    ++loss_count;

    auto const before = clock::now();
    reduce->reduce(gradient.data(), d);  // the rank mean, through the compressor
    reduce_seconds += std::chrono::duration<double>(clock::now() - before).count();
    wire += reduce->wire_bytes();

    auto& w = model.params();
    for (std::size_t i = 0; i < d; ++i) {
      velocity[i] = o.momentum * velocity[i] + gradient[i];
      w[i] -= o.lr * velocity[i];
    }
    if (o.check_replicas) {
      std::uint64_t hash = 0xcbf29ce484222325ull;
      for (float v : w) {
        std::uint32_t bits;
        std::memcpy(&bits, &v, 4);
        hash = (hash ^ bits) * 0x100000001b3ull;
      }
      std::vector<std::uint64_t> all(ranks);
      comm.all_gather(&hash, all.data(), 1);
      for (int r = 1; r < ranks; ++r)
        if (all[r] != all[0])
          throw std::runtime_error("rank " + std::to_string(r) + "'s weights differ from rank 0's after step " +
                                   std::to_string(step + 1));
    }

    bool const last = step + 1 == total_steps || step + 1 == o.max_steps;
    if ((step + 1) % o.eval_every == 0 || last) {
      if (rank == 0) {
        auto const eval_start = clock::now();
        double const acc = accuracy(model, test_set);
        double const wall = std::chrono::duration<double>(eval_start - start).count() - eval_seconds;
        eval_seconds += std::chrono::duration<double>(clock::now() - eval_start).count();
        out.records.push_back({step + 1, static_cast<double>(step + 1) / steps_per_epoch, wall,
                               reduce_seconds - reduce->comm_seconds(), reduce->comm_seconds(), wire,
                               loss_sum / loss_count, acc});
        if (acc >= o.target && out.time_to_target < 0) out.time_to_target = wall;
        stop = (o.stop_at_target && out.time_to_target >= 0) || (o.time_budget > 0 && wall >= o.time_budget);
      }
      loss_sum = 0;
      loss_count = 0;
      comm.broadcast(&stop, 1, 0);  // rank 0 decides for everyone
    }
  }
  out.wire_bytes_per_step = reduce->wire_bytes();
  if (rank != 0) out.records.clear();
  return out;
}

}  // namespace train
