// RequestProgress: how far the work of one request has come, for a client
// that asks while it runs (the GetProgress RPC; docs/api.md, "Progress").
// The service makes one per Verify, Diagnose or Compare call; the engine
// names each phase and counts its steps (the candidates run and compared,
// then the ranking).
//
//   RequestProgress progress;
//   progress.Begin("running candidates", 13);  // done back to 0
//   progress.Advance();                         // one candidate compared
//   RequestProgress::Snapshot now = progress.Get();  // {"running candidates", 1, 13}
//
// A null `RequestProgress*` means nobody asks: AdvanceProgress and
// BeginProgress do nothing then. Thread safety: every method may be called
// from any thread at once.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace tensorcheck {

class RequestProgress {
 public:
  struct Snapshot {
    std::string phase;  // "" before the work started
    int64_t done = 0;
    int64_t total = 0;  // 0: the phase counts nothing
  };

  // Starts a phase of `total` steps (0: not counted).
  void Begin(std::string phase, int64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    now_ = {std::move(phase), 0, total};
  }
  // Counts `steps` more of the phase, never past its total.
  void Advance(int64_t steps = 1) {
    std::lock_guard<std::mutex> lock(mu_);
    now_.done += steps;
    if (now_.total > 0 && now_.done > now_.total) now_.done = now_.total;
  }
  Snapshot Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return now_;
  }

 private:
  mutable std::mutex mu_;
  Snapshot now_;
};

inline void BeginProgress(RequestProgress* p, std::string phase, int64_t total) {
  if (p != nullptr) p->Begin(std::move(phase), total);
}
inline void AdvanceProgress(RequestProgress* p, int64_t steps = 1) {
  if (p != nullptr) p->Advance(steps);
}

}  // namespace tensorcheck
