// Executor: a fixed pool of threads that fan-out work (statistics, error
// model passes) runs on, created once and shared by every caller.
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<Executor> pool,
//                       Executor::Create({/*threads=*/4}));
//   std::vector<double> partial(16);
//   ParallelFor(pool.get(), 16, [&](int64_t task) {
//     partial[task] = SumOfSlice(task);   // each task writes its own slot
//   });
//   double sum = 0;
//   for (double p : partial) sum += p;    // the caller adds them in order
//
// ParallelFor(count, task) runs task(0) ... task(count - 1), each once, and
// returns when all have finished. The calling thread runs tasks too: an
// executor of size n owns n - 1 threads, so size 1 (or a null Executor*
// given to the free ParallelFor) runs everything inline on the caller.
//
// Results do not depend on the size: the caller decides what a task is and
// how many there are; the executor never splits or merges tasks, it only
// decides which thread runs each one, in no particular order. Tasks must
// therefore write disjoint data, and whatever they sum should be combined
// by the caller in task order afterwards.
//
// Thread safety: ParallelFor may be called from any number of threads at
// once (requests share one pool); their tasks are interleaved on the pool's
// threads, the oldest call first. A task may itself call ParallelFor on the
// same executor: every caller works on its own call, so this cannot
// deadlock. Tasks must not throw (ParallelFor is noexcept: an exception
// escaping a task terminates the process).
//
// Lifetime: no thread is started after Create; the destructor joins them.
// The executor must outlive every ParallelFor call made on it.
//
// Errors (Create): INVALID_ARGUMENT for a negative size, RESOURCE_EXHAUSTED
// when the system refuses a thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"

namespace tensorcheck {

class Executor {
 public:
  struct Options {
    // Threads that run one call's tasks, the caller's included (so
    // `threads - 1` are started). 0: one per hardware thread.
    int threads = 0;
  };

  static absl::StatusOr<std::unique_ptr<Executor>> Create(const Options& options);

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;
  ~Executor();

  // How many threads can run one call's tasks at once, the caller's
  // included: the pool's threads plus one. Callers may use it to choose how
  // many tasks to make (a few per thread balances uneven tasks), never to
  // decide what a result is.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(i) for every i in [0, count) and returns when all are done.
  // `task` is called as task(int64_t) from several threads at once.
  template <typename Task>
  void ParallelFor(int64_t count, Task&& task) noexcept {
    using T = std::remove_reference_t<Task>;
    Run(
        count, [](void* t, int64_t i) { (*static_cast<T*>(t))(i); },
        const_cast<void*>(static_cast<const void*>(&task)));
  }

 private:
  struct Job;
  using TaskFn = void (*)(void*, int64_t);

  Executor() = default;
  void Run(int64_t count, TaskFn fn, void* context) noexcept;
  void WorkerLoop();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;            // a job was queued, or stopping_
  std::deque<std::shared_ptr<Job>> queue_;  // guarded by mu_; calls wanting helpers
  bool stopping_ = false;                   // guarded by mu_
};

// ParallelFor on `executor`, or inline on the calling thread (in task
// order) when it is null.
template <typename Task>
void ParallelFor(Executor* executor, int64_t count, Task&& task) noexcept {
  if (executor == nullptr) {
    for (int64_t i = 0; i < count; ++i) task(i);
    return;
  }
  executor->ParallelFor(count, task);
}

}  // namespace tensorcheck
