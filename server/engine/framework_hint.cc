#include "absl/strings/str_cat.h"
#include "server/engine/diagnosis.h"

namespace tensorcheck {

// What a configuration means in framework terms (docs/numerics.md,
// "framework_hint").
std::string FrameworkHint(const Config& c, DType storage, bool has_bias) {
  const bool fused = c.bias != BiasMode::kUnfused;
  const std::string bias =
      !has_bias ? ""
      : fused   ? ", bias added in the fp32 GEMM epilogue (one rounding)"
                : ", bias added separately after the GEMM output was rounded (two roundings)";
  switch (c.precision) {
    case Precision::kFp64:
      if (storage == DType::kFloat64) return "fp64 matmul (numpy or torch float64)" + bias;
      // No framework's matmul on 16-bit or fp32 tensors accumulates in
      // fp64: this is a reference computation, upcast and rounded back.
      return absl::StrCat(DTypeShortName(storage),
                          " tensors upcast to fp64, multiplied exactly and rounded back "
                          "(a float64 reference such as x.double() @ w.double().T, not "
                          "a framework's ",
                          DTypeShortName(storage), " matmul)") +
             bias;
    case Precision::kFp32:
      if (storage != DType::kFloat32 && storage != DType::kFloat64) {
        return absl::StrCat(DTypeShortName(storage), " inputs with fp32 accumulation") +
               (fused ? ": PyTorch's default (cuBLASLt addmm with the bias in the epilogue)"
                      : ": candle's default, or XLA/Flax (matmul, then the bias as its own op)") +
               bias;
      }
      return fused ? "PyTorch >= 1.12 default for fp32 (allow_tf32=False): strict fp32 "
                     "matmul" +
                         bias
                   : "strict fp32 matmul with the bias as a separate op: candle's "
                     "default, or JAX with precision=HIGHEST" +
                         bias;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc: {
      const std::string rounding = c.precision == Precision::kTf32 ? ""
                                   : c.precision == Precision::kTf32Rna
                                       ? " (inputs rounded ties-away)"
                                       : " (inputs truncated to TF32)";
      return (fused ? "fp32 matmul in TF32 with a fused bias: PyTorch with "
                      "allow_tf32=True, or TensorFlow fp32 on Ampere+"
                    : "JAX/Flax default on Ampere+: fp32 matmul in TF32, bias added "
                      "separately") +
             rounding + (has_bias ? "" : "");
    }
    case Precision::kBf16:
      return fused ? "PyTorch bf16 default: bf16 inputs, fp32 accumulation, bias in "
                     "the cuBLASLt epilogue (addmm), rounded once"
                   : "candle (or XLA/Flax) bf16: matmul rounded to bf16, then the bias "
                     "added in bf16 (two roundings)";
    case Precision::kFp16:
      return fused ? "PyTorch fp16 default: fp16 inputs, fp32 accumulation, bias in "
                     "the cuBLASLt epilogue (addmm), rounded once"
                   : "candle (or XLA/Flax) fp16: matmul rounded to fp16, then the bias "
                     "added in fp16 (two roundings)";
    case Precision::kFp16Acc:
      return "fp16 accumulation (CUBLAS_COMPUTE_16F), as in TensorRT fp16 kernels or "
             "torch with reduced-precision reductions" +
             bias;
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3: {
      const Fp8Operands o = Fp8OperandsOf(c.precision);
      return absl::StrCat(
          "torch._scaled_mm", c.fast_accum ? " with use_fast_accum=True" : "", " on ",
          DTypeName(o.input), " x ", DTypeName(o.weight), ", ",
          c.scaling == Fp8Scaling::kRow ? "row-wise" : "per-tensor", " scales",
          IsFp8(storage) ? "" : " from current (amax) scaling, as torchao's Float8Linear", bias);
    }
  }
  return "";
}

}  // namespace tensorcheck
