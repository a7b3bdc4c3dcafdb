#include "core/fp8_scaling.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tensorcheck {

Fp8ScalePair Fp8ScaleForAmax(double amax, Fp8Format format) {
  // torch.clamp(amax, min=EPS) keeps a NaN amax NaN.
  const double clamped = amax < kFp8AmaxFloor ? kFp8AmaxFloor : amax;
  const float s = static_cast<float>(Fp8MaxFinite(format) / clamped);
  return {s, 1.0f / s};
}

absl::StatusOr<Fp8Quantized> QuantizeFp8(const Tensor& t, int64_t outer, int64_t inner,
                                         Fp8Format format, Fp8Scaling scaling, bool per_column) {
  if (IsFp8(t.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantise: a wide tensor expected, got ", DTypeName(t.dtype())));
  }
  if (outer < 0 || inner < 0 || t.numel() != outer * inner) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantise: [", outer, ", ", inner, "] does not match shape ", ShapeString(t.shape())));
  }
  const int64_t groups = scaling == Fp8Scaling::kTensor ? 1 : (per_column ? inner : outer);
  auto group_of = [&](int64_t i) -> int64_t {
    if (scaling == Fp8Scaling::kTensor) return 0;
    return per_column ? i % inner : i / inner;
  };
  // amax per group, in fp64 (exact: a maximum of stored values); NaN wins.
  std::vector<double> amax(static_cast<size_t>(groups), 0.0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double a = std::fabs(t.GetDouble(i));
    double& m = amax[static_cast<size_t>(group_of(i))];
    if (std::isnan(a) || a > m) m = std::isnan(m) ? m : a;
  }
  Fp8Quantized out;
  const DType fp8 = format == Fp8Format::kE4M3Fn ? DType::kFloat8E4M3Fn : DType::kFloat8E5M2;
  auto values = Tensor::Create(fp8, t.shape());
  if (!values.ok()) return values.status();
  out.values = *std::move(values);
  std::vector<float> quantise(static_cast<size_t>(groups));
  out.scales.resize(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    const Fp8ScalePair s = Fp8ScaleForAmax(amax[static_cast<size_t>(g)], format);
    quantise[static_cast<size_t>(g)] = s.quantise;
    out.scales[static_cast<size_t>(g)] = s.dequantise;
  }
  uint8_t* q = out.values.data<uint8_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    // The value as fp32 (torchao upcasts first), times the scale in fp32,
    // then one saturating rounding to FP8.
    const float scaled =
        static_cast<float>(t.GetDouble(i)) * quantise[static_cast<size_t>(group_of(i))];
    q[i] = DoubleToFp8Bits(scaled, format, Fp8Overflow::kSaturate);
  }
  return out;
}

namespace {

// v truncated toward zero to a multiple of `quantum` (a power of two): exact.
inline double TruncateTo(double v, double quantum) { return std::trunc(v / quantum) * quantum; }

}  // namespace

float FastAccumDot(const float* a, const float* b, int64_t b_stride, int64_t k,
                   const FastAccumModel& model) {
  const int bits = model.accumulator_bits;
  const int64_t group = std::clamp<int64_t>(model.group, 1, kMaxFastAccumGroup);
  double acc = 0;
  bool finite = true;
  double products[kMaxFastAccumGroup];
  for (int64_t start = 0; start < k; start += group) {
    const int64_t count = std::min(group, k - start);
    int e_max = INT_MIN;
    if (finite && acc != 0) e_max = std::ilogb(acc);
    for (int64_t i = 0; i < count; ++i) {
      // Exact: two FP8 values' product has at most 8 significant bits.
      const double p =
          static_cast<double>(a[start + i]) * static_cast<double>(b[(start + i) * b_stride]);
      products[i] = p;
      if (!std::isfinite(p)) {
        finite = false;
      } else if (p != 0) {
        e_max = std::max(e_max, std::ilogb(p));
      }
    }
    if (!finite) {
      // Infinities and NaNs propagate as IEEE addition says.
      for (int64_t i = 0; i < count; ++i) acc += products[i];
      continue;
    }
    if (e_max == INT_MIN) continue;  // all zero
    // Aligned to the largest exponent, `bits` fraction bits kept: every
    // term a multiple of the quantum, so the sum below is exact in fp64
    // (bits + 2 + log2(group + 1) significant bits at most).
    const double quantum = std::ldexp(1.0, e_max - bits);
    double sum = TruncateTo(acc, quantum);
    for (int64_t i = 0; i < count; ++i) sum += TruncateTo(products[i], quantum);
    // Normalised back into the accumulator: bits + 1 significant bits.
    if (sum != 0) sum = TruncateTo(sum, std::ldexp(1.0, std::ilogb(sum) - bits));
    acc = sum;
  }
  return static_cast<float>(acc);
}

}  // namespace tensorcheck
