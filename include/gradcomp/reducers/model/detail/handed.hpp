// The model-level core's handed-over buckets (model_buckets::submit_handed):
// which bucket holds the parameters DDP hands over (before its rebuild, a
// bucket of another index may), and where a loaded state's buckets together
// make up a handed-over one (a fresh DDP's first buckets are not the saved
// ones), each of them reduced over its own parameters, gathered in its own
// order, so a resumed run reduces as the saved one did.
#pragma once

#include <gradcomp/reducers/model/model_buckets.hpp>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

// The bucket that holds exactly the parameters `positions` (DDP's bucket
// `index` may be a bucket of another index before its rebuild), or `index`.
template <class Delivery, class World, class Space, gradient_element Gradient>
std::size_t model_buckets<Delivery, World, Space, Gradient>::holder_of(
    std::size_t index, std::vector<std::size_t> const& positions) const {
  if (positions.empty() || (index < buckets_.size() && buckets_[index] && buckets_[index]->positions == positions))
    return index;
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (buckets_[b] && buckets_[b]->positions == positions) return b;
  return index;
}

// The loaded buckets whose parameters together are exactly `positions`
// (but not one bucket of the same index and parameters): their indices.
template <class Delivery, class World, class Space, gradient_element Gradient>
std::vector<std::size_t> model_buckets<Delivery, World, Space, Gradient>::loaded_pieces(
    std::size_t index, std::vector<std::size_t> const& positions) const {
  bool any_loaded = false;
  for (auto const& e : buckets_) any_loaded = any_loaded || (e && !e->loaded.bytes.empty());
  if (!any_loaded) return {};
  if (index < buckets_.size() && buckets_[index] && buckets_[index]->positions == positions) return {};
  std::vector<std::size_t> pieces, covered;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    entry const* e = buckets_[b].get();
    if (!e || e->positions.empty()) continue;
    bool const inside = std::all_of(e->positions.begin(), e->positions.end(), [&](std::size_t p) {
      return std::find(positions.begin(), positions.end(), p) != positions.end();
    });
    if (inside) pieces.push_back(b), covered.insert(covered.end(), e->positions.begin(), e->positions.end());
  }
  std::vector<std::size_t> wanted = positions;
  std::sort(covered.begin(), covered.end());
  std::sort(wanted.begin(), wanted.end());
  return covered == wanted ? pieces : std::vector<std::size_t>{};
}

// A handed-over bucket made of loaded buckets: each gathered in its own
// order, reduced, and scattered back, now (after every earlier reduction).
template <class Delivery, class World, class Space, gradient_element Gradient>
void model_buckets<Delivery, World, Space, Gradient>::reduce_pieces(std::vector<std::size_t> const& pieces,
                                                                    gradient_span gradient,
                                                                    std::vector<std::size_t> const& positions,
                                                                    std::vector<shape> const& shapes, void* tag) {
  static_assert(on_host || !Delivery::scatters, "");
  drain();
  std::vector<std::size_t> offset(positions.size() + 1, 0);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    std::size_t n = 1;
    for (std::size_t x : shapes[k]) n *= x;
    offset[k + 1] = offset[k] + n;
  }
  auto where = [&](std::size_t p) {
    return static_cast<std::size_t>(std::find(positions.begin(), positions.end(), p) - positions.begin());
  };
  std::exception_ptr error;
  for (std::size_t b : pieces) {
    entry& e = *buckets_[b];
    if (e.layout.tensors().empty())
      for (std::size_t p : e.positions) e.layout.add(shapes[where(p)]);
    buffer<Gradient, Space> gathered(e.layout.size(), space_);
    std::size_t at = 0;
    for (std::size_t p : e.positions) {
      std::size_t const k = where(p), n = offset[k + 1] - offset[k];
      space_.copy(gathered.data() + at, gradient.data() + offset[k], n * sizeof(Gradient));
      at += n;
    }
    job j{&e, b, gathered.view(), {}, steps_, since_start(), nullptr};
    run(j, lane_of(b));
    {
      std::lock_guard lock(mutex_);
      if (!error) error = std::exchange(error_, nullptr);
    }
    at = 0;
    for (std::size_t p : e.positions) {
      std::size_t const k = where(p), n = offset[k + 1] - offset[k];
      space_.copy(gradient.data() + offset[k], gathered.data() + at, n * sizeof(Gradient));
      at += n;
    }
    space_.synchronize();  // (the gathered copy is freed here)
  }
  if (tag && done_) {
    done_(tag, error);
  } else if (error) {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = error;
  }
}

}  // namespace gradcomp
