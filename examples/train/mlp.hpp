// A multi-layer perceptron with ReLU and softmax cross-entropy, its
// parameters in one flat buffer (so its gradient is one gradcomp bucket),
// its math on the host through CBLAS.
#pragma once

#include <gradcomp/bucket_layout.hpp>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace train {

/// Layer sizes, e.g. {784, 512, 256, 10}; weights of layer l are
/// [sizes[l + 1] x sizes[l]], biases [sizes[l + 1]].
class mlp {
 public:
  /// Parameters drawn from `seed` (He-uniform weights, zero biases): every
  /// rank that uses the same seed starts from the same model.
  mlp(std::vector<std::size_t> sizes, std::uint64_t seed) : sizes_(std::move(sizes)) {
    for (std::size_t l = 0; l + 1 < sizes_.size(); ++l) layout_.add({sizes_[l + 1], sizes_[l]}).add({sizes_[l + 1]});
    params_.assign(layout_.size(), 0.0f);
    std::mt19937_64 rng(seed);
    for (std::size_t l = 0; l + 1 < sizes_.size(); ++l) {
      float const bound = std::sqrt(6.0f / static_cast<float>(sizes_[l]));
      std::uniform_real_distribution<float> uniform(-bound, bound);
      auto const& w = layout_.tensors()[2 * l];
      for (std::size_t i = 0; i < w.numel(); ++i) params_[w.offset + i] = uniform(rng);
    }
  }

  /// The shapes of the parameters, packed as in params().
  gradcomp::bucket_layout const& layout() const { return layout_; }
  /// All parameters, flat.
  std::vector<float>& params() { return params_; }
  std::vector<float> const& params() const { return params_; }

  /// Mean cross-entropy of a batch; writes d loss / d params (mean over the
  /// batch) into `gradient` (layout().size() values), last layer first, and
  /// calls ready(t) as soon as tensor t's gradient is written (a backward
  /// hook: its reduction can start while the layers below are differentiated).
  float loss_and_gradient(float const* images, std::uint8_t const* labels, std::size_t batch, float* gradient,
                          std::function<void(std::size_t)> const& ready = {}) {
    forward(images, batch);
    std::size_t const layers = sizes_.size() - 1, classes = sizes_.back();
    // d loss / d logits = (softmax - one-hot) / batch; the softmax is in place.
    std::vector<float>& delta = activations_[layers];
    double loss = 0;
    for (std::size_t b = 0; b < batch; ++b) {
      float* row = delta.data() + b * classes;
      loss -= std::log(std::max(row[labels[b]], 1e-30f));
      row[labels[b]] -= 1.0f;
      for (std::size_t c = 0; c < classes; ++c) row[c] /= static_cast<float>(batch);
    }
    for (std::size_t l = layers; l-- > 0;) {
      std::size_t const in = sizes_[l], out = sizes_[l + 1];
      auto const& w = layout_.tensors()[2 * l];
      auto const& bias = layout_.tensors()[2 * l + 1];
      float const* a = l == 0 ? images : activations_[l].data();
      float const* d = l == layers - 1 ? delta.data() : deltas_[l + 1].data();
      // dW = d^T a, db = column sums of d.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.0f, d, out, a, in, 0.0f,
                  gradient + w.offset, in);
      if (ready) ready(2 * l);
      for (std::size_t o = 0; o < out; ++o) gradient[bias.offset + o] = 0.0f;
      for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t o = 0; o < out; ++o) gradient[bias.offset + o] += d[b * out + o];
      if (ready) ready(2 * l + 1);
      if (l == 0) break;
      // Through the weights and the ReLU of the layer below.
      std::vector<float>& below = deltas_[l];
      below.resize(batch * in);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out, 1.0f, d, out, params_.data() + w.offset,
                  in, 0.0f, below.data(), in);
      for (std::size_t i = 0; i < batch * in; ++i)
        if (activations_[l][i] <= 0.0f) below[i] = 0.0f;
    }
    return static_cast<float>(loss / static_cast<double>(batch));
  }

  /// Index of the largest logit of each image.
  std::vector<std::uint8_t> predict(float const* images, std::size_t batch) {
    forward(images, batch);
    std::vector<std::uint8_t> out(batch);
    std::size_t const classes = sizes_.back();
    float const* p = activations_.back().data();
    for (std::size_t b = 0; b < batch; ++b)
      out[b] = static_cast<std::uint8_t>(std::max_element(p + b * classes, p + (b + 1) * classes) - (p + b * classes));
    return out;
  }

 private:
  // activations_[l] holds layer l's output (ReLU'd); the last holds softmax.
  void forward(float const* images, std::size_t batch) {
    std::size_t const layers = sizes_.size() - 1;
    activations_.resize(layers + 1);
    deltas_.resize(layers + 1);
    for (std::size_t l = 0; l < layers; ++l) {
      std::size_t const in = sizes_[l], out = sizes_[l + 1];
      auto const& w = layout_.tensors()[2 * l];
      auto const& bias = layout_.tensors()[2 * l + 1];
      float const* a = l == 0 ? images : activations_[l].data();
      std::vector<float>& z = activations_[l + 1];
      z.resize(batch * out);
      for (std::size_t b = 0; b < batch; ++b) std::copy_n(params_.data() + bias.offset, out, z.data() + b * out);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f, a, in, params_.data() + w.offset, in,
                  1.0f, z.data(), out);
      if (l + 1 < layers) {
        for (float& v : z) v = std::max(v, 0.0f);
      } else {
        for (std::size_t b = 0; b < batch; ++b) {  // softmax, stably
          float* row = z.data() + b * out;
          float const top = *std::max_element(row, row + out);
          float sum = 0;
          for (std::size_t c = 0; c < out; ++c) sum += row[c] = std::exp(row[c] - top);
          for (std::size_t c = 0; c < out; ++c) row[c] /= sum;
        }
      }
    }
  }

  std::vector<std::size_t> sizes_;
  gradcomp::bucket_layout layout_;
  std::vector<float> params_;
  std::vector<std::vector<float>> activations_, deltas_;
};

}  // namespace train
