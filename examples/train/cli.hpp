// The training example's command line: its flags (the compressor's from the
// registry: --compressor, then one flag per spec key, each naming who takes
// it), its help, and their parsing into train::options and the rest of a run.
#pragma once

#include "fashion_mnist.hpp"
#include "options.hpp"

#include <gradcomp/gradcomp.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace train {

/// A run as the command line describes it: the training options, the
/// backend that starts the ranks, where data and results are.
struct cli {
  train::options o;
  std::string backend = "local";
  std::string data = train::default_fashion_mnist_dir;
  std::string out;
  int mpi_poll_us = 0;
  bool overlap_auto = true;
};

// The compressor's flags come from the registry: --compressor, then one flag
// per spec key (--fraction, --chunk-size, ...), each naming who takes it.
inline std::string flag_of(std::string_view key) {
  std::string f = "--" + std::string(key);
  for (char& ch : f)
    if (ch == '_') ch = '-';
  return f;
}

inline std::string compressor_flags() {
  auto row = [](std::string left, std::string const& right) {
    left.resize(std::max<std::size_t>(left.size() + 1, 21), ' ');
    return "  " + left + right + "\n";
  };
  std::string out =
      row("--compressor SPEC", "NAME or NAME:key=value,... (bf16): " + gradcomp::compressor_spec::names()) +
      row("", "or auto, auto:of=SPEC+SPEC+...: the planner chooses per bucket (bf16+topkc+powersgd)") +
      row("--steps-factor SPEC=F",
          "auto: SPEC needs F times bf16's steps to the target (repeatable); the planner then ranks by time to "
          "target, the step's forward and backward passes timed at the start");
  auto takers = [](std::string_view key) {
    std::string who;
    gradcomp::for_each_registered([&]<class C>(std::type_identity<C>) {
      if (gradcomp::compressor_spec::takes(C::name, key)) who.append(who.empty() ? "" : ", ").append(C::name);
    });
    return who;
  };
  for (std::string const& key : gradcomp::compressor_spec::keys())
    if (key != "lane" && key != "ef")
      out += row(flag_of(key) + " V", takers(key) + ": the spec's " + key + " (the compressor's default)");
  out +=
      row("--lane auto|int8|int32", takers("lane") + ": the integer lane (auto: the narrowest that cannot overflow)");
  out +=
      row("--ef on|off",
          "residual error feedback (default: the compressor's; off for the unbiased baselines, qsgd and global_randk)");
  out += row("--list-compressors", "print the compressor names, one per line");
  out += "compressors' keys:\n";  // each compressor's parameters, as it declares them
  gradcomp::for_each_registered([&]<class C>(std::type_identity<C>) {
    gradcomp::for_each_parameter<C>([&](auto const& p) {
      out += row(std::string(C::name) + " " + std::string(p.key),
                 std::string(p.meaning) + " (" + std::string(p.range) + ")");
    });
  });
  return out;
}

inline std::string flags() {
  return "usage: train [flags]\n" + compressor_flags() +
         R"(  --warmup N           first N steps send the plain fp32 mean (0)
  --overlap on|off|auto  reduce each bucket while the backward pass goes on (auto, the default: on where this
                       host has a spare core per rank for the reductions; local and mpi backends)
  --grad-dtype T       how gradients are stored and reduced: fp32 (default) or bf16 (local and mpi)
  --bucket-kb N        bucket cap in KiB, as DDP's bucket_cap_mb (256; the default model is about 2 MB)
  --min-compress N     buckets of fewer elements, and biases, travel as bf16 (4096)
  --ranks-per-node N   hierarchical: nodes of N consecutive ranks, compressed across nodes only (0: flat)
  --node-dtype T       hierarchical: reduce-scatter inside the node in fp32 (default) or bf16
  --shard-optimizer    sharded optimizer (ZeRO-2): each bucket is reduce-scattered, each rank updates its shard
                       of the weights and momentum, then the ranks all-gather the weights (local and mpi; not
                       powersgd or topk, whose payloads cannot be cut into shards)
  --gather-dtype T     sharded: all-gather the weights in fp32 (default) or bf16 (each rank updates fp32 masters
                       of its shard and computes with the bf16 weights, as FSDP's mixed precision)
  --checkpoint PATH    save the run (weights, momentum, reducer state) to PATH.rank<r> ...
  --checkpoint-every N ... every N steps
  --resume PATH        continue the run saved at PATH (same flags otherwise)
  --backend NAME       local (threads, default), mpi (under mpiexec), nccl (under mpiexec, one GPU per rank)
  --ranks N            local: ranks (4)
  --mpi-poll-us N      mpi: wait for collectives by testing every N microseconds and sleeping (0: MPI's spin)
  --batch N            examples per rank per step (64)
  --lr F               SGD learning rate (0.05)
  --momentum F         SGD momentum (0.9)
  --epochs F           passes over the training set (3)
  --max-steps N        stop after N steps (0: no limit)
  --time-budget S      stop after S training seconds (0: no limit)
  --target F           test accuracy whose first crossing is the time-to-accuracy (0.85)
  --stop-at-target     end the run when the target is reached
  --seed N             model initialization and data order (1)
  --hidden A,B,...     hidden layer widths (512,256)
  --eval-every N       steps between test evaluations (100)
  --data DIR           Fashion-MNIST's directory (the Debian package's)
  --out FILE.csv       write the evaluations as CSV
  --help               this list
)";
}

[[noreturn]] inline void usage(std::string const& why) {
  std::cerr << "train: " << why << "\n" << flags();
  std::exit(2);
}

// on/off and their usual spellings; anything else is an error, not "on".
inline bool boolean(std::string const& flag, std::string const& value) {
  for (char const* on : {"on", "true", "1", "yes"})
    if (value == on) return true;
  for (char const* off : {"off", "false", "0", "no"})
    if (value == off) return false;
  usage(flag + " takes on or off, not '" + value + "'");
}

// The spec key a flag sets ("" for other flags).
inline std::string spec_key_of(std::string const& flag) {
  for (std::string const& key : gradcomp::compressor_spec::keys())
    if (flag == flag_of(key)) return key;
  return "";
}

inline cli parse_command_line(int argc, char** argv) {
  cli c;
  std::vector<std::pair<std::string, std::string>> spec_flags;  // applied once --compressor is known
  for (int i = 1; i < argc; ++i) {
    std::string const flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(flag + " needs a value");
      return argv[++i];
    };
    if (flag == "--compressor")
      c.o.compressor = value();
    else if (std::string const key = spec_key_of(flag); !key.empty())
      spec_flags.emplace_back(key, value());
    else if (flag == "--steps-factor") {
      std::string const v = value();
      std::size_t const eq = v.rfind('=');
      if (eq == std::string::npos || eq == 0) usage("--steps-factor takes SPEC=F, not '" + v + "'");
      try {
        std::size_t used = 0;
        double const factor = std::stod(v.substr(eq + 1), &used);
        if (used != v.size() - eq - 1 || !(factor > 0) || !std::isfinite(factor))
          throw std::invalid_argument("not a positive number");
        c.o.steps_factor[gradcomp::compressor_spec::parse(v.substr(0, eq)).str()] = factor;
      } catch (gradcomp::invalid_argument const& e) {
        usage("--steps-factor: " + std::string(e.what()));
      } catch (std::exception const&) {
        usage("--steps-factor: '" + v.substr(eq + 1) + "' is not a positive number");
      }
    } else if (flag == "--list-compressors") {
      gradcomp::for_each_registered([]<class C>(std::type_identity<C>) { std::cout << C::name << "\n"; });
      std::exit(0);
    } else if (flag == "--warmup")
      c.o.warmup = std::stoull(value());
    else if (flag == "--overlap") {
      std::string const v = value();
      c.overlap_auto = v == "auto";
      if (!c.overlap_auto) c.o.overlap = boolean(flag, v);
    } else if (flag == "--grad-dtype") {
      c.o.grad_dtype = value();
      if (c.o.grad_dtype != "fp32" && c.o.grad_dtype != "bf16")
        usage("--grad-dtype takes fp32 or bf16, not '" + c.o.grad_dtype + "'");
    } else if (flag == "--bucket-kb")
      c.o.bucket_kb = std::stoul(value());
    else if (flag == "--min-compress")
      c.o.min_compression = std::stoul(value());
    else if (flag == "--ranks-per-node")
      c.o.ranks_per_node = std::stoi(value());
    else if (flag == "--node-dtype") {
      std::string const t = value();
      if (t != "fp32" && t != "bf16") usage("--node-dtype takes fp32 or bf16, not '" + t + "'");
      c.o.bf16_within_node = t == "bf16";
    } else if (flag == "--shard-optimizer")
      c.o.shard_optimizer = true;
    else if (flag == "--gather-dtype") {
      c.o.gather_dtype = value();
      if (c.o.gather_dtype != "fp32" && c.o.gather_dtype != "bf16")
        usage("--gather-dtype takes fp32 or bf16, not '" + c.o.gather_dtype + "'");
    } else if (flag == "--checkpoint")
      c.o.checkpoint = value();
    else if (flag == "--checkpoint-every")
      c.o.checkpoint_every = std::stoul(value());
    else if (flag == "--resume")
      c.o.resume = value();
    else if (flag == "--help") {
      std::cout << flags();
      std::exit(0);
    } else if (flag == "--backend")
      c.backend = value();
    else if (flag == "--ranks")
      c.o.ranks = std::stoi(value());
    else if (flag == "--mpi-poll-us")
      c.mpi_poll_us = std::stoi(value());
    else if (flag == "--batch")
      c.o.batch = std::stoul(value());
    else if (flag == "--lr")
      c.o.lr = std::stof(value());
    else if (flag == "--momentum")
      c.o.momentum = std::stof(value());
    else if (flag == "--epochs")
      c.o.epochs = std::stod(value());
    else if (flag == "--time-budget")
      c.o.time_budget = std::stod(value());
    else if (flag == "--target")
      c.o.target = std::stod(value());
    else if (flag == "--stop-at-target")
      c.o.stop_at_target = true;
    else if (flag == "--seed")
      c.o.seed = std::stoull(value());
    else if (flag == "--eval-every")
      c.o.eval_every = std::stoul(value());
    else if (flag == "--max-steps")
      c.o.max_steps = std::stoul(value());
    else if (flag == "--data")
      c.data = value();
    else if (flag == "--out")
      c.out = value();
    else if (flag == "--hidden") {
      c.o.hidden.clear();
      std::stringstream list(value());
      for (std::string width; std::getline(list, width, ',');) c.o.hidden.push_back(std::stoul(width));
    } else
      usage("unknown flag " + flag);
  }
  try {
    if (c.o.automatic()) {  // the planner chooses among these at the start (host reductions)
      if (!spec_flags.empty()) usage("--compressor auto takes its candidates' parameters in its spec");
      auto const candidates = c.o.choice().candidates();
      for (auto const& factor : c.o.steps_factor)  // (not a binding: clang 14 lambdas cannot capture those)
        if (std::none_of(candidates.begin(), candidates.end(), [&](auto const& s) { return s.str() == factor.first; }))
          usage("--steps-factor names " + factor.first + ", which is not one of the candidates of " + c.o.compressor);
      if (c.backend == "nccl") usage("--compressor auto plans reductions on the host: not with --backend nccl");
    } else {
      gradcomp::compressor_spec spec = c.o.spec();
      for (auto const& [key, value] : spec_flags) spec.set(key, value);
      c.o.compressor = spec.str();
    }
  } catch (gradcomp::invalid_argument const& e) {
    usage(e.what());
  }
  if (!c.o.steps_factor.empty() && !c.o.automatic()) usage("--steps-factor is for --compressor auto");
  if (c.o.checkpoint_every > 0 && c.o.checkpoint.empty()) usage("--checkpoint-every needs --checkpoint PATH");
  if (!c.o.checkpoint.empty() && c.o.checkpoint_every == 0) usage("--checkpoint needs --checkpoint-every N");
  if (c.o.bucket_kb == 0) usage("--bucket-kb must be at least 1");
  if (c.o.shard_optimizer && c.backend == "nccl") usage("--shard-optimizer runs on the local and mpi backends");
  if (!c.o.shard_optimizer && c.o.gather_dtype != "fp32") usage("--gather-dtype needs --shard-optimizer");
  return c;
}

}  // namespace train
