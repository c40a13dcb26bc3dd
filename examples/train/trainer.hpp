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
  bool error_feedback = true;                    ///< Residual error feedback (none when false).
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

/// Calls `make(compressor)` with the compressor `o` names for `ranks` ranks.
template <class Make>
auto with_compressor(options const& o, int ranks, Make&& make) {
  using namespace gradcomp;
  if (o.compressor == "fp32") return make(fp32{});
  if (o.compressor == "fp16") return make(fp16{});
  if (o.compressor == "bf16") return make(bf16{});
  if (o.compressor == "topk")
    return make(topk<gradcomp::bfloat16>{.fraction = o.ratio});  // (cblas.h has a bfloat16 too)
  if (o.compressor == "topkc") return make(topk_chunked<>{.chunk_size = o.chunk, .fraction = o.ratio});
  if (o.compressor == "powersgd") return make(powersgd<>{.rank = o.rank});
  if (o.compressor == "thc") {  // byte lanes while the ranks' summed levels fit in them, else 32-bit lanes
    thc<std::uint8_t> const bytes{.block = o.block, .bits = o.bits};
    if (static_cast<std::uint64_t>(ranks) * bytes.top() <= 255) return make(bytes);
    return make(thc<std::int32_t>{.block = o.block, .bits = o.bits});
  }
  if (o.compressor == "qsgd") {  // int8 lanes while n ranks' codes fit in them, else int32
    qsgd_maxnorm<std::int8_t> const small{.bits = o.bits};
    if (small.bits <= 7 && ranks * small.levels() <= 127) return make(small);
    return make(qsgd_maxnorm<std::int32_t>{.bits = o.bits});
  }
  if (o.compressor == "qsgd-ms") return make(qsgd_multiscale{});
  if (o.compressor == "randk") {  // int8 lanes while n ranks' codes fit in them, else int32
    global_randk<std::int8_t> const small{.k = o.k, .bits = o.bits};
    if (small.bits <= 7 && ranks * small.levels() <= 127) return make(small);
    return make(global_randk<std::int32_t>{.k = o.k, .bits = o.bits});
  }
  if (o.compressor == "intsgd") {
    if (ranks < 128) return make(intsgd<std::int8_t>{});
    return make(intsgd<std::int32_t>{});
  }
  throw std::invalid_argument("unknown compressor '" + o.compressor +
                              "' (fp32, fp16, bf16, topk, topkc, powersgd, thc, qsgd, qsgd-ms, randk, intsgd)");
}

/// A host reducer over `Collective`, timing its collectives.
template <class Compressor, class EF, class Collective>
class host_reducer : public reducer {
 public:
  host_reducer(Compressor c, Collective& comm, gradcomp::bucket_layout const& layout)
      : timed_(comm), reduce_(c, timed_, layout, gradcomp::host_space{.threads = 1}) {}  // the ranks are the threads
  void reduce(float* gradient, std::size_t size) override { reduce_({gradient, size}); }
  std::size_t wire_bytes() const override { return reduce_.wire_bytes(); }
  double comm_seconds() const override { return timed_.seconds(); }

 private:
  timed_collective<Collective> timed_;
  gradcomp::allreducer<Compressor, EF, timed_collective<Collective>, gradcomp::default_aggregator_t<Compressor>,
                       gradcomp::host_space>
      reduce_;
};

/// The host reducer `o` names, over `comm`.
template <class Collective>
reducer_factory host_reducers(options const& o, Collective& comm) {
  return [&o, &comm](gradcomp::bucket_layout const& layout) {
    return with_compressor(o, comm.size(), [&](auto compressor) -> std::unique_ptr<reducer> {
      using C = decltype(compressor);
      if (o.error_feedback)
        return std::make_unique<host_reducer<C, gradcomp::error_feedback::residual, Collective>>(compressor, comm,
                                                                                                 layout);
      return std::make_unique<host_reducer<C, gradcomp::error_feedback::none, Collective>>(compressor, comm, layout);
    });
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
