// train: data-parallel training of an MLP on Fashion-MNIST through a
// gradcomp compressor, reporting time-to-accuracy.
//
//   train [flags]   (train --help lists them)
//
// local (default): ranks are threads of this process. mpi: run under
// mpiexec, one rank per process. nccl (built with CUDA and NCCL): run under
// mpiexec with one GPU per rank; MPI starts NCCL and carries control
// messages, NCCL the gradients.
#include "trainer.hpp"

#if TRAIN_HAS_MPI
#include <gradcomp/collectives/mpi.hpp>
#endif
#if TRAIN_HAS_NCCL
#include "nccl_reducer.hpp"
#endif

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

struct cli {
  train::options o;
  std::string backend = "local";
  std::string data = train::default_fashion_mnist_dir;
  std::string out;
  int mpi_poll_us = 0;
  bool overlap_auto = true;
};

// Overlap pays where a rank's reductions get a core of their own; where the
// ranks already fill the cores, the reduction thread takes its time from the
// backward pass (measured: 5-9% slower steps with 4 ranks on 2 cores).
bool spare_cores(int ranks_on_this_host) {
  return static_cast<int>(std::thread::hardware_concurrency()) >= 2 * ranks_on_this_host;
}

#if TRAIN_HAS_MPI
// The ranks on this host, as the launcher says (OpenMPI, MPICH), else all.
int ranks_on_this_host(gradcomp::mpi_communicator const& world) {
  for (char const* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (char const* value = std::getenv(name)) return std::atoi(value);
  return world.size();
}
#endif

// The compressor's flags come from the registry: --compressor, then one flag
// per spec key (--fraction, --chunk-size, ...), each naming who takes it.
std::string flag_of(std::string_view key) {
  std::string f = "--" + std::string(key);
  for (char& ch : f)
    if (ch == '_') ch = '-';
  return f;
}

std::string compressor_flags() {
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
  gradcomp::compressor_spec{}.for_each_key([&](char const* key, auto const&) {
    out += row(flag_of(key) + " V", takers(key) + ": the spec's " + key + " (the compressor's default)");
  });
  out +=
      row("--lane auto|int8|int32", takers("lane") + ": the integer lane (auto: the narrowest that cannot overflow)");
  out +=
      row("--ef on|off",
          "residual error feedback (default: the compressor's; off for the unbiased baselines, qsgd and global_randk)");
  out += row("--list-compressors", "print the compressor names, one per line");
  return out;
}

std::string flags() {
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

[[noreturn]] void usage(std::string const& why) {
  std::cerr << "train: " << why << "\n" << flags();
  std::exit(2);
}

// on/off and their usual spellings; anything else is an error, not "on".
bool boolean(std::string const& flag, std::string const& value) {
  for (char const* on : {"on", "true", "1", "yes"})
    if (value == on) return true;
  for (char const* off : {"off", "false", "0", "no"})
    if (value == off) return false;
  usage(flag + " takes on or off, not '" + value + "'");
}

// The spec key a flag sets ("" for other flags).
std::string spec_key_of(std::string const& flag) {
  std::string found;
  gradcomp::compressor_spec{}.for_each_key([&](char const* key, auto const&) {
    if (flag == flag_of(key)) found = key;
  });
  if (flag == "--lane" || flag == "--ef") found = flag.substr(2);
  return found;
}

cli parse(int argc, char** argv) {
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
      auto const candidates = gradcomp::auto_candidates(c.o.compressor);
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

// Why a run diverged, or empty: a loss that is not finite, or test accuracy
// at chance (10 classes) for three evaluations in a row.
std::string divergence(train::result const& r) {
  int at_chance = 0;
  for (auto const& e : r.records) {
    if (!std::isfinite(e.loss)) return "the training loss at step " + std::to_string(e.step) + " is not finite";
    at_chance = e.test_accuracy < 0.15 ? at_chance + 1 : 0;
    if (at_chance == 3)
      return "test accuracy is at chance (" + std::to_string(e.test_accuracy) + ") for three evaluations up to step " +
             std::to_string(e.step);
  }
  return {};
}

constexpr char const* divergence_hint =
    "; a lower --lr, --warmup N or a less aggressive compressor (for topkc a larger --fraction) usually trains";

// Prints the evaluations and the summary; false when the run diverged.
bool report(cli const& c, int ranks, train::result const& r) {
  std::string const name = c.o.automatic() ? c.o.compressor : c.o.spec().str();
  std::printf("%8s %7s %9s %11s %9s %10s %14s %8s %9s\n", "step", "epoch", "wall_s", "compress_s", "comm_s",
              "exposed_s", "wire_bytes", "loss", "test_acc");
  for (auto const& e : r.records)
    std::printf("%8zu %7.2f %9.2f %11.3f %9.3f %10.3f %14zu %8.4f %9.4f\n", e.step, e.epoch, e.wall_s, e.compress_s,
                e.comm_s, e.exposed_s, e.wire_bytes, e.loss, e.test_accuracy);
  if (r.records.empty()) {
    std::printf("summary: no steps left to run\n");
    return true;
  }
  std::string const diverged = divergence(r);
  auto const& last = r.records.back();
  std::string const to_target = r.time_to_target < 0 ? "not-reached" : std::to_string(r.time_to_target);
  std::string const steps_to = r.steps_to_target == 0 ? "not-reached" : std::to_string(r.steps_to_target);
  std::printf(
      "summary: compressor=%s ranks=%d ranks_per_node=%d backend=%s overlap=%s grad_dtype=%s optimizer=%s%s "
      "target=%.3f "
      "time_to_target_s=%s "
      "steps_to_target=%s final_accuracy=%.4f steps=%zu wire_bytes_per_step=%zu compress_share=%.3f "
      "exposed_share=%.3f weights=%016llx status=%s\n",
      name.c_str(), ranks, c.o.ranks_per_node, c.backend.c_str(), c.o.overlap ? "on" : "off", c.o.grad_dtype.c_str(),
      c.o.shard_optimizer ? "sharded" : "replicated", c.o.gather_dtype == "bf16" ? "~bf16" : "", c.o.target,
      to_target.c_str(), steps_to.c_str(), last.test_accuracy, last.step, r.wire_bytes_per_step,
      last.wall_s > 0 ? last.compress_s / last.wall_s : 0.0, last.wall_s > 0 ? last.exposed_s / last.wall_s : 0.0,
      static_cast<unsigned long long>(r.weights_hash), diverged.empty() ? "trained" : "diverged");
  if (!c.out.empty()) {
    std::ofstream csv(c.out);
    csv << "compressor,ranks,step,epoch,wall_s,compress_s,comm_s,exposed_s,wire_bytes,loss,test_acc\n";
    for (auto const& e : r.records)
      csv << '"' << name << '"' << ',' << ranks << ',' << e.step << ',' << e.epoch << ',' << e.wall_s << ','
          << e.compress_s << ',' << e.comm_s << ',' << e.exposed_s << ',' << e.wire_bytes << ',' << e.loss << ','
          << e.test_accuracy << '\n';
  }
  if (!diverged.empty()) std::fprintf(stderr, "train: the run diverged: %s%s\n", diverged.c_str(), divergence_hint);
  return diverged.empty();
}

// OpenBLAS names the CPU by its model; a model newer than the library gets
// the generic SSE3 kernels, and an MLP step takes 2.4x as long (one rank on
// an Emerald Rapids Xeon under Debian 12's OpenBLAS 0.3.21). Said once, by
// the first rank, with the fix.
void warn_on_generic_blas() {
  char const* const rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (rank && std::string(rank) != "0") return;
  if (std::string(openblas_get_corename()) != "Prescott" || std::getenv("OPENBLAS_CORETYPE")) return;
  char const* const kernels = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                              : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                                : nullptr;
  if (kernels)
    std::cerr << "train: OpenBLAS does not know this CPU and runs its generic SSE3 kernels; "
              << "OPENBLAS_CORETYPE=" << kernels << " selects the ones for its vector units\n";
}

}  // namespace

int main(int argc, char** argv) {
  cli c = [&] {
    try {
      return parse(argc, argv);
    } catch (std::exception const& e) {  // a number that does not read as one
      usage(std::string("a flag's value does not read as a number (") + e.what() + ")");
    }
  }();
  openblas_set_num_threads(1);  // one core per rank; the ranks are the parallelism
  warn_on_generic_blas();
  try {
    train::dataset const train_set = train::load_fashion_mnist(c.data, true);
    train::dataset const test_set = train::load_fashion_mnist(c.data, false);
    if (c.backend == "local") {
      if (c.overlap_auto) c.o.overlap = spare_cores(c.o.ranks);
      train::result r;
      gradcomp::local_group::run(c.o.ranks, [&](gradcomp::local_group::communicator& comm) {
        auto mine = train::train_rank(comm, c.o, train_set, test_set);
        if (comm.rank() == 0) r = std::move(mine);
      });
      return report(c, c.o.ranks, r) ? 0 : 3;
    }
#if TRAIN_HAS_MPI
    if (c.backend == "mpi") {
      int provided = 0;  // the reducer's progress thread calls MPI while this one computes
      MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
      if (provided < MPI_THREAD_SERIALIZED) {
        std::cerr << "train: this MPI does not allow calls from a second thread; running with --overlap off\n";
        c.o.overlap = false;
        c.overlap_auto = false;
      }
      int rank = 0;
      bool trained = true;
      {
        gradcomp::mpi_communicator comm(MPI_COMM_WORLD);
        comm.set_poll_interval(std::chrono::microseconds(c.mpi_poll_us));
        rank = comm.rank();
        if (c.overlap_auto && provided >= MPI_THREAD_SERIALIZED) c.o.overlap = spare_cores(ranks_on_this_host(comm));
        auto const r = train::train_rank(comm, c.o, train_set, test_set);
        if (rank == 0) trained = report(c, comm.size(), r);
      }
      MPI_Finalize();
      return trained ? 0 : 3;
    }
#endif
#if TRAIN_HAS_NCCL
    if (c.backend == "nccl") {
      MPI_Init(&argc, &argv);
      bool trained = true;
      {
        gradcomp::mpi_communicator control(MPI_COMM_WORLD);
        int devices = 0;
        GRADCOMP_CUDA_TRY(cudaGetDeviceCount(&devices));
        GRADCOMP_CUDA_TRY(cudaSetDevice(control.rank() % devices));
        ncclUniqueId id{};
        if (control.rank() == 0) ncclGetUniqueId(&id);
        control.broadcast(reinterpret_cast<std::uint8_t*>(&id), sizeof id, 0);
        cudaStream_t stream = nullptr;
        GRADCOMP_CUDA_TRY(cudaStreamCreate(&stream));
        {
          auto nccl = gradcomp::nccl_communicator::create(id, control.size(), control.rank(), stream);
          auto const r = train::train_rank(control, c.o, train_set, test_set, train::nccl_reducers(c.o, nccl));
          if (control.rank() == 0) trained = report(c, control.size(), r);
        }
        cudaStreamDestroy(stream);
      }
      MPI_Finalize();
      return trained ? 0 : 3;
    }
#endif
    usage("unknown or unavailable backend '" + c.backend + "' (local" + (TRAIN_HAS_MPI ? ", mpi" : "") +
          (TRAIN_HAS_NCCL ? ", nccl)" : ")"));
  } catch (gradcomp::nonfinite_error const& e) {  // the gradients overflowed: the run diverged
    std::cerr << "train: the run diverged: " << e.what() << divergence_hint << '\n';
    return 3;
  } catch (std::exception const& e) {
    std::cerr << "train: " << e.what() << '\n';
    return 1;
  }
}
