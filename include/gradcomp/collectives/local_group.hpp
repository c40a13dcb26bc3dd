// local_group: N ranks as threads of one process, doing real reductions.
//
// For tests, for single-machine simulation of data-parallel training, and as
// the embedded default of the examples: no launcher, no network. Each
// collective is two barriers: ranks post their buffers; each rank reduces its
// own slice of the elements over all ranks (in rank order, so every rank
// gets bitwise the same result) into shared scratch; after the second
// barrier each rank copies the result out. Ranks that disagree on a
// collective (its kind, type, count, operator or root) all get the same
// collective_error instead of a hang, and a rank that fails releases its
// peers through abort().
#pragma once

#include <gradcomp/collectives/collective.hpp>
#include <gradcomp/detail/reduce.hpp>
#include <gradcomp/error.hpp>
#include <gradcomp/execution.hpp>
#include <gradcomp/types.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// A group of ranks that live as threads in this process.
class local_group {
  struct shared_state;

 public:
  /// One rank's handle on the group; satisfies gradcomp::collective.
  /// Host buffers are used directly; device buffers (when built with CUDA)
  /// are staged through host memory after synchronizing the device, which is
  /// right for tests and simulation, not for speed.
  class communicator {
   public:
    /// This rank, in [0, size()).
    int rank() const { return rank_; }
    /// Number of ranks in the group.
    int size() const { return state_->ranks; }
    /// Host memory always; device memory when built with CUDA (staged).
    bool accepts(memory_kind kind) const { return kind == memory_kind::host || GRADCOMP_HAS_CUDA; }

    /// recv = op over ranks of send (rank order; 16-bit floats accumulate in
    /// float and round once). send may equal recv.
    template <wire_type T>
    void all_reduce(T const* send, T* recv, std::size_t count, reduce_op op) {
      staged<T> io(send, recv, count, count);
      run({kind::all_reduce, dtype_of_v<T>, op, count, 0, io.send(), io.recv()},
          [&](post const* posts) { reduce_my_slice<T>(posts, count, op); });
      io.finish();
    }

    /// recv[r * count + i] = send[i] of rank r.
    template <wire_type T>
    void all_gather(T const* send, T* recv, std::size_t count) {
      staged<T> io(send, recv, count, count * size());
      run({kind::all_gather, dtype_of_v<T>, reduce_op::sum, count, 0, io.send(), io.recv()}, [&](post const* posts) {
        for (int r = 0; r < size(); ++r) {
          if (count != 0 && posts[r].send != io.recv() + r * count)
            std::memcpy(io.recv() + r * count, posts[r].send, count * sizeof(T));
        }
      });
      io.finish();
    }

    /// buffer = root's buffer on every rank.
    template <wire_type T>
    void broadcast(T* buffer, std::size_t count, int root) {
      staged<T> io(buffer, buffer, count, count);
      run({kind::broadcast, dtype_of_v<T>, reduce_op::sum, count, root, io.send(), io.recv()}, [&](post const* posts) {
        if (rank_ != root && count != 0) std::memcpy(io.recv(), posts[root].send, count * sizeof(T));
      });
      io.finish();
    }

    /// recv = op over ranks of block rank() of send (size() blocks of count),
    /// in rank order: bitwise all_reduce's result for that block. recv may be
    /// send + rank() * count.
    template <wire_type T>
    void reduce_scatter(T const* send, T* recv, std::size_t count, reduce_op op) {
      staged<T> io(send, recv, count * size(), count);
      run({kind::reduce_scatter, dtype_of_v<T>, op, count, 0, io.send(), io.recv()},
          [&](post const* posts) { reduce_block<T>(posts, count, op, io.recv()); });
      io.finish();
    }

    /// The ranks that pass the same color, ranked by (key, rank) as
    /// MPI_Comm_split does: a group of their own, collective over this one.
    /// A failure that aborts this group aborts the new one too.
    communicator split(int color, int key) {
      int const n = size();
      std::int64_t const mine[2] = {color, key};
      std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n));
      all_gather(mine, all.data(), 2);
      std::vector<int> members;
      auto const field = [&](int r, std::size_t f) { return all[2 * static_cast<std::size_t>(r) + f]; };
      for (int r = 0; r < n; ++r)
        if (field(r, 0) == color) members.push_back(r);
      std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return field(a, 1) < field(b, 1); });
      int const new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
      shared_state& s = *state_;
      std::pair<std::uint64_t, int> const id{splits_, color};
      ++splits_;  // every rank splits in the same order, so the ids agree
      std::shared_ptr<shared_state> group;
      if (members.front() == rank_) {  // the color's first rank makes the group ...
        group = std::make_shared<shared_state>(static_cast<int>(members.size()));
        std::lock_guard lock(s.mutex);
        s.made[id] = group;
        s.children.push_back(group);
      }
      s.arrive_and_wait([] {});
      if (!group) {  // ... the others find it
        std::lock_guard lock(s.mutex);
        group = s.made.at(id);
      }
      s.arrive_and_wait([&s] { s.made.clear(); });
      return communicator(std::move(group), new_rank);
    }

    /// Marks the group failed and wakes every rank blocked in a collective;
    /// they, and every later collective, throw collective_error(reason).
    void abort(std::string const& reason) { state_->abort(reason); }

   private:
    friend class local_group;
    communicator(std::shared_ptr<shared_state> state, int rank) : state_(std::move(state)), rank_(rank) {}

    enum class kind { all_reduce, all_gather, broadcast, reduce_scatter };
    static constexpr char const* kind_name[] = {"all_reduce", "all_gather", "broadcast", "reduce_scatter"};

    struct post {
      kind what;
      dtype type;
      reduce_op op;
      std::size_t count;
      int root;
      void const* send;
      void* recv;
    };

    // Host views of the caller's buffers: the buffers themselves, or host
    // copies of device buffers that finish() writes back.
    template <class T>
    class staged {
     public:
      staged(T const* send, T* recv, std::size_t send_count, std::size_t recv_count)
          : send_(send), recv_(recv), recv_count_(recv_count) {
#if GRADCOMP_HAS_CUDA
        if (is_device(send) || is_device(recv)) {
          GRADCOMP_CUDA_TRY(cudaDeviceSynchronize());
          host_.resize(send_count + recv_count);
          if (send_count != 0)
            GRADCOMP_CUDA_TRY(cudaMemcpy(host_.data(), send, send_count * sizeof(T), cudaMemcpyDefault));
          device_recv_ = recv;
          send_ = host_.data();
          recv_ = host_.data() + send_count;
          if (send == recv) recv_ = host_.data();  // keep in-place calls in place
        }
#else
        (void)send_count;
#endif
      }
      T const* send() const { return send_; }
      T* recv() const { return recv_; }
      void finish() {
#if GRADCOMP_HAS_CUDA
        if (device_recv_ != nullptr && recv_count_ != 0)
          GRADCOMP_CUDA_TRY(cudaMemcpy(device_recv_, recv_, recv_count_ * sizeof(T), cudaMemcpyDefault));
#endif
      }

     private:
#if GRADCOMP_HAS_CUDA
      static bool is_device(void const* p) {
        cudaPointerAttributes attributes{};
        if (p == nullptr || cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
          cudaGetLastError();  // clear the sticky-free error of a plain host pointer
          return false;
        }
        return attributes.type == cudaMemoryTypeDevice;
      }
      std::vector<T> host_;
      T* device_recv_ = nullptr;
#endif
      T const* send_;
      T* recv_;
      std::size_t recv_count_;
    };

    // Reduces elements [lo, hi) of every rank's input into the shared scratch.
    template <class T>
    void reduce_my_slice(post const* posts, std::size_t count, reduce_op op) {
      using A = detail::accumulator_t<T>;
      int const n = size();
      std::size_t const lo = count * rank_ / n, hi = count * (rank_ + 1) / n;
      T* out = reinterpret_cast<T*>(state_->scratch.data());
      for (std::size_t i = lo; i < hi; ++i) {
        // NOLINTNEXTLINE(bugprone-signed-char-misuse): int8 elements are signed numbers
        A acc = static_cast<A>(static_cast<T const*>(posts[0].send)[i]);
        for (int r = 1; r < n; ++r)
          acc = detail::combine(acc, static_cast<A>(static_cast<T const*>(posts[r].send)[i]), op);
        out[i] = static_cast<T>(acc);
      }
    }

    // Reduces block rank_ of every rank's input into `out` (the same formula,
    // element for element, as reduce_my_slice).
    template <class T>
    void reduce_block(post const* posts, std::size_t count, reduce_op op, T* out) {
      using A = detail::accumulator_t<T>;
      int const n = size();
      std::size_t const first = count * static_cast<std::size_t>(rank_);
      for (std::size_t i = 0; i < count; ++i) {
        // NOLINTNEXTLINE(bugprone-signed-char-misuse): int8 elements are signed numbers
        A acc = static_cast<A>(static_cast<T const*>(posts[0].send)[first + i]);
        for (int r = 1; r < n; ++r)
          acc = detail::combine(acc, static_cast<A>(static_cast<T const*>(posts[r].send)[first + i]), op);
        out[i] = static_cast<T>(acc);
      }
    }

    // Post, agree, do this rank's part, wait for every rank's part, then copy
    // the shared result (all_reduce) out.
    template <class Work>
    void run(post mine, Work&& work) {
      shared_state& s = *state_;
      s.posts[rank_] = mine;
      s.arrive_and_wait([&s] { s.validate_and_size_scratch(); });
      work(s.posts.data());
      s.arrive_and_wait([] {});
      if (mine.what == kind::all_reduce && mine.count != 0)
        std::memcpy(mine.recv, s.scratch.data(), mine.count * size_of(mine.type));
    }

    std::shared_ptr<shared_state> state_;
    int rank_;
    std::uint64_t splits_ = 0;  // splits made so far (the same count on every rank)
  };

  /// A group of `ranks` ranks (at least 1).
  explicit local_group(int ranks) : state_(std::make_shared<shared_state>(ranks)) {}

  /// Number of ranks.
  int size() const { return state_->ranks; }

  /// The handle for `rank`; give each thread its own.
  communicator comm(int rank) const {
    GRADCOMP_EXPECTS(rank >= 0 && rank < size(),
                     "local_group: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(size()) + ")");
    return communicator(state_, rank);
  }

  /// Runs body(communicator&) on `ranks` threads, one per rank, and joins
  /// them. If a rank throws, the group is aborted so no peer hangs, and the
  /// first failure (not the aborts it caused) is rethrown here.
  template <class Body>
  static void run(int ranks, Body&& body) {
    local_group group(ranks);
    std::vector<std::exception_ptr> errors(ranks);
    std::vector<std::thread> threads;
    threads.reserve(ranks);
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        try {
          communicator comm = group.comm(r);
          body(comm);
        } catch (std::exception const& e) {
          errors[r] = std::current_exception();
          group.state_->abort("rank " + std::to_string(r) + " failed: " + e.what(), r);
        } catch (...) {
          errors[r] = std::current_exception();
          group.state_->abort("rank " + std::to_string(r) + " failed", r);
        }
      });
    }
    for (auto& t : threads) t.join();
    // The rank whose failure aborted the group, else (all ranks failed the
    // same check together) the lowest failing rank.
    int const origin = group.state_->first_failed_rank;
    if (origin >= 0) std::rethrow_exception(errors[origin]);
    for (auto const& e : errors)
      if (e) std::rethrow_exception(e);
  }

 private:
  struct shared_state {
    explicit shared_state(int n) : ranks(n), posts(n > 0 ? n : 0) {
      GRADCOMP_EXPECTS(n >= 1, "local_group needs at least one rank, got " + std::to_string(n));
    }

    int const ranks;
    std::vector<communicator::post> posts;
    struct alignas(64) scratch_line {  // (not std::max_align_t: nvcc cannot destroy that in a vector)
      std::byte bytes[64];
    };
    std::vector<scratch_line> scratch;

    std::mutex mutex;
    std::condition_variable wake;
    int arrived = 0;
    std::uint64_t generation = 0;
    bool aborted = false;
    std::string reason;
    int first_failed_rank = -1;
    std::map<std::pair<std::uint64_t, int>, std::shared_ptr<shared_state>> made;  // a split's groups, while it runs
    std::vector<std::weak_ptr<shared_state>> children;                            // groups split from this one

    // A barrier that runs `last` (under the lock) when the last rank arrives,
    // and that abort() breaks.
    template <class Last>
    void arrive_and_wait(Last&& last) {
      std::unique_lock lock(mutex);
      if (aborted) throw collective_error("local_group: " + reason);
      std::uint64_t const my_generation = generation;
      if (++arrived == ranks) {
        last();
        wake.notify_all();
        if (aborted) throw collective_error("local_group: " + reason);  // last() found the ranks disagreeing
        arrived = 0;
        ++generation;
        return;
      }
      wake.wait(lock, [&] { return generation != my_generation || aborted; });
      // A barrier every rank passed has completed, even if a peer aborted
      // right after: only a barrier that never filled fails.
      if (generation == my_generation) throw collective_error("local_group: " + reason);
    }

    void abort(std::string const& why, int failed_rank = -1) {
      std::lock_guard lock(mutex);
      if (!aborted) {
        aborted = true;
        reason = why;
        first_failed_rank = failed_rank;
      }
      wake.notify_all();
      for (auto const& child : children)  // (a child never locks its parent: no deadlock)
        if (auto c = child.lock()) c->abort(why);
    }

    // Runs once per collective, by the last rank to arrive: every rank sees
    // the same verdict. A disagreement aborts the group with a message naming
    // the first rank that differs from rank 0.
    void validate_and_size_scratch() {
      communicator::post const& first = posts[0];
      for (int r = 1; r < ranks; ++r) {
        communicator::post const& p = posts[r];
        std::ostringstream why;
        if (p.what != first.what)
          why << "ranks called different collectives: rank 0 " << communicator::kind_name[int(first.what)] << ", rank "
              << r << ' ' << communicator::kind_name[int(p.what)];
        else if (p.type != first.type)
          why << communicator::kind_name[int(p.what)] << ": ranks disagree on the element type: rank 0 "
              << name_of(first.type) << ", rank " << r << ' ' << name_of(p.type);
        else if (p.count != first.count)
          why << communicator::kind_name[int(p.what)] << ": ranks disagree on the element count: rank 0 " << first.count
              << ", rank " << r << ' ' << p.count;
        else if (p.op != first.op)
          why << communicator::kind_name[int(p.what)] << ": ranks disagree on the operator: rank 0 "
              << name_of(first.op) << ", rank " << r << ' ' << name_of(p.op);
        else if (p.root != first.root)
          why << "broadcast: ranks disagree on the root: rank 0 " << first.root << ", rank " << r << ' ' << p.root;
        if (!why.str().empty()) {
          aborted = true;
          reason = why.str();
          return;
        }
      }
      if (first.what == communicator::kind::broadcast && (first.root < 0 || first.root >= ranks)) {
        aborted = true;
        reason = "broadcast: root " + std::to_string(first.root) + " is outside [0, " + std::to_string(ranks) + ")";
        return;
      }
      std::size_t const bytes = first.count * size_of(first.type);
      std::size_t const lines = (bytes + sizeof(scratch_line) - 1) / sizeof(scratch_line);
      if (first.what == communicator::kind::all_reduce && scratch.size() < lines) scratch.resize(lines);
    }
  };

  std::shared_ptr<shared_state> state_;
};

static_assert(collective<local_group::communicator>);
static_assert(reduce_scattering<local_group::communicator> && splittable<local_group::communicator>);

}  // namespace gradcomp
