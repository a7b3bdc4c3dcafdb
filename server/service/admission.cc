#include "server/service/admission.h"

namespace tensorcheck {

ByteBudget::Outcome ByteBudget::TryAdd(int64_t delta, int64_t total_after) {
  if (limit_ > 0 && total_after > limit_) return Outcome::kOverBudget;
  int64_t current = in_use_.load(std::memory_order_relaxed);
  do {
    if (limit_ > 0 && current + delta > limit_) return Outcome::kBusy;
  } while (!in_use_.compare_exchange_weak(current, current + delta, std::memory_order_relaxed));
  return Outcome::kAdmitted;
}

ByteBudget::Outcome ByteBudget::TryReserve(int64_t bytes, Reservation* r) {
  if (bytes < 0) bytes = 0;
  const Outcome o = TryAdd(bytes, bytes);
  if (o == Outcome::kAdmitted) {
    r->budget_ = this;
    r->bytes_ = bytes;
  }
  return o;
}

ByteBudget::Outcome ByteBudget::TryResize(Reservation* r, int64_t bytes) {
  if (bytes < 0) bytes = 0;
  if (r->budget_ == nullptr) return TryReserve(bytes, r);
  if (bytes <= r->bytes_) {
    Release(r->bytes_ - bytes);
    r->bytes_ = bytes;
    return Outcome::kAdmitted;
  }
  const Outcome o = TryAdd(bytes - r->bytes_, bytes);
  if (o == Outcome::kAdmitted) r->bytes_ = bytes;
  return o;
}

}  // namespace tensorcheck
