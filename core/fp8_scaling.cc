#include "core/fp8_scaling.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace tensorcheck {

Fp8ScalePair Fp8ScaleForAmax(double amax, Fp8Format format) {
  // torch.clamp(amax, min=EPS) keeps a NaN amax NaN.
  const double clamped = amax < kFp8AmaxFloor ? kFp8AmaxFloor : amax;
  const float s = static_cast<float>(Fp8MaxFinite(format) / clamped);
  return {s, 1.0f / s};
}

absl::StatusOr<Fp8Quantized> QuantizeFp8Blocks(const Tensor& t, int64_t outer, int64_t inner,
                                               Fp8Format format, Fp8Block block) {
  if (IsFp8(t.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantise: a wide tensor expected, got ", DTypeName(t.dtype())));
  }
  if (outer < 0 || inner < 0 || t.numel() != outer * inner) {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantise: [", outer, ", ", inner, "] does not match shape ", ShapeString(t.shape())));
  }
  const int64_t rows = std::max<int64_t>(block.rows, 1), cols = std::max<int64_t>(block.cols, 1);
  const int64_t block_columns = CeilDiv(inner, cols);
  const int64_t groups = CeilDiv(outer, rows) * block_columns;
  auto group_of = [&](int64_t i) -> int64_t {
    return (i / inner) / rows * block_columns + (i % inner) / cols;
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

absl::StatusOr<Fp8Quantized> QuantizeFp8(const Tensor& t, int64_t outer, int64_t inner,
                                         Fp8Format format, Fp8Scaling scaling, bool per_column) {
  if (scaling == Fp8Scaling::kBlock128) {
    return absl::InvalidArgumentError(
        "quantise: block-wise scaling goes through QuantizeFp8Blocks");
  }
  // Empty views still get their one scale of a tensor-wide block.
  const int64_t all_rows = std::max<int64_t>(outer, 1), all_cols = std::max<int64_t>(inner, 1);
  Fp8Block block{all_rows, all_cols};
  if (scaling == Fp8Scaling::kRow)
    block = per_column ? Fp8Block{all_rows, 1} : Fp8Block{1, all_cols};
  return QuantizeFp8Blocks(t, outer, inner, format, block);
}

absl::StatusOr<Tensor> DequantizeBlocks(const Tensor& values, const Tensor& scales, int64_t outer,
                                        int64_t inner, Fp8Block block, DType out) {
  const int64_t rows = std::max<int64_t>(block.rows, 1), cols = std::max<int64_t>(block.cols, 1);
  const int64_t block_columns = CeilDiv(inner, cols);
  if (values.numel() != outer * inner || scales.numel() != CeilDiv(outer, rows) * block_columns) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantise: values ", ShapeString(values.shape()), " and scales ",
                     ShapeString(scales.shape()), " do not match [", outer, ", ", inner,
                     "] in blocks of ", rows, " x ", cols));
  }
  if (out != DType::kFloat64 && out != DType::kFloat32) {
    return absl::InvalidArgumentError("dequantise: float64 or float32 output expected");
  }
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(out, values.shape()));
  std::vector<double> s(static_cast<size_t>(scales.numel()));
  for (int64_t g = 0; g < scales.numel(); ++g) s[static_cast<size_t>(g)] = scales.GetDouble(g);
  for (int64_t r = 0; r < outer; ++r) {
    const double* row_scales = s.data() + (r / rows) * block_columns;
    for (int64_t c = 0; c < inner; ++c) {
      const double v = values.GetDouble(r * inner + c) * row_scales[c / cols];
      if (out == DType::kFloat64) {
        t.data<double>()[r * inner + c] = v;
      } else {
        t.data<float>()[r * inner + c] = static_cast<float>(v);
      }
    }
  }
  return t;
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
