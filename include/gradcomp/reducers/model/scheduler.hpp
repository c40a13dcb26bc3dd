// The model-level scheduler: reductions run in the order they were submitted,
// each on its lane, while the caller goes on; drain() waits for them by
// running what is queued itself, through the same take-and-run code as the
// lanes' threads.
#pragma once

#include <gradcomp/config.hpp>
#include <gradcomp/error.hpp>

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gradcomp::inline GRADCOMP_ABI {

/// Jobs run in submission order on each of `lanes` lanes: a lane runs one job
/// at a time, its jobs in the order they were submitted to it. Lanes are
/// independent of each other (each reduces over a group of its own), so the
/// caller chooses a job's lane by something every rank agrees on (a bucket's
/// index modulo the lanes) and every rank's lane sees the same sequence.
///
/// Threaded, each lane has a worker thread that runs its jobs while the
/// caller goes on; otherwise submit() runs the job before it returns.
/// Nothing allocates once the queues have held a step's jobs.
template <class Job>
class model_scheduler {
 public:
  /// Runs a job, on lane `lane`. Errors are the caller's to keep: it must not throw.
  using runner = std::function<void(Job&, int lane)>;

  model_scheduler(int lanes, bool threaded, runner run) : lanes_(count(lanes)), run_(std::move(run)) {
    if (threaded)
      for (int k = 0; k < lanes; ++k) lanes_[static_cast<std::size_t>(k)].worker = std::thread([this, k] { work(k); });
  }
  model_scheduler(model_scheduler const&) = delete;
  model_scheduler& operator=(model_scheduler const&) = delete;

  ~model_scheduler() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (lane& l : lanes_)
      if (l.worker.joinable()) l.worker.join();
  }

  /// The number of lanes.
  int lanes() const { return static_cast<int>(lanes_.size()); }
  /// Whether lanes run their jobs on threads of their own.
  bool threaded() const { return !lanes_.empty() && lanes_.front().worker.joinable(); }

  /// Queues `job` on lane `lane` (threaded), or runs it now.
  void submit(int lane, Job job) {
    lane_of(lane);
    if (!threaded()) {
      run_(job, lane);
      return;
    }
    {
      std::lock_guard lock(mutex_);
      auto& l = lanes_[static_cast<std::size_t>(lane)];
      if (l.taken == l.queue.size() && !l.running) l.queue.clear(), l.taken = 0;  // (keeps its capacity)
      l.queue.push_back(std::move(job));
      ++submitted_;
    }
    wake_.notify_all();
  }

  /// Returns once every job submitted so far has run. The calling thread runs
  /// the jobs still queued on idle lanes itself, and waits for the others by
  /// yielding rather than sleeping: a sleeping thread's wake-up costs a
  /// scheduler slice, which on a busy host is longer than what overlap saves.
  void drain() {
    if (!threaded()) return;
    std::unique_lock lock(mutex_);
    while (completed_ != submitted_) {
      bool ran = false;
      for (std::size_t k = 0; k < lanes_.size() && !ran; ++k) ran = run_next(lock, k);
      if (ran) continue;
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }

 private:
  struct lane {
    std::vector<Job> queue;  // this lane's jobs; [taken, size) still to run
    std::size_t taken = 0;
    bool running = false;  // a job of this lane is running (on its worker or the draining thread)
    std::thread worker;
  };

  static std::size_t count(int lanes) {
    GRADCOMP_EXPECTS(lanes >= 1, "model_scheduler: lanes must be 1 or more, not " + std::to_string(lanes));
    return static_cast<std::size_t>(lanes);
  }

  void lane_of(int lane) const {
    GRADCOMP_EXPECTS(lane >= 0 && static_cast<std::size_t>(lane) < lanes_.size(),
                     "model_scheduler: lane " + std::to_string(lane) + " of " + std::to_string(lanes_.size()));
  }

  // Runs lane k's next job where it has one and none of its jobs runs:
  // one at a time per lane, in order. Called and returns under the lock.
  bool run_next(std::unique_lock<std::mutex>& lock, std::size_t k) {
    lane& l = lanes_[k];
    if (l.running || l.taken == l.queue.size()) return false;
    Job job = std::move(l.queue[l.taken++]);
    l.running = true;
    lock.unlock();
    run_(job, static_cast<int>(k));
    lock.lock();
    l.running = false;
    ++completed_;
    wake_.notify_all();
    return true;
  }

  void work(int k) {
    std::unique_lock lock(mutex_);
    lane& l = lanes_[static_cast<std::size_t>(k)];
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || (!l.running && l.taken != l.queue.size()); });
      if (!run_next(lock, static_cast<std::size_t>(k)) && stopping_) return;
    }
  }

  std::vector<lane> lanes_;
  runner run_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::size_t submitted_ = 0, completed_ = 0;
  bool stopping_ = false;
};

}  // namespace gradcomp
