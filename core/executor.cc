#include "core/executor.h"

#include <algorithm>
#include <atomic>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tensorcheck {

// One ParallelFor call. Shared between the caller and the helpers that
// joined it: a helper that wakes up late may still look at `next` after
// the caller has returned, so the job outlives the call; `fn`/`context`
// (the caller's stack) are used only for a claimed index below `count`,
// and the caller waits for every one of those.
struct Executor::Job {
  int64_t count = 0;
  TaskFn fn = nullptr;
  void* context = nullptr;
  int max_helpers = 0;  // helpers that may still join; guarded by Executor::mu_
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable all_done;
  int64_t done = 0;  // guarded by mu

  // Claims and runs tasks until none is left.
  void Work() {
    int64_t ran = 0;
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < count;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(context, i);
      ++ran;
    }
    if (ran == 0) return;
    std::lock_guard<std::mutex> lock(mu);
    done += ran;
    if (done == count) all_done.notify_all();
  }
};

absl::StatusOr<std::unique_ptr<Executor>> Executor::Create(const Options& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "executor: threads must be >= 0 (0: one per hardware thread); got ", options.threads));
  }
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto executor = std::unique_ptr<Executor>(new Executor());
  executor->workers_.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) {
    try {
      executor->workers_.emplace_back([e = executor.get()] { e->WorkerLoop(); });
    } catch (const std::system_error& e) {
      // The destructor stops and joins the threads already started.
      return absl::ResourceExhaustedError(
          absl::StrCat("executor: cannot start thread ", t, " of ", threads, ": ", e.what()));
    }
  }
  return executor;
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void Executor::WorkerLoop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and no call is waiting
      job = queue_.front();
      if (--job->max_helpers == 0) queue_.pop_front();
    }
    job->Work();
  }
}

void Executor::Run(int64_t count, TaskFn fn, void* context) noexcept {
  if (count <= 0) return;
  const int helpers =
      static_cast<int>(std::min<int64_t>(static_cast<int64_t>(workers_.size()), count - 1));
  if (helpers == 0) {
    for (int64_t i = 0; i < count; ++i) fn(context, i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->count = count;
  job->fn = fn;
  job->context = context;
  job->max_helpers = helpers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
  }
  for (int h = 0; h < helpers; ++h) wake_.notify_one();

  job->Work();

  // Every task is claimed: no helper needs to join any more. Then wait for
  // the tasks that helpers claimed, not for the helpers themselves (one that
  // the scheduler wakes late finds nothing left and does not hold us up).
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it != queue_.end()) queue_.erase(it);
  }
  std::unique_lock<std::mutex> lock(job->mu);
  job->all_done.wait(lock, [&] { return job->done == count; });
}

}  // namespace tensorcheck
