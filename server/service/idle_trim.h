// IdleTrim: hands the heap's free memory back to the system once the
// server has been quiet for a while after any call, whatever its size
// (docs/reliability.md, "Returning memory"). glibc keeps what requests
// freed in its arenas, one per thread that allocated, and gRPC's threads
// and the workers touch many: without a trim, RSS after bursts of small
// calls kept climbing (175 MiB idle, 450 MiB after four bursts).
//
//   IdleTrim trim({/*quiet=*/absl::Seconds(2)});   // malloc_trim(0) by default
//   trim.CallStarted();
//   ... the call runs ...
//   trim.CallEnded();   // quiet for 2 s from here, nothing running: one trim
//
// A trim runs on IdleTrim's own thread, once per quiet period that
// follows activity: never while a call runs, never twice without a call
// in between, so an idle server does nothing and steady load pays nothing.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace tensorcheck {

// Makes glibc serve every block of `bytes` or more from its own mapping,
// returned to the system when freed, instead of letting its threshold
// grow with the largest block freed so far (up to 32 MiB), after which
// tensors land in the per-thread arenas and stay there as slack. With it,
// RSS 10 s after bursts of 64 clients was 8 MiB over idle, against 16-72
// MiB with the trim alone, in the same runs (docs/reliability.md,
// "Returning memory").
// Process-wide; the server calls it once at start.
void ServeLargeBlocksFromTheirOwnMappings(int64_t bytes = int64_t{1} << 20);

class IdleTrim {
 public:
  struct Options {
    // How long nothing must run, after the last call ended, before the
    // trim.
    absl::Duration quiet = absl::Seconds(2);
    // What a trim does; empty: glibc's malloc_trim(0).
    std::function<void()> trim;
  };

  explicit IdleTrim(Options options);
  ~IdleTrim();  // joins the thread; no trim after it returns
  IdleTrim(const IdleTrim&) = delete;
  IdleTrim& operator=(const IdleTrim&) = delete;

  void CallStarted();
  void CallEnded();

  // Trims done so far.
  int64_t trims() const;

 private:
  void Loop();

  const Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;       // guarded by mu_
  bool pending_ = false;  // guarded by mu_: a call ended since the last trim
  absl::Time last_end_;   // guarded by mu_
  bool stop_ = false;     // guarded by mu_
  int64_t trims_ = 0;     // guarded by mu_
  std::thread thread_;    // last: started once the rest is set
};

}  // namespace tensorcheck
