// gradcomp in a LibTorch training loop: ranks are processes joined by a
// c10d::ProcessGroupGloo, the group a C++ PyTorch program makes itself; a
// torch::nn model's gradient hooks hand each parameter's gradient to a
// model_reducer over that group (gradcomp::c10d_communicator) as autograd
// produces it; finish() comes before the optimizer; and a checkpoint
// restored into a fresh reducer continues bitwise. The MLP and data of
// examples/train.
//
//   libtorch_train [compressor spec] [ranks] [steps]
//
// Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set), this
// process is one rank and the ranks meet at a TCPStore; otherwise it forks
// `ranks` processes, which meet at a FileStore.
#include <torch/torch.h>
#include <gradcomp/collectives/c10d.hpp>
#include <gradcomp/gradcomp.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "../train/fashion_mnist.hpp"

namespace {

using reducer_t = gradcomp::model_reducer<gradcomp::c10d_communicator>;

// A process group whose CPU backend is gloo, over `store`.
c10::intrusive_ptr<c10d::ProcessGroup> gloo_group(c10::intrusive_ptr<c10d::Store> const& store, int rank, int ranks) {
  auto options = c10d::ProcessGroupGloo::Options::create();
  options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, ranks, options);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, ranks);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  return group;
}

// The bits of every weight, hashed (replicas must agree on every one).
std::int64_t weights_hash(torch::nn::Sequential& model) {
  std::uint64_t h = 1469598103934665603ull;
  for (auto const& p : model->parameters()) {
    auto const t = p.detach().contiguous();
    auto const* bytes = static_cast<unsigned char const*>(t.data_ptr());
    for (std::size_t i = 0; i < t.numel() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return static_cast<std::int64_t>(h);
}

torch::nn::Sequential make_model() {
  torch::manual_seed(1);  // every rank starts from the same weights
  return torch::nn::Sequential(torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 256),
                               torch::nn::ReLU(), torch::nn::Linear(256, 10));
}

// The parameters in the order the backward pass produces their gradients:
// the last layer's first.
std::vector<torch::Tensor> backward_order(torch::nn::Sequential& model) {
  auto params = model->parameters();
  return {params.rbegin(), params.rend()};
}

struct rank_state {
  torch::nn::Sequential model = make_model();
  std::vector<torch::Tensor> params = backward_order(model);
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9)};
};

std::vector<reducer_t::shape> shapes_of(std::vector<torch::Tensor> const& params) {
  std::vector<reducer_t::shape> out;
  for (auto const& p : params) out.emplace_back(p.sizes().begin(), p.sizes().end());
  return out;
}

// One step: autograd's hooks copy each gradient into the reducer's buffer
// and mark it ready (a whole bucket starts reducing at once); finish() waits
// for the means, which become the gradients the optimizer reads.
float step(rank_state& s, reducer_t& reducer, train::dataset const& data, int rank, int ranks, std::size_t i) {
  std::size_t const batch = 64;
  std::vector<std::int64_t> rows(batch), labels(batch);
  for (std::size_t b = 0; b < batch; ++b) {
    rows[b] = static_cast<std::int64_t>(((i * ranks + rank) * batch + b) % data.count);
    labels[b] = data.labels[rows[b]];
  }
  auto const images =
      torch::from_blob(const_cast<float*>(data.images.data()), {static_cast<std::int64_t>(data.count), 784})
          .index_select(0, torch::tensor(rows));
  s.optimizer.zero_grad();
  auto loss = torch::nn::functional::cross_entropy(s.model->forward(images), torch::tensor(labels));
  loss.backward();
  reducer.finish();
  for (std::size_t p = 0; p < s.params.size(); ++p) {
    auto const mean = reducer.gradient(p);
    std::memcpy(s.params[p].mutable_grad().data_ptr<float>(), mean.data(), mean.size() * sizeof(float));
  }
  s.optimizer.step();
  return loss.item<float>();
}

// Parameter p's hook: its gradient goes to the reducer the moment autograd
// has it (the gradient itself is left for the optimizer to be overwritten).
void hook_up(rank_state& s, reducer_t& reducer) {
  for (std::size_t p = 0; p < s.params.size(); ++p)
    s.params[p].register_hook([&reducer, p](torch::Tensor const& grad) {
      auto target = reducer.gradient(p);
      std::memcpy(target.data(), grad.contiguous().data_ptr<float>(), target.size() * sizeof(float));
      reducer.mark_ready(p);
    });
}

// One rank's run: the whole run, keeping a checkpoint halfway, then a fresh
// model, optimizer and reducer resumed from it. True where every rank ends
// with the same weights and every rank's resumed run with its whole run's.
bool run_rank(gradcomp::c10d_communicator& comm, std::string const& spec, std::size_t steps) {
  int const rank = comm.rank(), ranks = comm.size();
  torch::set_num_threads(1);
  train::dataset const data = train::load_fashion_mnist(train::default_fashion_mnist_dir, true);

  gradcomp::model_reducer_options options;
  options.compressor = gradcomp::compressor_spec::parse(spec);
  options.min_compression_elements = 4096;  // smaller buckets and biases travel as bf16
  options.bucket_cap_bytes = 256 << 10;
  options.first_bucket_cap_bytes = 256 << 10;
  options.reduce.warmup_steps = 2;

  rank_state a;
  std::vector<std::byte> saved;
  std::vector<torch::Tensor> weights;
  std::string optimizer_state;
  {
    reducer_t reducer(shapes_of(a.params), comm, options, gradcomp::host_space{1});
    hook_up(a, reducer);
    for (std::size_t i = 0; i < steps; ++i) {
      float const loss = step(a, reducer, data, rank, ranks, i);
      if (rank == 0 && (i + 1) % 10 == 0) std::printf("step %zu loss %.4f\n", i + 1, loss);
      if (i + 1 == steps / 2) {  // a checkpoint: weights, optimizer, the reducer's bytes
        saved = reducer.save();
        for (auto const& p : a.model->parameters()) weights.push_back(p.detach().clone());
        std::ostringstream out;
        torch::serialize::OutputArchive archive;
        a.optimizer.save(archive);
        archive.save_to(out);
        optimizer_state = out.str();
      }
    }
  }
  rank_state b;
  {
    torch::NoGradGuard no_grad;
    auto params = b.model->parameters();
    for (std::size_t p = 0; p < params.size(); ++p) params[p].copy_(weights[p]);
  }
  std::istringstream in(optimizer_state);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  b.optimizer.load(archive);
  {
    reducer_t reducer(shapes_of(b.params), comm, options, gradcomp::host_space{1});
    reducer.restore({saved.data(), saved.size()});  // every rank together
    hook_up(b, reducer);
    for (std::size_t i = steps / 2; i < steps; ++i) step(b, reducer, data, rank, ranks, i);
  }
  auto const pa = a.model->parameters(), pb = b.model->parameters();
  std::int64_t resumed = 1;
  for (std::size_t p = 0; p < pa.size(); ++p) resumed = resumed && torch::equal(pa[p], pb[p]);
  std::int64_t const hash = weights_hash(a.model);
  std::int64_t highest = 0, lowest = 0, all_resumed = 0;
  comm.all_reduce(&hash, &highest, 1, gradcomp::reduce_op::max);
  comm.all_reduce(&hash, &lowest, 1, gradcomp::reduce_op::min);
  comm.all_reduce(&resumed, &all_resumed, 1, gradcomp::reduce_op::min);
  bool const replicas = highest == lowest, resumes = all_resumed == 1;
  if (rank == 0)
    std::printf("libtorch: %s, %d ranks, %zu steps: replicas %s; resumed at step %zu: %s\n", spec.c_str(), ranks, steps,
                replicas ? "equal" : "DIFFER", steps / 2, resumes ? "bitwise the same weights" : "DIFFERENT weights");
  return replicas && resumes;
}

}  // namespace

int main(int argc, char** argv) {
  std::string const spec = argc > 1 ? argv[1] : "topkc:fraction=0.1";
  std::size_t const steps = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 40;
  if (char const* rank = std::getenv("RANK"); rank != nullptr && std::getenv("MASTER_ADDR") != nullptr) {
    int const r = std::atoi(rank), ranks = std::atoi(std::getenv("WORLD_SIZE"));
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
    store_options.isServer = r == 0;
    store_options.numWorkers = ranks;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), store_options);
    gradcomp::c10d_communicator comm(gloo_group(store, r, ranks));
    return run_rank(comm, spec, steps) ? 0 : 1;
  }
  int const ranks = argc > 2 ? std::atoi(argv[2]) : 2;
  auto const store_path =
      std::filesystem::temp_directory_path() / ("gradcomp-libtorch-" + std::to_string(getpid()) + ".store");
  std::vector<pid_t> children;
  for (int r = 1; r < ranks; ++r) {  // ranks 1.. are children; this process is rank 0
    pid_t const pid = fork();
    if (pid == 0) {
      gradcomp::c10d_communicator comm(gloo_group(c10::make_intrusive<c10d::FileStore>(store_path, ranks), r, ranks));
      std::_Exit(run_rank(comm, spec, steps) ? 0 : 1);
    }
    children.push_back(pid);
  }
  bool ok = false;
  {
    gradcomp::c10d_communicator comm(gloo_group(c10::make_intrusive<c10d::FileStore>(store_path, ranks), 0, ranks));
    ok = run_rank(comm, spec, steps);
  }
  for (pid_t pid : children) {
    int status = 0;
    ok = waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok;
  }
  std::filesystem::remove(store_path);
  return ok ? 0 : 1;
}
