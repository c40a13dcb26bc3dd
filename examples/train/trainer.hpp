// Data-parallel training of an MLP on Fashion-MNIST, written against
// gradcomp's public API as a user would write it. One call of train_rank
// runs one rank; ranks are threads (local_group) or processes (MPI), each
// backend behind gradcomp::any_collective.
// options.hpp says what a run is told, reducers.hpp how gradients travel,
// checkpoint.hpp what a rank saves.
#pragma once

#include "checkpoint.hpp"
#include "fashion_mnist.hpp"
#include "mlp.hpp"
#include "options.hpp"
#include "reducers.hpp"

#include <gradcomp/collectives/any_collective.hpp>
#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

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

/// Seconds of one step's forward and backward passes on a batch of
/// `o.batch` examples: the median of five after a warm one, the slowest
/// rank's (collective over `comm`).
template <class Collective>
double forward_backward_seconds(Collective& comm, mlp& model, dataset const& train_set, options const& o) {
  std::size_t const batch = std::min(o.batch, train_set.count);
  std::vector<float> gradient(model.layout().size());
  std::vector<double> times;
  for (int s = 0; s < 6; ++s) {
    auto const start = std::chrono::steady_clock::now();
    (void)model.loss_and_gradient(train_set.images.data(), train_set.labels.data(), batch, gradient.data(),
                                  [](std::size_t) {});
    if (s > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  double slowest = times[times.size() / 2];
  comm.all_reduce(&slowest, &slowest, 1, gradcomp::reduce_op::max);
  return slowest;
}

/// Trains one rank of `comm`; every rank must call it with the same options.
/// Gradients travel through the reducer `make` builds (by default over `comm`
/// itself), bucket by bucket as the backward pass produces them; `comm` also
/// carries the few control messages. Returns rank 0's records (other ranks
/// return an empty result).
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

  options planned = o;  // (a reducer of the caller's own plans nothing)
  if (!make && o.automatic() && !o.steps_factor.empty())
    planned.compute_seconds = forward_backward_seconds(comm, model, train_set, o);
  auto reduce = (make ? make : host_reducers(planned, comm))(model.layout());
  // The runs of weights this rank updates; the optimizer's state (momentum,
  // 16-bit gathers' fp32 masters) holds only those, one run after another.
  auto const owned = reduce->owned(d);
  std::size_t state = 0;
  for (auto const& run : owned) state += run.count;

  // This rank's shard: every ranks-th example, reshuffled each epoch.
  std::vector<std::size_t> shard;
  for (std::size_t i = rank; i < train_set.count; i += ranks) shard.push_back(i);
  std::size_t const steps_per_epoch = shard.size() / o.batch;
  std::size_t const total_steps = static_cast<std::size_t>(o.epochs * static_cast<double>(steps_per_epoch));
  std::vector<float> images(o.batch * train_set.pixels), gradient(d), velocity(state, 0.0f);
  std::vector<std::uint8_t> labels(o.batch);
  auto shuffle = [&](std::size_t epoch) {
    std::shuffle(shard.begin(), shard.end(), std::mt19937_64(o.seed * 7919 + epoch * 131 + rank));
  };

  result out;
  double eval_seconds = 0, exposed_seconds = 0, loss_sum = 0, resumed_wall = 0;
  std::size_t loss_count = 0, wire = 0, first_step = 0;
  if (!o.resume.empty()) {  // every rank restores together, or none does
    checkpoint c;
    std::string failure;
    try {
      c = checkpoint::read(checkpoint::file(o.resume, rank), d, state);
    } catch (std::exception const& e) {
      failure = e.what();
    }
    try {
      reduce->restore(c.reducer);  // (an empty state fails on every rank)
    } catch (std::exception const& e) {
      throw std::runtime_error(failure.empty() ? std::string(e.what()) : failure);
    }
    model.params() = std::move(c.weights);  // (16-bit gathers: this rank's masters, rounded below)
    velocity = std::move(c.velocity);
    first_step = c.step, resumed_wall = c.wall_s, loss_sum = c.loss_sum, loss_count = c.loss_count, wire = c.wire;
    for (std::size_t epoch = 0; epoch * steps_per_epoch < first_step; ++epoch) shuffle(epoch);  // the data order so far
  }
  // Weights all-gathered in bf16: this rank updates fp32 masters of its
  // shards, and every rank computes with the weights rounded to bf16.
  std::vector<float> master;
  if (o.shard_optimizer && o.gather_dtype == "bf16") {
    for (auto const& run : owned)
      master.insert(master.end(), model.params().begin() + static_cast<std::ptrdiff_t>(run.first),
                    model.params().begin() + static_cast<std::ptrdiff_t>(run.first + run.count));
    for (float& x : model.params()) x = static_cast<float>(gradcomp::bfloat16(x));
  }
  auto const start = clock::now();
  auto wall = [&] { return resumed_wall + std::chrono::duration<double>(clock::now() - start).count() - eval_seconds; };
  std::int32_t stop = 0;
  for (std::size_t step = first_step; step < total_steps && !stop && (o.max_steps == 0 || step < o.max_steps); ++step) {
    std::size_t const in_epoch = step % steps_per_epoch;
    if (in_epoch == 0) shuffle(step / steps_per_epoch);
    for (std::size_t b = 0; b < o.batch; ++b) {
      std::size_t const example = shard[in_epoch * o.batch + b];
      std::memcpy(images.data() + b * train_set.pixels, train_set.images.data() + example * train_set.pixels,
                  train_set.pixels * sizeof(float));
      labels[b] = train_set.labels[example];
    }
    // Backward: each tensor's gradient goes to its bucket as soon as it is
    // computed; a whole bucket starts reducing while the layers below are
    // differentiated.
    // (exposed: what the training thread spends on reductions, in ready()
    // and finish(); without overlap every reduction runs inside ready().)
    loss_sum += model.loss_and_gradient(images.data(), labels.data(), o.batch, gradient.data(), [&](std::size_t t) {
      auto const before = clock::now();
      reduce->ready(t, gradient.data() + model.layout().tensors()[t].offset);
      exposed_seconds += std::chrono::duration<double>(clock::now() - before).count();
    });
    ++loss_count;
    auto const before = clock::now();
    reduce->finish(gradient.data());  // the rank mean, through the compressor
    exposed_seconds += std::chrono::duration<double>(clock::now() - before).count();
    wire += reduce->wire_bytes();

    auto& w = model.params();
    std::size_t k = 0;             // this weight's place in the optimizer's state
    for (auto const& run : owned)  // (a sharded optimizer: this rank's shards; then every rank's weights)
      for (std::size_t i = run.first; i < run.first + run.count; ++i, ++k) {
        velocity[k] = o.momentum * velocity[k] + gradient[i];
        if (master.empty()) {
          w[i] -= o.lr * velocity[k];
        } else {
          master[k] -= o.lr * velocity[k];
          w[i] = master[k];
        }
      }
    reduce->share(w.data());
    if (o.check_replicas) {
      std::uint64_t const hash = weights_hash(w);
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
        double const now = wall();
        double const acc = accuracy(model, test_set);
        eval_seconds += std::chrono::duration<double>(clock::now() - eval_start).count();
        double const comm_s = reduce->comm_seconds();
        out.records.push_back({step + 1, static_cast<double>(step + 1) / steps_per_epoch, now,
                               std::max(0.0, reduce->reduction_seconds() - comm_s), comm_s, wire, loss_sum / loss_count,
                               acc, exposed_seconds});
        if (acc >= o.target && out.time_to_target < 0) out.time_to_target = now, out.steps_to_target = step + 1;
        stop = (o.stop_at_target && out.time_to_target >= 0) || (o.time_budget > 0 && now >= o.time_budget);
      }
      loss_sum = 0;
      loss_count = 0;
      comm.broadcast(&stop, 1, 0);  // rank 0 decides for everyone
    }
    if (!o.checkpoint.empty() && o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) {
      double now = rank == 0 ? wall() : 0;  // rank 0's clock, as the records
      comm.broadcast(&now, 1, 0);
      checkpoint c{step + 1, now, loss_sum, loss_count, wire, model.params(), velocity, reduce->save()};
      std::size_t k = 0;
      for (auto const& run : master.empty() ? decltype(owned){} : owned) {  // this rank's masters, whole
        std::copy_n(master.data() + k, run.count, c.weights.data() + run.first);
        k += run.count;
      }
      c.write(checkpoint::file(o.checkpoint, rank));
    }
  }
  out.wire_bytes_per_step = reduce->wire_bytes();
  out.weights_hash = weights_hash(model.params());
  if (rank != 0) out.records.clear();
  return out;
}

// Compiled once, over any_collective, in train_rank.cpp: every compressor
// under every reducer is most of the example's build time, so each backend
// (threads, MPI) reaches the trainer through any_collective, and the trainer
// and its tests link that one object rather than compile it again.
extern template result train_rank(gradcomp::any_collective&, options const&, dataset const&, dataset const&,
                                  reducer_factory);

}  // namespace train
