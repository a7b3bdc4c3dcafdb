// Admission by bytes: the host memory all requests in flight may hold
// together (--max-inflight-bytes). A request reserves its estimate before
// the server parses it (twice its wire size: the received bytes and the
// parsed message) and adjusts it once its shapes are known
// (Engine::EstimateWorkingBytes); the reservation is returned when the
// request ends.
//
//   ByteBudget budget(int64_t{4} << 30);
//   ByteBudget::Reservation r;
//   switch (budget.TryReserve(2 * wire_bytes, &r)) {
//     case ByteBudget::Outcome::kAdmitted: ...          // r holds them
//     case ByteBudget::Outcome::kBusy: ...              // retry later
//     case ByteBudget::Outcome::kOverBudget: ...        // never fits
//   }
//   budget.TryResize(&r, tensor_bytes + working_bytes);
//
// Thread-safe. A limit of 0 admits everything (and still counts).
#pragma once

#include <atomic>
#include <cstdint>

namespace tensorcheck {

class ByteBudget {
 public:
  enum class Outcome {
    kAdmitted,
    kBusy,        // fits the budget, not next to what is in flight now
    kOverBudget,  // larger than the whole budget
  };

  // Bytes held by one request; returns them when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) {
      o.budget_ = nullptr;
      o.bytes_ = 0;
    }
    Reservation& operator=(Reservation&&) = delete;
    Reservation(const Reservation&) = delete;
    ~Reservation() {
      if (budget_ != nullptr) budget_->Release(bytes_);
    }
    int64_t bytes() const { return bytes_; }

   private:
    friend class ByteBudget;
    ByteBudget* budget_ = nullptr;
    int64_t bytes_ = 0;
  };

  explicit ByteBudget(int64_t limit) : limit_(limit) {}

  // Reserves `bytes` into `r` (which must hold nothing) when they fit.
  Outcome TryReserve(int64_t bytes, Reservation* r);
  // Changes what `r` holds to `bytes`; shrinking always succeeds. On
  // failure `r` keeps what it held.
  Outcome TryResize(Reservation* r, int64_t bytes);

  int64_t limit() const { return limit_; }
  int64_t in_use() const { return in_use_.load(std::memory_order_relaxed); }

 private:
  // Adds `delta` (> 0) when in_use + delta stays within the limit.
  Outcome TryAdd(int64_t delta, int64_t total_after);
  void Release(int64_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }

  const int64_t limit_;
  std::atomic<int64_t> in_use_{0};
};

}  // namespace tensorcheck
