#include "server/backends/cuda/internal/block_scale_layout.h"

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/fp8_scaling.h"
#include "core/mx_formats.h"
#include "core/status_macros.h"

namespace tensorcheck::cuda::internal {
namespace {

int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// A 1-D tensor of `dtype` holding `bytes`.
absl::StatusOr<Tensor> BytesTensor(DType dtype, int64_t count, const void* bytes) {
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(dtype, {count}));
  std::memcpy(t.raw(), bytes, t.nbytes());
  return t;
}

// The scale block's length along k of a block-wise mode.
int64_t BlockOf(Fp8ScaleMode mode) {
  return mode == Fp8ScaleMode::kNvVec16 ? 16 : mode == Fp8ScaleMode::kMxVec32 ? 32 : kFp8BlockSize;
}

// `codes` ([outer, inner] row-major, one byte each) as [inner, outer].
std::vector<uint8_t> TransposeBytes(const std::vector<uint8_t>& codes, int64_t outer,
                                    int64_t inner) {
  std::vector<uint8_t> out(codes.size());
  for (int64_t r = 0; r < outer; ++r) {
    for (int64_t c = 0; c < inner; ++c) {
      out[static_cast<size_t>(c * outer + r)] = codes[static_cast<size_t>(r * inner + c)];
    }
  }
  return out;
}

}  // namespace

int64_t Blk128x128Stride(int64_t k) { return RoundUp(CeilDiv(k, kFp8BlockSize), 4); }

std::vector<float> Vec128Scales(const float* plain, int64_t m, int64_t s) {
  std::vector<float> out(static_cast<size_t>(m * s));
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t c = 0; c < s; ++c) out[static_cast<size_t>(c * m + i)] = plain[i * s + c];
  }
  return out;
}

std::vector<float> Blk128x128Scales(const float* plain, int64_t nb, int64_t s, bool transposed) {
  const int64_t stride = RoundUp(s, 4);
  std::vector<float> out(static_cast<size_t>(nb * stride), 0.0f);
  for (int64_t jb = 0; jb < nb; ++jb) {
    for (int64_t c = 0; c < s; ++c) {
      out[static_cast<size_t>(jb * stride + c)] =
          transposed ? plain[c * nb + jb] : plain[jb * s + c];
    }
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> SwizzledBlockScales(const uint8_t* plain, int64_t rows,
                                                         int64_t cols, bool transposed) {
  std::vector<uint8_t> rows_first(plain, plain + rows * cols);
  if (transposed) rows_first = TransposeBytes(rows_first, cols, rows);
  return SwizzleScales(rows_first, rows, cols);
}

std::vector<uint8_t> TransposeFp4(const uint8_t* packed, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>((rows * cols + 1) / 2), 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      SetFp4Code(out.data(), c * rows + r, Fp4Code(packed, r * cols + c));
    }
  }
  return out;
}

LtScaleSpec LtScaleSpecOf(Fp8ScaleMode mode, bool weight, const LayerShape& shape) {
  const int64_t outer = weight ? shape.n : shape.m;
  switch (mode) {
    case Fp8ScaleMode::kTensor:
      return {DType::kFloat32, 1};
    case Fp8ScaleMode::kOuterVector:
      return {DType::kFloat32, outer};
    case Fp8ScaleMode::kBlock128:
      return {DType::kFloat32, weight ? CeilDiv(shape.n, kFp8BlockSize) * Blk128x128Stride(shape.k)
                                      : CeilDiv(shape.k, kFp8BlockSize) * shape.m};
    case Fp8ScaleMode::kMxVec32:
      return {DType::kFloat8E8M0Fnu, SwizzledScaleLength(outer, shape.k / 32)};
    case Fp8ScaleMode::kNvVec16:
      return {DType::kFloat8E4M3Fn, SwizzledScaleLength(outer, shape.k / 16)};
  }
  return {};
}

absl::StatusOr<Tensor> LtBlockScales(const Tensor& plain, Fp8ScaleMode mode, bool weight,
                                     const LayerShape& shape) {
  const bool in_out = weight && shape.layout == WeightLayout::kInOut;
  const LtScaleSpec spec = LtScaleSpecOf(mode, weight, shape);
  const int64_t outer = weight ? shape.n : shape.m;
  if (mode == Fp8ScaleMode::kBlock128) {
    const int64_t s = CeilDiv(shape.k, kFp8BlockSize);
    const int64_t rows = weight ? CeilDiv(shape.n, kFp8BlockSize) : shape.m;
    if (plain.dtype() != DType::kFloat32 || plain.numel() != rows * s) {
      return absl::InvalidArgumentError(absl::StrCat(weight ? "weight_scale" : "input_scale",
                                                     ": float32 with ", rows * s,
                                                     " elements expected (scaling=block128), got ",
                                                     plain.numel(), " ", DTypeName(plain.dtype())));
    }
    const std::vector<float> out = weight ? Blk128x128Scales(plain.data<float>(), rows, s, in_out)
                                          : Vec128Scales(plain.data<float>(), rows, s);
    return BytesTensor(spec.dtype, spec.count, out.data());
  }
  if (mode != Fp8ScaleMode::kMxVec32 && mode != Fp8ScaleMode::kNvVec16) {
    return absl::InvalidArgumentError(
        absl::StrCat(Fp8ScaleModeName(mode), " is not a block-wise scale mode"));
  }
  const int64_t cols = shape.k / BlockOf(mode);
  if (plain.dtype() != spec.dtype || plain.numel() != outer * cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        weight ? "weight_scale" : "input_scale", ": ", DTypeName(spec.dtype), " with ",
        outer * cols, " elements expected, got ", plain.numel(), " ", DTypeName(plain.dtype())));
  }
  TC_ASSIGN_OR_RETURN(std::vector<uint8_t> swizzled,
                      SwizzledBlockScales(plain.data<uint8_t>(), outer, cols, in_out));
  return BytesTensor(spec.dtype, spec.count, swizzled.data());
}

absl::StatusOr<LtOperand> QuantiseForLt(const Tensor& t, bool weight, const LayerShape& shape,
                                        const Config& config, const Fp8Gemm& gemm) {
  const bool in_out = weight && shape.layout == WeightLayout::kInOut;
  // t viewed as the CPU backend views it: x [m, k]; W [n, k] or [k, n].
  const int64_t outer = !weight ? shape.m : (in_out ? shape.k : shape.n);
  const int64_t inner = !weight ? shape.k : (in_out ? shape.n : shape.k);
  const int64_t rows = weight ? shape.n : shape.m;  // TN: the operand's rows on the device
  const DType values = weight ? gemm.a : gemm.b;
  LtOperand out;
  if (gemm.scale_mode == Fp8ScaleMode::kBlock128) {
    TC_ASSIGN_OR_RETURN(Fp8Quantized q, QuantizeFp8Blocks(t, outer, inner, *Fp8FormatOf(values),
                                                          Fp8BlockOf(weight)));
    TC_ASSIGN_OR_RETURN(Tensor plain,
                        Tensor::Create(DType::kFloat32, {static_cast<int64_t>(q.scales.size())}));
    std::memcpy(plain.raw(), q.scales.data(), q.scales.size() * sizeof(float));
    TC_ASSIGN_OR_RETURN(out.scales, LtBlockScales(plain, gemm.scale_mode, weight, shape));
    std::vector<uint8_t> codes(q.values.data<uint8_t>(),
                               q.values.data<uint8_t>() + q.values.nbytes());
    if (in_out) codes = TransposeBytes(codes, outer, inner);
    TC_ASSIGN_OR_RETURN(out.values, BytesTensor(values, rows * shape.k, codes.data()));
    return out;
  }
  if (gemm.scale_mode != Fp8ScaleMode::kMxVec32 && gemm.scale_mode != Fp8ScaleMode::kNvVec16) {
    return absl::InvalidArgumentError(
        absl::StrCat(Fp8ScaleModeName(gemm.scale_mode), " is not a block-wise scale mode"));
  }
  auto wide = std::make_unique<float[]>(static_cast<size_t>(t.numel()));
  ToFloat(t, wide.get());
  const absl::Span<const float> v(wide.get(), static_cast<size_t>(t.numel()));
  BlockScaled q;
  if (gemm.scale_mode == Fp8ScaleMode::kNvVec16) {
    TC_ASSIGN_OR_RETURN(q, QuantizeNvFp4(v, outer, inner, /*per_column=*/in_out));
  } else {
    TC_ASSIGN_OR_RETURN(q, QuantizeMxFp8(v, outer, inner, *Fp8FormatOf(values), config.mx_rounding,
                                         /*per_column=*/in_out));
  }
  out.global_scale = q.global_scale;
  // Codes [rows, k] (TN), one byte each; packed for FP4.
  std::vector<uint8_t> codes = in_out ? TransposeBytes(q.codes, outer, inner) : std::move(q.codes);
  if (values == DType::kFloat4E2M1Fn) {
    std::vector<uint8_t> packed(static_cast<size_t>((rows * shape.k + 1) / 2), 0);
    for (int64_t e = 0; e < rows * shape.k; ++e) {
      SetFp4Code(packed.data(), e, codes[static_cast<size_t>(e)]);
    }
    codes = std::move(packed);
  }
  TC_ASSIGN_OR_RETURN(out.values, BytesTensor(values, rows * shape.k, codes.data()));
  // The plain scale: [rows, k/B], or per column [k/B, n].
  const DType scale_dtype = LtScaleSpecOf(gemm.scale_mode, weight, shape).dtype;
  TC_ASSIGN_OR_RETURN(Tensor plain, Tensor::Create(scale_dtype, {q.scale_rows, q.scale_cols}));
  std::memcpy(plain.raw(), q.scales.data(), q.scales.size());
  TC_ASSIGN_OR_RETURN(out.scales, LtBlockScales(plain, gemm.scale_mode, weight, shape));
  return out;
}

}  // namespace tensorcheck::cuda::internal
