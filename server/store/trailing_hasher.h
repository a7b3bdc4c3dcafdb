// TrailingHasher: hashes a buffer while it is being filled, on a thread of
// its own, a step behind the writer, and faults in the pages a step ahead
// of it. An upload's bytes then cost the receiving thread one memcpy into
// memory that is already mapped: the SHA-256 and the kernel's page zeroing
// (each about as long as receiving the bytes) run beside it
// (docs/performance.md, "Tensor store").
//
//   std::string bytes;  bytes.reserve(size);
//   TrailingHasher hasher(bytes.data(), size);
//   bytes.append(chunk);  hasher.Advance(bytes.size());   // ... every chunk
//   std::string hex = hasher.Finish();                    // waits for the rest
//
// Advance and Finish are called from one thread at a time; [0, written)
// must not change after Advance(written).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "core/digest.h"

namespace tensorcheck {

class TrailingHasher {
 public:
  // `base` holds `capacity` bytes (allocated, not necessarily written).
  TrailingHasher(const char* base, int64_t capacity);
  ~TrailingHasher();  // stops the thread (a hash not finished is dropped)
  TrailingHasher(const TrailingHasher&) = delete;
  TrailingHasher& operator=(const TrailingHasher&) = delete;

  // The first `written` bytes are final.
  void Advance(int64_t written);
  // The hash of the bytes written so far (64 lowercase hex digits), once
  // the thread has caught up. Call once.
  std::string Finish();

 private:
  void Loop();

  const char* const base_;
  const int64_t capacity_;
  Sha256 hash_;  // the thread's
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t written_ = 0;  // guarded by mu_
  int64_t hashed_ = 0;   // guarded by mu_
  bool finishing_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tensorcheck
