#include "server/store/trailing_hasher.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace tensorcheck {

namespace {
// Pages are faulted in up to this far ahead of the writer, this much at a
// time; hashing takes at most this much per lock.
constexpr int64_t kAhead = int64_t{64} << 20;
constexpr int64_t kStep = int64_t{8} << 20;
}  // namespace

TrailingHasher::TrailingHasher(const char* base, int64_t capacity)
    : base_(base), capacity_(capacity) {
  thread_ = std::thread([this] { Loop(); });
}

TrailingHasher::~TrailingHasher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void TrailingHasher::Advance(int64_t written) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    written_ = written;
  }
  cv_.notify_all();
}

std::string TrailingHasher::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  finishing_ = true;
  cv_.notify_all();
  cv_.wait(lock, [this] { return hashed_ == written_; });
  return hash_.HexDigest();  // the thread no longer touches hash_: it is caught up and waits
}

void TrailingHasher::Loop() {
  const int64_t page = sysconf(_SC_PAGESIZE);
  // Faulted in so far: from the first whole page of the buffer.
  const uintptr_t first_page =
      (reinterpret_cast<uintptr_t>(base_) + static_cast<uintptr_t>(page) - 1) &
      ~static_cast<uintptr_t>(page - 1);
  int64_t populated = static_cast<int64_t>(first_page - reinterpret_cast<uintptr_t>(base_));
  bool can_populate = true;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (stop_) return;
    if (hashed_ < written_) {
      const int64_t begin = hashed_, end = std::min(written_, hashed_ + kStep);
      lock.unlock();
      hash_.Update(absl::string_view(base_ + begin, static_cast<size_t>(end - begin)));
      lock.lock();
      hashed_ = end;
      if (hashed_ == written_) cv_.notify_all();  // Finish may be waiting
      continue;
    }
    // Caught up: fault in the pages the writer will need next.
    const int64_t target = std::min(capacity_, written_ + kAhead);
    if (can_populate && !finishing_ && populated + page <= target) {
      const int64_t len = std::min(kStep, (target - populated) / page * page);
      lock.unlock();
      // MADV_POPULATE_WRITE (Linux 5.14): where it is missing, the writer
      // takes the faults itself, as without this thread.
      can_populate = madvise(const_cast<char*>(base_) + populated, static_cast<size_t>(len),
                             MADV_POPULATE_WRITE) == 0;
      lock.lock();
      populated += len;
      continue;
    }
    cv_.wait(lock, [&] {
      return stop_ || hashed_ < written_ ||
             (can_populate && !finishing_ &&
              populated + page <= std::min(capacity_, written_ + kAhead));
    });
  }
}

}  // namespace tensorcheck
