#include "server/stats/magnitude_sums.h"

#include <cmath>
#include <limits>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "server/core/status_macros.h"
#include "server/stats/blas_gemm.h"

namespace tensorcheck {
namespace {

absl::Status CheckOperands(const MagnitudeOperands& op) {
  if (op.input == nullptr || op.weight == nullptr) {
    return absl::InvalidArgumentError("magnitude sums: input and weight expected, got null");
  }
  constexpr int64_t kMaxBlasDim = std::numeric_limits<int>::max();
  for (const int64_t d : {op.m, op.n, op.k}) {
    if (d < 0 || d > kMaxBlasDim) {
      return absl::InvalidArgumentError(absl::StrCat("magnitude sums: dimensions in [0, ",
                                                     kMaxBlasDim, "] expected, got ", op.m, ", ",
                                                     op.n, ", ", op.k));
    }
  }
  const int64_t rows = op.layout == WeightLayout::kOutIn ? op.n : op.k;
  const int64_t cols = op.layout == WeightLayout::kOutIn ? op.k : op.n;
  if (op.input->numel() != op.m * op.k || op.weight->rank() != 2 || op.weight->dim(0) != rows ||
      op.weight->dim(1) != cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "magnitude sums: input ", ShapeString(op.input->shape()), " and weight ",
        ShapeString(op.weight->shape()), " do not match m=", op.m, ", n=", op.n, ", k=", op.k));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<float[]>> FloatCopy(const Tensor& t) {
  std::unique_ptr<float[]> p(
      new (std::nothrow) float[static_cast<size_t>(std::max<int64_t>(t.numel(), 1))]);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("magnitude sums: cannot allocate ", t.numel() * 4, " bytes"));
  }
  ToFloat(t, p.get());
  return p;
}

}  // namespace

absl::Status ComputeMagnitudeSums(const MagnitudeOperands& op, const MagnitudeSums& out) {
  if (absl::Status s = CheckOperands(op); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<float[]>> x = FloatCopy(*op.input);
  if (!x.ok()) return x.status();
  absl::StatusOr<std::unique_ptr<float[]>> w = FloatCopy(*op.weight);
  if (!w.ok()) return w.status();
  float* xs = x->get();
  float* ws = w->get();
  const int64_t nx = op.input->numel();
  const int64_t nw = op.weight->numel();
  auto gemm = [&](float* c) { return BlasGemm(xs, ws, op.layout, op.m, op.n, op.k, c, op.stop); };
  if (out.dot != nullptr) TC_RETURN_IF_ERROR(gemm(out.dot));
  for (int64_t i = 0; i < nx; ++i) xs[i] = std::fabs(xs[i]);
  for (int64_t i = 0; i < nw; ++i) ws[i] = std::fabs(ws[i]);
  if (out.abs_dot != nullptr) TC_RETURN_IF_ERROR(gemm(out.abs_dot));
  if (out.sq_dot != nullptr) {
    for (int64_t i = 0; i < nx; ++i) xs[i] *= xs[i];
    for (int64_t i = 0; i < nw; ++i) ws[i] *= ws[i];
    TC_RETURN_IF_ERROR(gemm(out.sq_dot));
    const int64_t mn = op.m * op.n;
    for (int64_t i = 0; i < mn; ++i) out.sq_dot[i] = std::sqrt(out.sq_dot[i]);
  }
  return absl::OkStatus();
}

absl::Status ComputeMagnitudeSums(const MagnitudeOperands& op, float* abs_dot, float* sq_dot,
                                  float* dot) {
  if (abs_dot == nullptr || sq_dot == nullptr) {
    return absl::InvalidArgumentError("abs_dot, sq_dot: m*n floats expected, got null");
  }
  return ComputeMagnitudeSums(op, MagnitudeSums{abs_dot, sq_dot, dot});
}

}  // namespace tensorcheck
