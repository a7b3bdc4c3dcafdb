#include "server/stats/magnitude_sums.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
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

absl::StatusOr<std::unique_ptr<float[]>> AllocateFloats(int64_t count) {
  std::unique_ptr<float[]> p(
      new (std::nothrow) float[static_cast<size_t>(std::max<int64_t>(count, 1))]);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("magnitude sums: cannot allocate ", count * 4, " bytes"));
  }
  return p;
}

}  // namespace

absl::Status ComputeMagnitudeSums(const MagnitudeOperands& op, const MagnitudeSums& out) {
  if (absl::Status s = CheckOperands(op); !s.ok()) return s;
  if (out.dot == nullptr && out.abs_dot == nullptr && out.sq_dot == nullptr) {
    return absl::OkStatus();
  }
  // x as the GEMMs read it: x, |x| and x^2, each only when its sum is
  // wanted; whole, as the input is small beside the weight.
  const int64_t nx = op.input->numel();
  const int versions = (out.dot != nullptr) + (out.abs_dot != nullptr) + (out.sq_dot != nullptr);
  absl::StatusOr<std::unique_ptr<float[]>> x = AllocateFloats(versions * nx);
  if (!x.ok()) return x.status();
  float* next = x->get();
  auto x_version = [&](bool wanted, int power) -> float* {
    if (!wanted) return nullptr;
    float* v = next;
    next += nx;
    ToFloat(*op.input, v);
    if (power >= 1) {
      for (int64_t i = 0; i < nx; ++i) v[i] = std::fabs(v[i]);
    }
    if (power == 2) {
      for (int64_t i = 0; i < nx; ++i) v[i] *= v[i];
    }
    return v;
  };
  const float* x_raw = x_version(out.dot != nullptr, 0);
  const float* x_abs = x_version(out.abs_dot != nullptr, 1);
  const float* x_sq = x_version(out.sq_dot != nullptr, 2);
  // The weight one block of output columns at a time (PlanWeightBlocks:
  // at most about 64 MiB of fp32), each block's products copied into its
  // columns: bit for bit the sums of a single block (BlasGemmBlock).
  const WeightBlocks blocks = PlanWeightBlocks(op.m, op.n, op.k, sizeof(float), op.block_columns);
  absl::StatusOr<std::unique_ptr<float[]>> w =
      AllocateFloats(blocks.padded_columns * (op.k + op.m));
  if (!w.ok()) return w.status();
  float* wb = w->get();
  float* scratch = wb + blocks.padded_columns * op.k;
  for (int64_t b = 0; b < blocks.count; ++b) {
    TC_RETURN_IF_ERROR(CheckStop(op.stop));
    const int64_t j0 = blocks.begin(b), nb = blocks.columns_of(b);
    const int64_t padded = PaddedColumns(nb);
    const int64_t nw = padded * op.k;
    auto gemm = [&](const float* xs, float* c) {
      return BlasGemmBlock(xs, wb, op.layout, op.m, op.n, op.k, j0, nb, padded, scratch, c,
                           op.stop);
    };
    WidenWeightBlock(*op.weight, op.layout, j0, nb, padded, wb);
    if (out.dot != nullptr) TC_RETURN_IF_ERROR(gemm(x_raw, out.dot));
    for (int64_t i = 0; i < nw; ++i) wb[i] = std::fabs(wb[i]);
    if (out.abs_dot != nullptr) TC_RETURN_IF_ERROR(gemm(x_abs, out.abs_dot));
    if (out.sq_dot != nullptr) {
      for (int64_t i = 0; i < nw; ++i) wb[i] *= wb[i];
      TC_RETURN_IF_ERROR(gemm(x_sq, out.sq_dot));
    }
  }
  if (out.sq_dot != nullptr) {
    const int64_t mn = op.m * op.n;
    for (int64_t i = 0; i < mn; ++i) out.sq_dot[i] = std::sqrt(out.sq_dot[i]);
  }
  if (op.input_scale != nullptr && op.weight_scale != nullptr) {
    auto at = [](const Tensor& s, int64_t i) { return s.GetDouble(s.numel() == 1 ? 0 : i); };
    for (int64_t i = 0; i < op.m; ++i) {
      for (int64_t j = 0; j < op.n; ++j) {
        const double f = at(*op.input_scale, i) * at(*op.weight_scale, j);
        const int64_t e = i * op.n + j;
        if (out.dot != nullptr) out.dot[e] = static_cast<float>(out.dot[e] * f);
        if (out.abs_dot != nullptr)
          out.abs_dot[e] = static_cast<float>(out.abs_dot[e] * std::fabs(f));
        if (out.sq_dot != nullptr) out.sq_dot[e] = static_cast<float>(out.sq_dot[e] * std::fabs(f));
      }
    }
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
