// What configurations mean in framework terms, and which framework switch
// turns one into another (docs/numerics.md, "framework_hint" and "What to
// change").
#include <cctype>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engine/diagnosis.h"

namespace tensorcheck {
namespace {

bool IsTf32(Precision p) {
  return p == Precision::kTf32 || p == Precision::kTf32Rna || p == Precision::kTf32Trunc;
}

// Where a configuration ran: the CPU backend emulates the GPU kernels'
// arithmetic (docs/numerics.md, "CPU emulation"), so a hint that names a
// GPU library says so.
std::string OnTheCpu(const Config& c) { return c.backend == "cpu" ? " (emulated on the CPU)" : ""; }

// The bias part of a hint: nothing without a bias.
std::string BiasPart(const Config& c, bool has_bias) {
  if (!has_bias) return "";
  return c.bias == BiasMode::kUnfused
             ? ", bias added separately after the GEMM output was rounded (two roundings)"
             : ", bias added to the fp32 accumulator before one rounding";
}

// A multi-pass precision in JAX's words (docs/numerics.md, "Multi-pass
// precisions"): its dot-algorithm preset, and the Precision level that
// picks it on a TPU (jax.lax.Precision: HIGH is 3 bf16 passes there,
// HIGHEST 6).
std::string MultiPassHint(Precision p, const std::string& storage) {
  const std::string preset(JaxPresetName(p));
  switch (p) {
    case Precision::kBf16x3:
      return absl::StrCat(storage,
                          " matmul in 3 bf16 passes (hi*hi + hi*lo + lo*hi): JAX with "
                          "precision=HIGH on TPU, or precision='",
                          preset, "'");
    case Precision::kBf16x6:
      return absl::StrCat(storage,
                          " matmul in 6 bf16 passes (3 parts, the 6 largest products): "
                          "JAX with precision=HIGHEST on TPU, or precision='",
                          preset, "'");
    case Precision::kBf16x9:
      return absl::StrCat(storage,
                          " matmul in 9 bf16 passes (3 parts, every product): JAX with "
                          "precision='",
                          preset, "', or cuBLAS's CUBLAS_COMPUTE_32F_EMULATED_16BFX9 (own order)");
    default:
      return absl::StrCat(storage,
                          " matmul in 3 TF32 passes (hi*hi + hi*lo + lo*hi): JAX with "
                          "precision='",
                          preset, "' on an Ampere+ GPU");
  }
}

}  // namespace

// What a configuration means in framework terms (docs/numerics.md,
// "framework_hint").
std::string FrameworkHint(const Config& c, DType storage, bool has_bias) {
  const bool unfused = has_bias && c.bias == BiasMode::kUnfused;
  const std::string bias = BiasPart(c, has_bias);
  const std::string cpu = OnTheCpu(c);
  const std::string s = std::string(DTypeShortName(storage));
  if (TakesSplitK(c.precision) && c.splitk >= 2) {
    const std::string p(PrecisionName(c.precision));
    return absl::StrCat(
        p, " inputs, K split in ", c.splitk, " slices each accumulated in fp32, ",
        c.reduce == SplitKReduce::kOutput
            ? absl::StrCat("the partial sums rounded to the output type and added in it: a "
                           "cuBLASLt split-K kernel with CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE, "
                           "which PyTorch allows by default for fp16 "
                           "(torch.backends.cuda.matmul.allow_",
                           p, "_reduced_precision_reduction = True)")
            : "the partial sums added in fp32 (a split-K kernel reducing in the compute type)",
        bias, cpu);
  }
  switch (c.precision) {
    case Precision::kFp64:
      if (storage == DType::kFloat64) return "fp64 matmul (numpy or torch float64)" + bias + cpu;
      // No framework's matmul on 16-bit or fp32 tensors accumulates in
      // fp64: this is a reference computation, upcast and rounded back.
      return absl::StrCat(s,
                          " tensors upcast to fp64, multiplied exactly and rounded back "
                          "(a float64 reference such as x.double() @ w.double().T, not "
                          "a framework's ",
                          s, " matmul)", bias, cpu);
    case Precision::kFp32:
      if (storage != DType::kFloat32 && storage != DType::kFloat64) {
        if (!has_bias) {
          return absl::StrCat(s,
                              " inputs with fp32 accumulation: the default of PyTorch, JAX/Flax "
                              "and candle for ",
                              s, " tensors", cpu);
        }
        return absl::StrCat(s, " inputs with fp32 accumulation",
                            unfused ? ": candle's default, or XLA/Flax (matmul, then the bias as "
                                      "its own op)"
                                    : ": PyTorch's default (addmm, the bias in the GEMM epilogue)",
                            bias, cpu);
      }
      if (!has_bias) {
        return "strict fp32 matmul: PyTorch >= 1.12's default (allow_tf32=False), candle's, "
               "or JAX with precision=HIGHEST" +
               cpu;
      }
      return (unfused ? "strict fp32 matmul with the bias as a separate op: candle's default, "
                        "or JAX with precision=HIGHEST"
                      : "strict fp32 matmul: PyTorch >= 1.12's default for fp32 "
                        "(allow_tf32=False)") +
             bias + cpu;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc: {
      const std::string rounding = c.precision == Precision::kTf32 ? ""
                                   : c.precision == Precision::kTf32Rna
                                       ? " (inputs rounded ties-away)"
                                       : " (inputs truncated to TF32)";
      if (!has_bias) {
        return "fp32 matmul in TF32: JAX/Flax's default on Ampere+ GPUs, PyTorch with "
               "allow_tf32=True, or TensorFlow fp32 on Ampere+" +
               rounding + cpu;
      }
      return (unfused ? "fp32 matmul in TF32 with the bias added separately: JAX/Flax's "
                        "default on Ampere+ GPUs"
                      : "fp32 matmul in TF32 with the bias in the GEMM epilogue: PyTorch with "
                        "allow_tf32=True, or TensorFlow fp32 on Ampere+") +
             rounding + cpu;
    }
    case Precision::kBf16:
    case Precision::kFp16: {
      const std::string name = c.precision == Precision::kBf16 ? "bf16" : "fp16";
      if (storage == DType::kFloat32 || storage == DType::kFloat64) {
        // Wider tensors multiplied in one 16-bit pass: a platform's or a
        // library's choice, not the tensors' dtype.
        const std::string pass =
            absl::StrCat(s, " tensors multiplied in one ", name, " pass (inputs rounded to ", name,
                         ", fp32 accumulation)");
        if (c.precision == Precision::kFp16) {
          return absl::StrCat(pass, ": cuBLAS's CUBLAS_COMPUTE_32F_FAST_16F", bias, cpu);
        }
        if (storage == DType::kFloat32 && (unfused || !has_bias)) {
          return absl::StrCat(pass,
                              ": JAX/XLA on TPU with the default precision (precision=DEFAULT)",
                              unfused ? ", the bias added as its own op" : "", bias, cpu);
        }
        return absl::StrCat(pass, ": cuBLAS's CUBLAS_COMPUTE_32F_FAST_16BF", bias, cpu);
      }
      if (!has_bias) {
        return absl::StrCat(name, " inputs, fp32 accumulation, output rounded to ", name,
                            ": the default of PyTorch, JAX/Flax and candle for ", name, " tensors",
                            cpu);
      }
      return absl::StrCat(
          unfused ? absl::StrCat("candle (or XLA/Flax) ", name, ": matmul rounded to ", name,
                                 ", then the bias added in ", name, " (two roundings)")
                  : absl::StrCat("PyTorch's ", name, " default: ", name,
                                 " inputs, fp32 accumulation, the bias added in the GEMM "
                                 "epilogue (cuBLASLt addmm), rounded once"),
          cpu);
    }
    case Precision::kFp16Acc:
      return "fp16 accumulation (CUBLAS_COMPUTE_16F), as in TensorRT fp16 kernels or "
             "torch with reduced-precision reductions" +
             bias + cpu;
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3: {
      const Fp8Operands o = Fp8OperandsOf(c.precision);
      return absl::StrCat(
          "torch._scaled_mm", c.fast_accum ? " with use_fast_accum=True" : "", " on ",
          DTypeName(o.input), " x ", DTypeName(o.weight), ", ",
          c.scaling == Fp8Scaling::kRow        ? "row-wise scales"
          : c.scaling == Fp8Scaling::kBlock128 ? "DeepSeek-V3 block-wise scales (1x128 input, "
                                                 "128x128 weight; DeepGEMM, TransformerEngine's "
                                                 "Float8BlockScaling)"
                                               : "per-tensor scales",
          IsFp8(storage)                       ? ""
          : c.scaling == Fp8Scaling::kBlock128 ? " from current (amax) scaling per block"
                                               : " from current (amax) scaling, as torchao's "
                                                 "Float8Linear",
          bias, cpu);
    }
    case Precision::kBf16x3:
    case Precision::kBf16x6:
    case Precision::kBf16x9:
    case Precision::kTf32x3:
      return MultiPassHint(c.precision, s) + (unfused ? ", the bias added as its own op" : "") +
             bias + cpu;
    case Precision::kMxFp8E4M3:
    case Precision::kMxFp8E5M2: {
      const std::string format = c.precision == Precision::kMxFp8E4M3 ? "e4m3" : "e5m2";
      if (IsNarrow(storage)) {
        return absl::StrCat("MXFP8 (", format,
                            " values, UE8M0 scales per 32 elements of K): torch._scaled_mm "
                            "with blocked scales, cuBLASLt VEC32_UE8M0",
                            bias, cpu);
      }
      return absl::StrCat(
          "MXFP8 (", format, ", 32-element blocks) from ",
          c.mx_rounding == MxScaleRounding::kFloor
              ? "torchao's MX recipe (MXLinear, floor scale rounding, the OCP spec's)"
              : "TransformerEngine's MXFP8BlockScaling (scales rounded up, as cuBLAS)",
          bias, cpu);
    }
    case Precision::kNvFp4:
      return absl::StrCat(IsNarrow(storage)
                              ? "NVFP4 (e2m1 values, e4m3 scales per 16 elements of K and a "
                                "per-tensor scale): cuBLASLt VEC16_UE4M3"
                              : "NVFP4 from TransformerEngine's NVFP4BlockScaling recipe (e2m1 "
                                "values, e4m3 scales per 16 elements, a per-tensor scale from "
                                "the amax)",
                          bias, cpu);
  }
  return "";
}

std::string FrameworkDefault(const Config& c, DType storage, bool has_bias) {
  const bool unfused = has_bias && c.bias == BiasMode::kUnfused;
  std::vector<std::string> names;
  switch (storage) {
    case DType::kFloat32:
      if (c.precision == Precision::kFp32 && !unfused) names.push_back("PyTorch's default");
      if (c.precision == Precision::kFp32 && (unfused || !has_bias)) {
        names.push_back("candle's default");
      }
      if (c.precision == Precision::kTf32 && (unfused || !has_bias)) {
        names.push_back("JAX/Flax's default on Ampere+ GPUs");
      }
      break;
    case DType::kBFloat16:
    case DType::kFloat16: {
      // 16-bit tensors multiply in their own precision, fp32 accumulation.
      const Precision own = storage == DType::kBFloat16 ? Precision::kBf16 : Precision::kFp16;
      if (c.precision != own) break;
      if (!unfused) names.push_back("PyTorch's default");
      if (unfused || !has_bias) names.push_back("candle's and JAX/Flax's default");
      break;
    }
    case DType::kFloat64:
      if (c.precision == Precision::kFp64) names.push_back("every framework's default");
      break;
    default:
      break;
  }
  if (names.empty()) return "";
  return absl::StrCat(absl::StrJoin(names, ", "), " for ", DTypeShortName(storage), " tensors");
}

Config PyTorchDefault(const std::string& backend, DType storage, bool has_bias) {
  Config c;
  c.backend = backend;
  c.bias = has_bias ? BiasMode::kFused : BiasMode::kNone;
  switch (storage) {
    case DType::kFloat64:
      c.precision = Precision::kFp64;
      break;
    case DType::kBFloat16:
      c.precision = Precision::kBf16;
      break;
    case DType::kFloat16:
      c.precision = Precision::kFp16;
      break;
    default:
      c.precision = Precision::kFp32;
      break;
  }
  return c;
}

// The rows of docs/numerics.md's "What to change" table, each a sentence
// fragment; HowToMatch joins the ones a pair of configurations needs.
std::string HowToMatch(const Config& from, const Config& to, DType storage, bool has_bias) {
  std::vector<std::string> steps;
  const Precision f = from.precision, t = to.precision;
  const bool split_from = from.splitk >= 2 && from.reduce == SplitKReduce::kOutput;
  const bool split_to = to.splitk >= 2 && to.reduce == SplitKReduce::kOutput;
  if (split_from && !split_to) {
    // The reduced-precision reduction of split-K's partials (docs/numerics.md,
    // "Split-K").
    steps.push_back(absl::StrCat(
        "reduce split-K's partial sums in fp32 (PyTorch: torch.backends.cuda.matmul.allow_",
        f == Precision::kFp16 ? "fp16" : "bf16", "_reduced_precision_reduction = False)"));
  } else if (split_to && !split_from && f == t) {
    steps.push_back(absl::StrCat(
        "allow split-K's partial sums in the output type (PyTorch: "
        "torch.backends.cuda.matmul.allow_",
        t == Precision::kFp16 ? "fp16" : "bf16", "_reduced_precision_reduction = True)"));
  }
  if (f != t) {
    if (IsFp8(f) || IsFp8(t)) {
      // Scaled FP8 GEMMs are chosen explicitly (torch._scaled_mm); no
      // switch turns one into another precision.
      return "";
    }
    if (IsMultiPass(t)) {
      steps.push_back(absl::StrCat("ask for the ", JaxPresetName(t),
                                   " dot algorithm (JAX: precision='", JaxPresetName(t), "'",
                                   t == Precision::kBf16x3   ? ", or precision=HIGH on TPU"
                                   : t == Precision::kBf16x6 ? ", or precision=HIGHEST on TPU"
                                                             : "",
                                   ")"));
    } else if (IsMultiPass(f) && (t == Precision::kFp32 || t == Precision::kBf16 || IsTf32(t)) &&
               !JaxPresetName(t).empty()) {
      steps.push_back(absl::StrCat("ask for the ", JaxPresetName(t), " dot algorithm instead of ",
                                   JaxPresetName(f), " (JAX: precision='", JaxPresetName(t), "')"));
    } else if (IsTf32(f) && t == Precision::kFp32) {
      steps.push_back(
          "turn TF32 off (PyTorch: torch.backends.cuda.matmul.allow_tf32 = False; JAX: "
          "jax_default_matmul_precision='highest' or precision=HIGHEST)");
    } else if (f == Precision::kFp32 && t == Precision::kTf32) {
      steps.push_back(
          "turn TF32 on (PyTorch: torch.backends.cuda.matmul.allow_tf32 = True; JAX does by "
          "default on Ampere+)");
    } else if (f == Precision::kFp16Acc && !IsTf32(t) && t != Precision::kFp64) {
      steps.push_back(
          "accumulate in fp32 (cuBLAS CUBLAS_COMPUTE_32F; PyTorch: "
          "allow_fp16_reduced_precision_reduction = False)");
    } else if (t == Precision::kFp64) {
      steps.push_back("compute in float64 (x.double() @ w.double().T)");
    } else if ((f == Precision::kBf16 || f == Precision::kFp16) &&
               (t == Precision::kFp32 || IsTf32(t)) && storage == DType::kFloat32) {
      // fp32 tensors that met one 16-bit pass: the platform's default
      // (JAX on TPU) or a cast on the way (autocast, a bf16 Flax dtype).
      steps.push_back(
          absl::StrCat("multiply the float32 tensors in float32, not one ", PrecisionName(f),
                       " pass (JAX, TPU's default: precision=HIGHEST or "
                       "jax_default_matmul_precision='highest'; PyTorch: no autocast; Flax: "
                       "dtype=jnp.float32)"));
    } else {
      // tf32rna/tf32trunc are kernel properties, fp32 accumulation of
      // 16-bit inputs under fp32 storage is a cast the user did: no switch.
      return "";
    }
  }
  const bool bias_differs = has_bias && from.bias != to.bias;
  if (bias_differs && to.bias == BiasMode::kFused) {
    steps.push_back(
        "add the bias before the one rounding (PyTorch's F.linear does; candle, JAX: matmul "
        "into f32, add the bias in f32, round once)");
  } else if (bias_differs && to.bias == BiasMode::kUnfused) {
    steps.push_back(
        "round the GEMM, then add the bias (PyTorch: x @ w.T, then + b; candle's Linear and "
        "Flax's Dense do)");
  }
  if (steps.empty()) return "";
  std::string first = steps[0];
  first[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(first[0])));
  steps[0] = first;
  return absl::StrCat(absl::StrJoin(steps, "; and "), ".");
}

}  // namespace tensorcheck
