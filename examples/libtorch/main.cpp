// gradcomp in a LibTorch training loop: a torch::nn model whose gradient
// hooks hand each parameter's gradient to a model_reducer as autograd
// produces it, finish() before the optimizer, and a checkpoint restored into
// a fresh reducer that continues bitwise. The MLP and data of examples/train;
// ranks are threads of one process here (local_group), and the same code
// runs over torch.distributed's groups with gradcomp::c10d_communicator.
//
//   libtorch_train [compressor spec] [ranks] [steps]
#include <torch/torch.h>
#include <gradcomp/gradcomp.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "../train/fashion_mnist.hpp"

namespace {

using reducer_t = gradcomp::model_reducer<gradcomp::local_group::communicator>;

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

}  // namespace

int main(int argc, char** argv) {
  std::string const spec = argc > 1 ? argv[1] : "topkc:fraction=0.1";
  int const ranks = argc > 2 ? std::atoi(argv[2]) : 2;
  std::size_t const steps = argc > 3 ? std::strtoul(argv[3], nullptr, 10) : 40;
  torch::set_num_threads(1);
  train::dataset const data = train::load_fashion_mnist(train::default_fashion_mnist_dir, true);

  gradcomp::model_reducer_options options;
  options.compressor = gradcomp::compressor_spec::parse(spec);
  options.min_compression_elements = 4096;  // smaller buckets and biases travel as bf16
  options.bucket_cap_bytes = 256 << 10;
  options.first_bucket_cap_bytes = 256 << 10;
  options.reduce.warmup_steps = 2;
  options.overlap = false;  // the ranks are threads on shared cores: reduce inside mark_ready

  std::vector<float> uninterrupted(ranks), resumed(ranks);
  std::vector<int> same(ranks);
  gradcomp::local_group::run(ranks, [&](gradcomp::local_group::communicator& comm) {
    int const rank = comm.rank();
    // The whole run, keeping the reducer's bytes halfway.
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
    // A fresh model, optimizer and reducer resumed from the checkpoint.
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
    reducer_t reducer(shapes_of(b.params), comm, options, gradcomp::host_space{1});
    reducer.restore({saved.data(), saved.size()});  // every rank together
    hook_up(b, reducer);
    for (std::size_t i = steps / 2; i < steps; ++i) step(b, reducer, data, rank, ranks, i);
    auto const pa = a.model->parameters(), pb = b.model->parameters();
    bool equal = true;
    for (std::size_t p = 0; p < pa.size(); ++p) equal = equal && torch::equal(pa[p], pb[p]);
    same[rank] = equal;
    uninterrupted[rank] = pa[0].sum().item<float>();
  });
  bool replicas = true, resumes = true;
  for (int r = 0; r < ranks; ++r) {
    replicas = replicas && uninterrupted[r] == uninterrupted[0];
    resumes = resumes && same[r];
  }
  std::printf("libtorch: %s, %d ranks, %zu steps: replicas %s; resumed at step %zu: %s\n", spec.c_str(), ranks, steps,
              replicas ? "equal" : "DIFFER", steps / 2, resumes ? "bitwise the same weights" : "DIFFERENT weights");
  return replicas && resumes ? 0 : 1;
}
