#include "server/service/idle_trim.h"

#include <malloc.h>

#include <utility>

#include "absl/time/clock.h"

namespace tensorcheck {

void ServeLargeBlocksFromTheirOwnMappings(int64_t bytes) {
  // Setting it also fixes it: glibc stops adjusting it dynamically.
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes));
}

IdleTrim::IdleTrim(Options options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

IdleTrim::~IdleTrim() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IdleTrim::CallStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++running_;
}

void IdleTrim::CallEnded() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    pending_ = true;
    last_end_ = absl::Now();
  }
  cv_.notify_all();
}

int64_t IdleTrim::trims() const {
  std::lock_guard<std::mutex> lock(mu_);
  return trims_;
}

void IdleTrim::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!pending_ || running_ > 0) {
      cv_.wait(lock);  // a call ended, or the end
      continue;
    }
    const absl::Time due = last_end_ + options_.quiet;
    if (absl::Now() < due) {
      // Woken early by a call's start or end: the loop looks again.
      cv_.wait_until(lock, absl::ToChronoTime(due));
      continue;
    }
    pending_ = false;
    lock.unlock();
    if (options_.trim) {
      options_.trim();
    } else {
      malloc_trim(0);
    }
    lock.lock();
    ++trims_;
  }
}

}  // namespace tensorcheck
