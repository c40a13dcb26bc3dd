// Does compression pay here? Prints the planner's table for a model's
// buckets on in-process ranks: the network it measured, each candidate's
// local work and predicted communication per bucket, and its choice.
//
//   plan [--ranks N] [--spec auto|auto:of=SPEC+SPEC+...] [--model mlp|transformer|ROWSxCOLS,N,...]
//
// In a real job, call gradcomp::choose_compressors (or plan_compression) with
// your own collective (NCCL, MPI, torch.distributed's groups) and shapes: the
// same table, measured on your network.
#include <gradcomp/gradcomp.hpp>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace {

using shapes = std::vector<std::vector<std::size_t>>;

// The training example's MLP, a transformer-like stack of blocks, or a list
// of shapes ("1024x1024,1024").
shapes model_of(std::string const& name) {
  if (name == "mlp") return {{10}, {10, 256}, {256}, {256, 512}, {512}, {512, 784}};  // backward order
  shapes out;
  if (name == "transformer") {  // 4 blocks of width 1024: attention, MLP, norms
    for (int block = 0; block < 4; ++block)
      for (shapes const& part : {shapes{{1024}, {1024}, {1024, 4096}, {4096}, {4096, 1024}},
                                 shapes{{1024}, {1024}, {1024, 1024}, {3 * 1024, 1024}}})
        out.insert(out.end(), part.begin(), part.end());
    return out;
  }
  std::stringstream list(name);
  for (std::string item; std::getline(list, item, ',');) {
    std::vector<std::size_t> shape;
    std::stringstream dims(item);
    for (std::string d; std::getline(dims, d, 'x');) shape.push_back(std::stoul(d));
    out.push_back(shape);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 4;
  std::string spec = "auto", model = "transformer";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const flag = argv[i];
    if (flag == "--ranks")
      ranks = std::atoi(argv[i + 1]);
    else if (flag == "--spec")
      spec = argv[i + 1];
    else if (flag == "--model")
      model = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: plan [--ranks N] [--spec auto:of=...] [--model mlp|transformer|SHAPES]\n");
      return 2;
    }
  }
  try {
    gradcomp::planner_options options;
    gradcomp::compressor_choice const choice = gradcomp::compressor_choice::parse(spec);
    GRADCOMP_EXPECTS(choice.is_automatic(), "plan: --spec names the planner's candidates: auto or auto:of=...");
    options.candidates = choice.candidates();
    gradcomp::local_group::run(ranks, [&](gradcomp::local_group::communicator& comm) {
      gradcomp::host_space const one{.threads = 1};  // the ranks are the threads
      auto const [chosen, plan] = gradcomp::choose_compressors(comm, model_of(model), {}, one, options);
      if (comm.rank() == 0) {
        std::printf("%s", plan.table().c_str());
        for (std::size_t b = 0; b < chosen.compressors.size(); ++b)
          std::printf("bucket %zu: %s\n", b, chosen.compressors[b].str().c_str());
      }
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
