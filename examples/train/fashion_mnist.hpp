// Fashion-MNIST from its IDX files (gzip-compressed, as the Debian package
// dataset-fashion-mnist installs them), read with zlib.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace train {

/// Images as floats (standardized), labels as bytes.
struct dataset {
  std::vector<float> images;         ///< count x pixels, row-major.
  std::vector<std::uint8_t> labels;  ///< count labels in 0..9.
  std::size_t count = 0;             ///< Number of examples.
  std::size_t pixels = 0;            ///< Values per image (28 x 28).
};

/// Where the Debian package puts the files.
inline constexpr char const* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

namespace detail {

inline std::vector<std::uint8_t> read_gzip(std::string const& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr)
    throw std::runtime_error(path +
                             ": cannot open it; Fashion-MNIST comes from the Debian package "
                             "dataset-fashion-mnist (apt-get install dataset-fashion-mnist)");
  std::vector<std::uint8_t> bytes;
  std::uint8_t block[1 << 16];
  int got = 0;
  while ((got = gzread(file, block, sizeof block)) > 0) bytes.insert(bytes.end(), block, block + got);
  int status = Z_OK;
  char const* message = gzerror(file, &status);
  std::string const why = message != nullptr ? message : "";
  gzclose(file);
  if (got < 0 || (status != Z_OK && status != Z_STREAM_END))
    throw std::runtime_error(path + ": not a valid gzip stream (" + why + ")");
  return bytes;
}

inline std::uint32_t big_endian(std::vector<std::uint8_t> const& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) | b[at + 3];
}

// Checks an IDX header (magic 0x000008dd: unsigned bytes, d dimensions) and
// that the payload is exactly as long as the header says.
inline std::vector<std::uint32_t> idx_dims(std::vector<std::uint8_t> const& b, std::string const& path,
                                           std::uint32_t dims) {
  if (b.size() < 4 + 4 * dims || big_endian(b, 0) != 0x800u + dims)
    throw std::runtime_error(path + ": not an IDX file of " + std::to_string(dims) +
                             " dimension(s) of unsigned bytes (bad magic number)");
  std::vector<std::uint32_t> extents(dims);
  std::size_t expected = 4 + 4 * dims;
  std::size_t payload = 1;
  for (std::uint32_t d = 0; d < dims; ++d) payload *= extents[d] = big_endian(b, 4 + 4 * d);
  expected += payload;
  if (b.size() != expected)
    throw std::runtime_error(path + ": " + (b.size() < expected ? "truncated" : "has trailing bytes") +
                             ": its header promises " + std::to_string(expected) + " bytes, the file holds " +
                             std::to_string(b.size()));
  return extents;
}

}  // namespace detail

/// Reads one split from its two IDX files; throws std::runtime_error naming
/// the file for a missing, truncated or corrupt one.
inline dataset load_idx(std::string const& images_path, std::string const& labels_path) {
  auto const image_bytes = detail::read_gzip(images_path);
  auto const label_bytes = detail::read_gzip(labels_path);
  auto const image_dims = detail::idx_dims(image_bytes, images_path, 3);
  auto const label_dims = detail::idx_dims(label_bytes, labels_path, 1);
  if (image_dims[0] != label_dims[0])
    throw std::runtime_error(images_path + " holds " + std::to_string(image_dims[0]) + " images but " + labels_path +
                             " holds " + std::to_string(label_dims[0]) + " labels");
  dataset data;
  data.count = image_dims[0];
  data.pixels = std::size_t{image_dims[1]} * image_dims[2];
  data.labels.assign(label_bytes.begin() + 8, label_bytes.end());
  for (std::uint8_t label : data.labels)
    if (label > 9) throw std::runtime_error(labels_path + ": label " + std::to_string(label) + " is not in 0..9");
  // Standardize with Fashion-MNIST's pixel mean and deviation.
  data.images.resize(data.count * data.pixels);
  for (std::size_t i = 0; i < data.images.size(); ++i)
    data.images[i] = (static_cast<float>(image_bytes[16 + i]) / 255.0f - 0.2860f) / 0.3530f;
  return data;
}

/// The training (60000) or test (10000) split from `dir`.
inline dataset load_fashion_mnist(std::string const& dir, bool train_split) {
  std::string const prefix = dir + (train_split ? "/train" : "/t10k");
  return load_idx(prefix + "-images-idx3-ubyte.gz", prefix + "-labels-idx1-ubyte.gz");
}

}  // namespace train
