// The training example as a test: short runs that must learn, keep every
// rank's weights bitwise identical after every step, for every compressor;
// and the data loader's refusals.
#include "../examples/train/trainer.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

extern "C" void openblas_set_num_threads(int);

namespace {

train::dataset const& training_data() {
  static train::dataset const data = train::load_fashion_mnist(train::default_fashion_mnist_dir, true);
  return data;
}
train::dataset const& test_data() {
  static train::dataset const data = train::load_fashion_mnist(train::default_fashion_mnist_dir, false);
  return data;
}

std::vector<std::uint8_t> gunzip(std::string const& path) { return train::detail::read_gzip(path); }

void write_gzip(std::string const& path, std::vector<std::uint8_t> const& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

}  // namespace

TEST_CASE("a short data-parallel run learns and keeps the replicas identical, for every compressor") {
  openblas_set_num_threads(1);
  for (std::string compressor : {"fp32", "fp16", "bf16", "topk", "topkc", "powersgd", "thc"}) {
    for (bool ef : {true, false}) {
      train::options o;
      o.compressor = compressor;
      o.ratio = compressor == "topkc" ? 0.25 : 0.1;
      o.chunk = 64;
      o.error_feedback = ef;
      o.hidden = {64};
      o.batch = 32;
      o.lr = 0.05f;
      o.max_steps = 300;
      o.eval_every = 100;
      o.check_replicas = true;  // throws from train_rank if any rank's weights differ after a step
      train::result r;
      REQUIRE_NOTHROW(gradcomp::local_group::run(4, [&](gradcomp::local_group::communicator& comm) {
        auto mine = train::train_rank(comm, o, training_data(), test_data());
        if (comm.rank() == 0) r = std::move(mine);
      }));
      INFO(compressor << (ef ? " with" : " without") << " error feedback");
      REQUIRE(r.records.size() == 3);
      CHECK(r.records.back().loss < 0.75 * r.records.front().loss);
      CHECK(r.records.back().test_accuracy > 0.6);  // random weights score about 0.1
      CHECK(r.records.back().wire_bytes == 300 * r.wire_bytes_per_step);
    }
  }
}

TEST_CASE("the IDX loader refuses missing, truncated and corrupt files with a clear message") {
  auto const dir = std::filesystem::temp_directory_path() / ("gradcomp_idx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string const real_labels = std::string(train::default_fashion_mnist_dir) + "/t10k-labels-idx1-ubyte.gz";
  std::string const real_images = std::string(train::default_fashion_mnist_dir) + "/t10k-images-idx3-ubyte.gz";

  CHECK_THROWS_WITH(train::load_fashion_mnist((dir / "nowhere").string(), false),
                    doctest::Contains("apt-get install dataset-fashion-mnist"));

  auto labels = gunzip(real_labels);
  labels.resize(labels.size() - 10);  // a valid gzip of a truncated IDX
  write_gzip((dir / "short.gz").string(), labels);
  CHECK_THROWS_WITH(train::load_idx(real_images, (dir / "short.gz").string()), doctest::Contains("truncated"));

  {
    std::ifstream in(real_labels, std::ios::binary);
    std::vector<char> gz((std::istreambuf_iterator<char>(in)), {});
    gz.resize(gz.size() / 2);  // the gzip stream itself cut in half
    std::ofstream((dir / "cut.gz").string(), std::ios::binary).write(gz.data(), static_cast<long>(gz.size()));
  }
  CHECK_THROWS_WITH(train::load_idx(real_images, (dir / "cut.gz").string()), doctest::Contains("not a valid gzip"));

  std::ofstream((dir / "garbage.gz").string()) << "these are not the images you are looking for";
  CHECK_THROWS_WITH(train::load_idx((dir / "garbage.gz").string(), real_labels), doctest::Contains("bad magic"));

  labels = gunzip(real_labels);
  labels[8] = 42;  // a label outside 0..9
  write_gzip((dir / "bad_label.gz").string(), labels);
  CHECK_THROWS_WITH(train::load_idx(real_images, (dir / "bad_label.gz").string()), doctest::Contains("not in 0..9"));

  std::filesystem::remove_all(dir);
}
