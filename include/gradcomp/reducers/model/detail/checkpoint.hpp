// The model-level core's checkpoints (model_buckets::save, restore, load):
// every bucket's state in one envelope (detail/envelope.hpp) with one
// agreement over the world, applied to the buckets built from a plan at
// once, or to handed-over buckets as each is built.
#pragma once

#include <gradcomp/reducers/model/model_buckets.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

template <class Delivery, class World, class Space, gradient_element Gradient>
std::vector<std::byte> model_buckets<Delivery, World, Space, Gradient>::save() {
  drain();
  std::vector<detail::model::saved_bucket> all;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    entry* e = buckets_[b].get();
    if (!e || (!e->reduce && e->loaded.bytes.empty()) || e->warming) continue;  // (warm-up keeps no state)
    if (e->reduce)
      all.push_back({b, e->spec.str(), e->positions, e->reduce->save()});
    else
      all.push_back(e->loaded);
  }
  return detail::model::write_envelope(identity(), steps_, all);
}

template <class Delivery, class World, class Space, gradient_element Gradient>
void model_buckets<Delivery, World, Space, Gradient>::restore(span<std::byte const> bytes, std::string failure) {
  drain();
  detail::model::envelope saved;
  std::vector<bucket_checkpoint> parsed;
  if (failure.empty()) try {
      saved = detail::model::read_envelope(bytes, identity());
      std::size_t built = 0;
      for (auto const& e : buckets_) built += e && e->reduce ? 1 : 0;
      if (saved.buckets.size() != built)
        throw checkpoint_error("checkpoint: " + std::to_string(saved.buckets.size()) +
                               " buckets where this model has " + std::to_string(built));
      for (auto const& b : saved.buckets) {
        if (!bucket(b.index))
          throw checkpoint_error("checkpoint: bucket " + std::to_string(b.index) + ", which this model does not have");
        parsed.push_back(buckets_[b.index]->reduce->parse_checkpoint({b.bytes.data(), b.bytes.size()}));
      }
    } catch (checkpoint_error const& e) {
      failure = e.what();
    }
  agree_restorable(saved.steps, failure);
  for (std::size_t k = 0; k < parsed.size(); ++k) buckets_[saved.buckets[k].index]->reduce->restore(parsed[k]);
  steps_ = saved.steps;
}

template <class Delivery, class World, class Space, gradient_element Gradient>
void model_buckets<Delivery, World, Space, Gradient>::load(span<std::byte const> bytes) {
  drain();
  auto [saved, failure] = detail::parsed_or_why([&] { return detail::model::read_envelope(bytes, identity()); });
  agree_restorable(saved.steps, failure);
  buckets_.clear();
  for (auto& b : saved.buckets) {
    entry& e = slot(b.index);
    e.positions = b.positions;
    e.loaded = std::move(b);
  }
  steps_ = saved.steps;
}

}  // namespace gradcomp
