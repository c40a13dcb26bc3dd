// A test collective that behaves like MPI where local_group does not: a rank
// that fails does not release (or abort) its peers, they simply wait. A
// watchdog turns a wait longer than a few seconds into a `hang` error, so a
// test can show that no path ever leaves a rank waiting forever: every rank
// must fail (or succeed) on its own.
#pragma once

#include <gradcomp/gradcomp.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gradcomp::testing {

/// What a rank waiting past the watchdog throws.
struct hang : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class mpi_like_group {
  struct shared {
    explicit shared(int n, std::chrono::milliseconds limit) : ranks(n), sends(n), watchdog(limit) {}
    int ranks;
    std::vector<std::vector<std::byte>> sends;  // each rank's contribution to the current collective
    std::chrono::milliseconds watchdog;
    std::mutex mutex;
    std::condition_variable wake;
    int arrived = 0;
    std::uint64_t generation = 0;

    // A barrier with a deadline; no rank can break it for the others.
    void barrier(int rank, char const* what) {
      std::unique_lock lock(mutex);
      std::uint64_t const mine = generation;
      if (++arrived == ranks) {
        arrived = 0;
        ++generation;
        wake.notify_all();
        return;
      }
      if (!wake.wait_for(lock, watchdog, [&] { return generation != mine; }))
        throw hang("rank " + std::to_string(rank) + " waited more than " + std::to_string(watchdog.count()) +
                   " ms in " + what + ": its peers never came");
    }
  };

 public:
  /// One rank's handle; satisfies gradcomp::collective (host memory).
  class communicator {
   public:
    int rank() const { return rank_; }
    int size() const { return state_->ranks; }
    bool accepts(memory_kind kind) const { return kind == memory_kind::host; }

    template <wire_type T>
    void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
      exchange(send, count, "all_reduce");
      using A = detail::accumulator_t<T>;
      std::vector<T> out(count);
      for (std::size_t i = 0; i < count; ++i) {
        A acc = static_cast<A>(at<T>(0)[i]);
        for (int r = 1; r < size(); ++r) acc = detail::combine(acc, static_cast<A>(at<T>(r)[i]), op);
        out[i] = static_cast<T>(acc);
      }
      state_->barrier(rank_, "all_reduce");  // every rank has read every contribution
      if (count != 0) std::memcpy(recv, out.data(), count * sizeof(T));
    }
    template <wire_type T>
    void all_gather(T const* send, T* recv, std::size_t count) {
      exchange(send, count, "all_gather");
      std::vector<T> out(count * size());
      for (int r = 0; r < size(); ++r)
        if (count != 0) std::memcpy(out.data() + r * count, at<T>(r), count * sizeof(T));
      state_->barrier(rank_, "all_gather");
      if (!out.empty()) std::memcpy(recv, out.data(), out.size() * sizeof(T));
    }
    template <wire_type T>
    void broadcast(T* buffer, std::size_t count, int root) {
      exchange(buffer, count, "broadcast");
      std::vector<T> out(at<T>(root), at<T>(root) + count);
      state_->barrier(rank_, "broadcast");
      if (count != 0) std::memcpy(buffer, out.data(), count * sizeof(T));
    }

   private:
    friend class mpi_like_group;
    communicator(std::shared_ptr<shared> state, int rank) : state_(std::move(state)), rank_(rank) {}

    template <class T>
    void exchange(T const* send, std::size_t count, char const* what) {
      {
        std::lock_guard lock(state_->mutex);
        auto& mine = state_->sends[rank_];
        mine.resize(count * sizeof(T));
        if (count != 0) std::memcpy(mine.data(), send, count * sizeof(T));
      }
      state_->barrier(rank_, what);  // every rank has posted
    }
    template <class T>
    T const* at(int r) const {
      return reinterpret_cast<T const*>(state_->sends[r].data());
    }

    std::shared_ptr<shared> state_;
    int rank_;
  };

  /// Runs body(communicator&) on `ranks` threads and returns each rank's
  /// exception (null where it returned normally). Nothing a rank does
  /// releases another: a rank left waiting throws `hang` after `watchdog`.
  template <class Body>
  static std::vector<std::exception_ptr> run(int ranks, Body&& body,
                                             std::chrono::milliseconds watchdog = std::chrono::seconds(5)) {
    auto state = std::make_shared<shared>(ranks, watchdog);
    std::vector<std::exception_ptr> errors(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        try {
          communicator comm(state, r);
          body(comm);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    return errors;
  }
};

static_assert(collective<mpi_like_group::communicator>);

/// The message of an exception_ptr, and whether it holds a `hang`.
inline std::string message_of(std::exception_ptr const& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (std::exception const& x) {
    return x.what();
  }
}
inline bool is_hang(std::exception_ptr const& e) {
  if (!e) return false;
  try {
    std::rethrow_exception(e);
  } catch (hang const&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace gradcomp::testing
