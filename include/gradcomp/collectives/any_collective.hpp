// A host collective whose backend is chosen at run time: any class of the
// collective concept behind one type, so that code over it (a trainer, a
// reducer's factory) is compiled once for every backend instead of once per
// backend. One virtual call per collective call, none per element.
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/types.hpp>

#include <concepts>
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

namespace gradcomp::inline GRADCOMP_ABI {

/// Any collective behind one type: its calls, reduce_scatter and split
/// where the backend has them (else invalid_argument when called), and
/// check_async. Its space is the host (default_space): a backend ordered on
/// a CUDA stream (NCCL) is used directly, not through this. Copies share
/// the backend; one made from a reference borrows it (it must outlive
/// them), one that split() made owns its group.
class any_collective {
 public:
  /// Borrows `backend`.
  template <collective C>
  requires(!std::same_as<std::remove_cv_t<C>, any_collective>) explicit any_collective(C& backend)
      : self_(std::make_shared<model<C&>>(backend)) {}

  /// Owns `backend` (moved in).
  template <collective C>
  requires(!std::same_as<C, any_collective>) static any_collective owning(C backend) {
    return any_collective(std::make_shared<model<C>>(std::move(backend)));
  }

  int rank() const { return self_->rank(); }
  int size() const { return self_->size(); }
  bool accepts(memory_kind kind) const { return self_->accepts(kind); }

  template <wire_type T>
  void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
    self_->call(call_kind::all_reduce, dtype_of_v<T>, send, recv, count, op, 0);
  }
  template <wire_type T>
  void all_gather(T const* send, T* recv, std::size_t count) {
    self_->call(call_kind::all_gather, dtype_of_v<T>, send, recv, count, reduce_op::sum, 0);
  }
  template <wire_type T>
  void broadcast(T* buffer, std::size_t count, int root) {
    self_->call(call_kind::broadcast, dtype_of_v<T>, buffer, buffer, count, reduce_op::sum, root);
  }
  /// See reduce_scattering; invalid_argument where the backend cannot.
  template <wire_type T>
  void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
    self_->call(call_kind::reduce_scatter, dtype_of_v<T>, send, recv, count, op, 0);
  }
  /// See splittable: a new group, owned; invalid_argument where the backend
  /// cannot split.
  any_collective split(int color, int key) { return any_collective(self_->split(color, key)); }
  /// Throws what the backend found asynchronously (see collective).
  void check_async() { self_->check_async(); }

 private:
  enum class call_kind { all_reduce, all_gather, broadcast, reduce_scatter };

  struct concept_ {
    virtual ~concept_() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    virtual bool accepts(memory_kind) const = 0;
    virtual void call(call_kind, dtype, void const* send, void* recv, std::size_t count, reduce_op, int root) = 0;
    virtual std::shared_ptr<concept_> split(int color, int key) = 0;
    virtual void check_async() = 0;
  };

  // C is the backend (owned) or a reference to it (borrowed).
  template <class C>
  struct model final : concept_ {
    using backend = std::remove_cvref_t<C>;
    explicit model(C backend) : c(std::forward<C>(backend)) {}  // (a reference, or the backend moved in)
    C c;

    int rank() const override { return c.rank(); }
    int size() const override { return c.size(); }
    bool accepts(memory_kind kind) const override { return c.accepts(kind); }
    void call(call_kind kind, dtype type, void const* send, void* recv, std::size_t count, reduce_op op,
              int root) override {
      detail::with_type(type, [&]<class T>(T) {
        auto const* s = static_cast<T const*>(send);
        auto* r = static_cast<T*>(recv);
        switch (kind) {
          case call_kind::all_reduce:
            return c.all_reduce(s, r, count, op);
          case call_kind::all_gather:
            return c.all_gather(s, r, count);
          case call_kind::broadcast:
            return c.broadcast(r, count, root);
          case call_kind::reduce_scatter:
            if constexpr (reduce_scattering<backend>)
              return c.reduce_scatter(s, r, count, op);
            else
              throw invalid_argument("any_collective: this backend cannot reduce-scatter");
        }
      });
    }
    std::shared_ptr<concept_> split(int color, int key) override {
      if constexpr (splittable<backend>)
        return std::make_shared<model<backend>>(c.split(color, key));
      else
        throw invalid_argument("any_collective: this backend cannot split");
    }
    void check_async() override {
      if constexpr (requires { c.check_async(); }) c.check_async();
    }
  };

  explicit any_collective(std::shared_ptr<concept_> self) : self_(std::move(self)) {}

  std::shared_ptr<concept_> self_;
};

}  // namespace gradcomp::inline GRADCOMP_ABI
