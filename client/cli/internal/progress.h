// A one-line progress display on stderr: the phase in words ("hashing",
// "uploading 2 tensors", "waiting for the server's diagnosis"), a bar with
// bytes and rate for hashing, uploads and reads, and the time the phase has
// lasted. Internal to client/cli.
//
//   Progress progress(/*enabled=*/ProgressWanted(cl));
//   progress.Begin("uploading 2 tensors", total_bytes);
//   ... progress.Advance(chunk.size());   // from any thread
//   progress.End();                        // clears the line
//   progress.BeginCount("layers", 24);      // "layers 12/24" as Advance(1) counts
//   progress.Update("diagnosis: running the candidates", 5, 13);  // what the server said
//
// Disabled (stderr not a terminal, or --no-progress), it writes nothing and
// starts no thread, so piped and captured stderr stays exactly as before.
// Enabled, a thread redraws the line a few times a second, and only once a
// phase has lasted a moment, so quick commands never flicker.
//
// Thread safety: Advance may be called from any thread; Begin and End from
// one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"

namespace tensorcheck::cli::internal {

// The progress line (without the carriage return and erase codes):
//   "hashing [######..................]  25% 1.0 GB / 4.0 GB  500.0 MB/s, 2 s"
//   "waiting for the server's diagnosis 12 s"
//   "layers 12/24, 30 s"
// `count`: `total` counts items, not bytes; `total` 0: the time alone.
std::string ProgressLine(absl::string_view label, int64_t done, int64_t total, bool count,
                         double seconds);

// Whether stderr is a terminal (and so whether a progress line is wanted,
// unless --no-progress).
bool StderrIsTerminal();

class Progress {
 public:
  explicit Progress(bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }

  // Starts a phase: a bar over `total_bytes`, or (0) the elapsed time.
  void Begin(std::string label, int64_t total_bytes);
  // Starts a phase that counts items: "layers 12/24".
  void BeginCount(std::string label, int64_t total_items);
  void Advance(int64_t bytes) { done_.fetch_add(bytes, std::memory_order_relaxed); }
  // Renames the phase begun last and sets its count, keeping its start:
  // "diagnosis: running the candidates 5/13, 12 s" (`total` 0: the time
  // alone). From any thread, as the server reports it.
  void Update(std::string label, int64_t done, int64_t total);
  // Ends the phase and clears its line.
  void End();

 private:
  void Loop();
  void DrawLocked();

  const bool enabled_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool active_ = false;
  bool drawn_ = false;
  std::string last_line_;  // what is on the terminal now
  std::string label_;
  int64_t total_ = 0;
  bool count_ = false;  // total_ counts items, not bytes
  std::chrono::steady_clock::time_point start_;
  std::thread thread_;
};

}  // namespace tensorcheck::cli::internal
