// train: data-parallel training of an MLP on Fashion-MNIST through a
// gradcomp compressor, reporting time-to-accuracy.
//
//   train [flags]   (train --help lists them)
//
// local (default): ranks are threads of this process. mpi: run under
// mpiexec, one rank per process. nccl (built with CUDA and NCCL): run under
// mpiexec with one GPU per rank; MPI starts NCCL and carries control
// messages, NCCL the gradients.
#include "cli.hpp"
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
bool report(train::cli const& c, int ranks, train::result const& r) {
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
  train::cli c = [&] {
    try {
      return train::parse_command_line(argc, argv);
    } catch (std::exception const& e) {  // a number that does not read as one
      train::usage(std::string("a flag's value does not read as a number (") + e.what() + ")");
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
        gradcomp::any_collective any(comm);
        auto mine = train::train_rank(any, c.o, train_set, test_set);
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
        gradcomp::any_collective any(comm);
        auto const r = train::train_rank(any, c.o, train_set, test_set);
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
          gradcomp::any_collective any(control);
          auto const r = train::train_rank(any, c.o, train_set, test_set, train::nccl_reducers(c.o, nccl));
          if (control.rank() == 0) trained = report(c, control.size(), r);
        }
        cudaStreamDestroy(stream);
      }
      MPI_Finalize();
      return trained ? 0 : 3;
    }
#endif
    train::usage("unknown or unavailable backend '" + c.backend + "' (local" + (TRAIN_HAS_MPI ? ", mpi" : "") +
                 (TRAIN_HAS_NCCL ? ", nccl)" : ")"));
  } catch (gradcomp::nonfinite_error const& e) {  // the gradients overflowed: the run diverged
    std::cerr << "train: the run diverged: " << e.what() << divergence_hint << '\n';
    return 3;
  } catch (std::exception const& e) {
    std::cerr << "train: " << e.what() << '\n';
    return 1;
  }
}
