#include "core/linear_config.h"

#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/multi_pass_split.h"

namespace tensorcheck {

namespace {

template <typename Enum, size_t N>
absl::StatusOr<Enum> ParseNamed(absl::string_view name,
                                const std::pair<absl::string_view, Enum> (&table)[N],
                                absl::string_view what) {
  std::string accepted;
  for (const auto& [n, e] : table) {
    if (n == name) return e;
    absl::StrAppend(&accepted, accepted.empty() ? "" : ", ", n);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown ", what, " '", name, "': expected one of ", accepted));
}

constexpr std::pair<absl::string_view, Precision> kPrecisionNames[] = {
    {"fp64", Precision::kFp64},
    {"fp32", Precision::kFp32},
    {"tf32", Precision::kTf32},
    {"tf32rna", Precision::kTf32Rna},
    {"tf32trunc", Precision::kTf32Trunc},
    {"bf16", Precision::kBf16},
    {"fp16", Precision::kFp16},
    {"fp16acc", Precision::kFp16Acc},
    {"fp8e4m3", Precision::kFp8E4M3},
    {"fp8e5m2", Precision::kFp8E5M2},
    {"fp8e4m3e5m2", Precision::kFp8E4M3E5M2},
    {"fp8e5m2e4m3", Precision::kFp8E5M2E4M3},
    {"bf16x3", Precision::kBf16x3},
    {"bf16x6", Precision::kBf16x6},
    {"bf16x9", Precision::kBf16x9},
    {"tf32x3", Precision::kTf32x3},
    {"mxfp8e4m3", Precision::kMxFp8E4M3},
    {"mxfp8e5m2", Precision::kMxFp8E5M2},
    {"nvfp4", Precision::kNvFp4},
};

// `jax=` aliases: jax.lax.DotAlgorithmPreset names whose computation one
// precision emulates (docs/numerics.md, "Multi-pass precisions").
constexpr absl::string_view kJaxAliasPrefix = "jax=";

constexpr std::pair<absl::string_view, Fp8Scaling> kScalingNames[] = {
    {"tensor", Fp8Scaling::kTensor},
    {"row", Fp8Scaling::kRow},
    {"block128", Fp8Scaling::kBlock128},
};

constexpr std::pair<absl::string_view, MxScaleRounding> kMxRoundingNames[] = {
    {"floor", MxScaleRounding::kFloor},
    {"rceil", MxScaleRounding::kRceil},
};

constexpr std::pair<absl::string_view, SplitKReduce> kReduceNames[] = {
    {"output", SplitKReduce::kOutput},
    {"fp32", SplitKReduce::kFp32},
};

constexpr std::pair<absl::string_view, BiasMode> kBiasNames[] = {
    {"none", BiasMode::kNone},
    {"fused", BiasMode::kFused},
    {"unfused", BiasMode::kUnfused},
};

constexpr std::pair<absl::string_view, Activation> kActivationNames[] = {
    {"none", Activation::kNone},
    {"relu", Activation::kRelu},
    {"gelu", Activation::kGeluTanh},
};

constexpr std::pair<absl::string_view, WeightLayout> kLayoutNames[] = {
    {"out_in", WeightLayout::kOutIn},
    {"in_out", WeightLayout::kInOut},
};

template <typename Enum, size_t N>
absl::string_view NameOf(Enum e, const std::pair<absl::string_view, Enum> (&table)[N]) {
  for (const auto& [n, v] : table) {
    if (v == e) return n;
  }
  return "unknown";
}

}  // namespace

absl::string_view PrecisionName(Precision p) { return NameOf(p, kPrecisionNames); }

const std::vector<JaxPreset>& JaxPresetPrecisions() {
  static const auto* presets = new std::vector<JaxPreset>{
      {"F64_F64_F64", Precision::kFp64},        {"F32_F32_F32", Precision::kFp32},
      {"TF32_TF32_F32", Precision::kTf32},      {"TF32_TF32_F32_X3", Precision::kTf32x3},
      {"BF16_BF16_F32", Precision::kBf16},      {"BF16_BF16_F32_X3", Precision::kBf16x3},
      {"BF16_BF16_F32_X6", Precision::kBf16x6}, {"BF16_BF16_F32_X9", Precision::kBf16x9},
      {"F16_F16_F32", Precision::kFp16},
  };
  return *presets;
}

absl::string_view JaxPresetName(Precision p) {
  for (const JaxPreset& preset : JaxPresetPrecisions()) {
    if (preset.precision == p) return preset.name;
  }
  return "";
}

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (absl::StartsWith(name, kJaxAliasPrefix)) {
    const absl::string_view preset = name.substr(kJaxAliasPrefix.size());
    std::string known;
    for (const JaxPreset& p : JaxPresetPrecisions()) {
      if (p.name == preset) return p.precision;
      absl::StrAppend(&known, known.empty() ? "" : ", ", p.name);
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown JAX dot-algorithm preset '", preset,
                                                   "' in precision '", name,
                                                   "': expected jax= followed by one of ", known));
  }
  return ParseNamed(name, kPrecisionNames, "precision");
}

std::string PartialSumOrder(const MultiPassScheme& scheme) {
  static constexpr const char* kTwo[] = {"hi", "lo"};
  static constexpr const char* kThree[] = {"hi", "mid", "lo"};
  const char* const* names = scheme.parts == 2 ? kTwo : kThree;
  std::string order;
  for (size_t t = 0; t < scheme.products.size(); ++t) {
    if (t + 1 == scheme.products.size()) absl::StrAppend(&order, ", NaN -> 0");
    absl::StrAppend(&order, t == 0 ? "" : " + ", names[scheme.products[t].first], "*",
                    names[scheme.products[t].second]);
  }
  return order;
}

MultiPassScheme MultiPassSchemeOf(Precision p) {
  MultiPassScheme s;
  switch (p) {
    case Precision::kBf16x6:
      // xla/hlo/transforms/dot_algorithm_rewriter.cc, RewriteF32ToBF16X6.
      s.parts = 3;
      s.products = {{1, 1}, {0, 2}, {2, 0}, {0, 1}, {1, 0}, {0, 0}};
      break;
    case Precision::kBf16x9:
      // xla/backends/gpu/codegen/triton/dot_algorithms.cc, EmitBF16x9Matmul.
      s.parts = 3;
      s.products = {{2, 2}, {1, 2}, {2, 1}, {1, 1}, {2, 0}, {0, 2}, {1, 0}, {0, 1}, {0, 0}};
      break;
    case Precision::kTf32x3:
      // Triton's F32DotTC pass (TF32x3), as XLA's TF32_TF32_F32_X3 runs it.
      s.tf32 = true;
      s.products = {{1, 0}, {0, 1}, {0, 0}};
      break;
    default:
      // kBf16x3: dot_algorithm_rewriter.cc, RewriteF32ToBF16X3.
      s.products = {{1, 0}, {0, 1}, {0, 0}};
      break;
  }
  return s;
}

void SplitMultiPass(const MultiPassScheme& scheme, float v, float* parts) {
  // core/multi_pass_split.h: the same code as the cuda backends' split kernel.
  SplitMultiPassValue(scheme.parts, scheme.tf32, v, parts);
}

absl::string_view Fp8ScalingName(Fp8Scaling s) { return NameOf(s, kScalingNames); }

absl::string_view MxScaleRoundingName(MxScaleRounding r) { return NameOf(r, kMxRoundingNames); }

absl::string_view SplitKReduceName(SplitKReduce r) { return NameOf(r, kReduceNames); }

BlockScaledOperands BlockScaledOperandsOf(Precision p) {
  switch (p) {
    case Precision::kMxFp8E5M2:
      return {DType::kFloat8E5M2, DType::kFloat8E8M0Fnu, 32};
    case Precision::kNvFp4:
      return {DType::kFloat4E2M1Fn, DType::kFloat8E4M3Fn, 16};
    default:
      return {DType::kFloat8E4M3Fn, DType::kFloat8E8M0Fnu, 32};
  }
}

Fp8Operands Fp8OperandsOf(Precision p) {
  switch (p) {
    case Precision::kFp8E5M2:
      return {DType::kFloat8E5M2, DType::kFloat8E5M2};
    case Precision::kFp8E4M3E5M2:
      return {DType::kFloat8E4M3Fn, DType::kFloat8E5M2};
    case Precision::kFp8E5M2E4M3:
      return {DType::kFloat8E5M2, DType::kFloat8E4M3Fn};
    default:
      return {DType::kFloat8E4M3Fn, DType::kFloat8E4M3Fn};
  }
}

absl::string_view BiasModeName(BiasMode b) { return NameOf(b, kBiasNames); }
absl::StatusOr<BiasMode> ParseBiasMode(absl::string_view name) {
  return ParseNamed(name, kBiasNames, "bias mode");
}

absl::string_view ActivationName(Activation a) { return NameOf(a, kActivationNames); }
absl::StatusOr<Activation> ParseActivation(absl::string_view name) {
  return ParseNamed(name, kActivationNames, "activation");
}

absl::string_view WeightLayoutName(WeightLayout l) { return NameOf(l, kLayoutNames); }
absl::StatusOr<WeightLayout> ParseWeightLayout(absl::string_view name) {
  return ParseNamed(name, kLayoutNames, "weight layout");
}

PrecisionInfo GetPrecisionInfo(Precision p) {
  constexpr double kFp32U = 0x1p-24;
  constexpr double kFp64U = 0x1p-53;
  constexpr double kHalfU = 0x1p-11;  // tf32 and fp16 (10-bit mantissa)
  constexpr double kBf16U = 0x1p-8;
  // Quantising to FP8 (normal range, where the recipes' scales put the
  // values): 3 or 2 fraction bits.
  constexpr double kE4M3U = 0x1p-4;
  constexpr double kE5M2U = 0x1p-3;
  switch (p) {
    case Precision::kFp64:
      return {0.0, kFp64U, false, std::nullopt};
    case Precision::kFp32:
      return {0.0, kFp32U, false, std::nullopt};
    case Precision::kTf32:
      return {kHalfU, kFp32U, false, Tf32Rounding::kNearestEven};
    case Precision::kTf32Rna:
      return {kHalfU, kFp32U, false, Tf32Rounding::kTiesAway};
    case Precision::kTf32Trunc:
      // Truncation errs up to a whole unit, one-sided.
      return {2 * kHalfU, kFp32U, false, Tf32Rounding::kTruncate};
    case Precision::kBf16:
      return {kBf16U, kFp32U, false, std::nullopt};
    case Precision::kFp16:
      return {kHalfU, kFp32U, false, std::nullopt};
    case Precision::kFp16Acc:
      return {kHalfU, kHalfU, true, std::nullopt};
    case Precision::kFp8E4M3:
      return {kE4M3U, kFp32U, false, std::nullopt};
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
      return {kE5M2U, kFp32U, false, std::nullopt};
    // Multi-pass: the residual of the split and the products left out, as
    // an input unit: per product a relative error of mean square
    // (2/3) u_input^2 (docs/numerics.md, "Multi-pass precisions", measured
    // over 2e6 Gaussian pairs: rms 1.29e-5 for bf16x3, 6.0e-8 bf16x6,
    // 7.5e-8 tf32x3, 0 for bf16x9, whose three parts hold every bit).
    case Precision::kBf16x3:
      return {0x1p-16, kFp32U, false, std::nullopt};
    case Precision::kBf16x6:
      return {0x1.4p-24, kFp32U, false, std::nullopt};
    case Precision::kBf16x9:
      return {0.0, kFp32U, false, std::nullopt};
    case Precision::kTf32x3:
      return {0x1.8p-24, kFp32U, false, std::nullopt};
    // Block-scaled: the values' format (a block's largest values use its
    // whole range; the products and their fp32 sum are the GEMM's).
    case Precision::kMxFp8E4M3:
      return {kE4M3U, kFp32U, false, std::nullopt};
    case Precision::kMxFp8E5M2:
      return {kE5M2U, kFp32U, false, std::nullopt};
    case Precision::kNvFp4:
      return {0x1p-2, kFp32U, false, std::nullopt};
  }
  return {0.0, kFp32U, false, std::nullopt};
}

int InputSignificandBits(Precision p) {
  switch (p) {
    case Precision::kFp64:
      return 53;
    case Precision::kFp32:
      return 24;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return 11;
    case Precision::kBf16:
    case Precision::kBf16x3:
    case Precision::kBf16x6:
    case Precision::kBf16x9:
      return 8;
    case Precision::kTf32x3:
      return 11;
    case Precision::kFp8E4M3:
    case Precision::kMxFp8E4M3:
      return 4;
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
    case Precision::kMxFp8E5M2:
      return 3;
    case Precision::kNvFp4:
      return 2;
  }
  return 24;
}

float RoundInput(Precision p, float v) {
  switch (p) {
    case Precision::kFp64:
    case Precision::kFp32:
      return v;
    case Precision::kTf32:
      return RoundToTf32(v, Tf32Rounding::kNearestEven);
    case Precision::kTf32Rna:
      return RoundToTf32(v, Tf32Rounding::kTiesAway);
    case Precision::kTf32Trunc:
      return RoundToTf32(v, Tf32Rounding::kTruncate);
    case Precision::kBf16:
      return RoundToBf16(v);
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return RoundToFp16(v);
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
      // Unscaled: the input's format as is (the recipes scale first).
      return RoundToDType(v, Fp8OperandsOf(p).input);
    case Precision::kMxFp8E4M3:
    case Precision::kMxFp8E5M2:
    case Precision::kNvFp4:
      return RoundToDType(v, BlockScaledOperandsOf(p).values);
    case Precision::kBf16x3:
    case Precision::kBf16x6:
    case Precision::kBf16x9:
    case Precision::kTf32x3: {
      const MultiPassScheme scheme = MultiPassSchemeOf(p);
      float parts[3] = {0, 0, 0};
      SplitMultiPass(scheme, v, parts);
      // Largest first: exact (the parts hold disjoint bits of v, or v's
      // bits and one rounding of the rest).
      return (parts[0] + parts[1]) + parts[2];
    }
  }
  return v;
}

bool StorageExactIn(Precision p, DType storage) {
  switch (p) {
    case Precision::kFp64:
      return true;
    case Precision::kFp32:
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
      // bf16 (8 significant bits) and fp16 (11) values lie in fp32's
      // exponent range: exact in TF32 and fp32.
      return storage != DType::kFloat64 && (p == Precision::kFp32 || storage != DType::kFloat32);
    case Precision::kBf16:
      return storage == DType::kBFloat16;
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return storage == DType::kFloat16;
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
      // FP8 storage is multiplied as it is (the engine checks the formats
      // match the precision's); wide inputs are quantised.
      return IsFp8(storage);
    // Multi-pass: exact when no product it leaves out can be non-zero.
    // bf16 values are their own high part (every other part 0); fp16's 11
    // bits fill a TF32 high part, and bf16x6's high and middle parts.
    // bf16x9 forms every product of parts that hold every bit of an fp32
    // value (parts below bf16's subnormals aside).
    case Precision::kBf16x3:
      return storage == DType::kBFloat16;
    case Precision::kBf16x6:
    case Precision::kTf32x3:
      return storage == DType::kBFloat16 || storage == DType::kFloat16;
    case Precision::kBf16x9:
      return storage != DType::kFloat64 && !IsNarrow(storage);
    case Precision::kMxFp8E4M3:
    case Precision::kMxFp8E5M2:
    case Precision::kNvFp4:
      // As the fp8 precisions: narrow storage multiplied as it is.
      return IsNarrow(storage);
  }
  return false;
}

bool ValuesExactIn(Precision p, const Tensor& t) {
  if (StorageExactIn(p, t.dtype())) return true;
  if (IsMultiPass(p)) {
    // A value is exact when its high part alone holds it (bf16x6 and
    // bf16x9: its high and middle parts), so that every product left out
    // has a zero factor.
    const MultiPassScheme scheme = MultiPassSchemeOf(p);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = t.GetDouble(i);
      const float f = static_cast<float>(v);
      if (static_cast<double>(f) != v) return false;
      float parts[3] = {0, 0, 0};
      SplitMultiPass(scheme, f, parts);
      if (parts[scheme.parts - 1] != 0 || parts[0] + parts[1] + parts[2] != f) return false;
    }
    return true;
  }
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = t.GetDouble(i);
    const float f = static_cast<float>(v);
    if (static_cast<double>(f) != v || RoundInput(p, f) != f) return false;
  }
  return true;
}

namespace {

// Applies the `@` options of `spec` (already split off) to `out`:
// `algo=N` for any precision, `scaling=...` and `fast_accum` for the fp8
// ones.
absl::Status ParseConfigOptions(absl::string_view options, absl::string_view spec,
                                absl::string_view field, ConfigSpec* out) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(field, " '", spec, "': ", what));
  };
  bool seen_scaling = false, seen_fast = false, seen_reduce = false, seen_tile = false;
  for (absl::string_view option : absl::StrSplit(options, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(option, absl::MaxSplits('=', 1));
    const bool mx =
        out->precision == Precision::kMxFp8E4M3 || out->precision == Precision::kMxFp8E5M2;
    const bool fp8_option = (kv.first == "scaling" && !mx) || kv.first == "fast_accum";
    if (fp8_option && !IsFp8(out->precision)) {
      return error(
          absl::StrCat("option '", kv.first, "' applies to the fp8 precisions only",
                       kv.first == "scaling" ? " (and, as floor or rceil, the mxfp8 ones)" : "",
                       ", not ", PrecisionName(out->precision)));
    }
    const bool split_option = kv.first == "splitk" || kv.first == "reduce";
    if (split_option && !TakesSplitK(out->precision)) {
      return error(absl::StrCat("option '", kv.first,
                                "' applies to the bf16 and fp16 precisions only, not ",
                                PrecisionName(out->precision)));
    }
    if (kv.first == "splitk" && out->splitk == 0) {
      int splitk = -1;
      if (!absl::SimpleAtoi(kv.second, &splitk) || splitk < 2 || splitk > kMaxSplitK ||
          absl::StrCat(splitk) != kv.second) {
        return error(absl::StrCat("option '", option, "': splitk=N expects an integer N from 2 to ",
                                  kMaxSplitK));
      }
      out->splitk = splitk;
      continue;
    }
    if (kv.first == "reduce" && !seen_reduce) {
      auto reduce = ParseNamed(kv.second, kReduceNames, "split-K reduction");
      if (!reduce.ok()) return error(reduce.status().message());
      out->reduce = *reduce;
      seen_reduce = true;
      continue;
    }
    const bool replay_option = kv.first == "mma" || kv.first == "tile_k" || kv.first == "residue";
    if (replay_option && !TakesMma(out->precision)) {
      return error(absl::StrCat("option '", kv.first,
                                "' applies to bf16, fp16, the tf32 and the fp8 precisions only, "
                                "not ",
                                PrecisionName(out->precision)));
    }
    if (kv.first == "mma" && !out->mma.has_value()) {
      auto gpu = ParseTensorCoreGpu(kv.second, "mma");
      if (!gpu.ok()) return error(gpu.status().message());
      out->mma = *gpu;
      continue;
    }
    if (kv.first == "tile_k" && !seen_tile) {
      int64_t tile = -1;
      if (!absl::SimpleAtoi(kv.second, &tile) || tile < 1 || tile > kMaxTileK ||
          absl::StrCat(tile) != kv.second) {
        return error(absl::StrCat("option '", option, "': tile_k=N expects an integer N from 1 to ",
                                  kMaxTileK));
      }
      out->tile_k = tile;
      seen_tile = true;
      continue;
    }
    if (kv.first == "residue" && !out->residue.has_value()) {
      if (kv.second != "first" && kv.second != "last") {
        return error(absl::StrCat("option '", option, "': residue=first or residue=last expected"));
      }
      out->residue = kv.second == "first" ? KResidue::kFirst : KResidue::kLast;
      continue;
    }
    if (kv.first == "algo" && !out->algo.has_value()) {
      int algo = -1;
      if (!absl::SimpleAtoi(kv.second, &algo) || algo < 0 || algo > kMaxAlgorithmIndex ||
          absl::StrCat(algo) != kv.second) {
        return error(absl::StrCat("option '", option, "': algo=N expects an integer N from 0 to ",
                                  kMaxAlgorithmIndex));
      }
      out->algo = algo;
    } else if (kv.first == "scaling" && !seen_scaling && mx) {
      auto rounding = ParseNamed(kv.second, kMxRoundingNames, "mxfp8 scaling");
      if (!rounding.ok()) return error(rounding.status().message());
      out->mx_rounding = *rounding;
      seen_scaling = true;
    } else if (kv.first == "scaling" && !seen_scaling) {
      auto scaling = ParseNamed(kv.second, kScalingNames, "scaling");
      if (!scaling.ok()) return error(scaling.status().message());
      out->scaling = *scaling;
      seen_scaling = true;
    } else if (kv.first == "fast_accum" && !seen_fast && option == "fast_accum") {
      out->fast_accum = true;
      seen_fast = true;
    } else {
      return error(absl::StrCat("unknown or repeated option '", option,
                                "': expected algo=N, for the fp8 precisions scaling=tensor, "
                                "scaling=row, scaling=block128 or fast_accum, for the mxfp8 "
                                "ones scaling=floor or scaling=rceil, for bf16 and fp16 "
                                "splitk=N and reduce=output|fp32, for a kernel replay "
                                "mma=sm80|sm90|sm100, tile_k=N and residue=first|last"));
    }
  }
  if (out->reduce.has_value() && out->splitk == 0) {
    return error("option 'reduce' needs splitk=N (the reduction of split-K's partial results)");
  }
  if ((seen_tile || out->residue.has_value()) && !out->mma.has_value()) {
    return error("options 'tile_k' and 'residue' need mma=sm80|sm90|sm100 (the kernel replayed)");
  }
  if (out->residue.has_value() && !seen_tile) {
    return error("option 'residue' needs tile_k=N (where the partial K tile goes)");
  }
  if (out->mma.has_value()) {
    if (IsFp8(out->precision) && *out->mma == TensorCoreGpu::kSm80) {
      return error("option 'mma=sm80': the A100 has no FP8 tensor cores (sm90 or sm100)");
    }
    if (IsFp8(out->precision) && out->scaling == Fp8Scaling::kBlock128) {
      return error("option 'mma' with scaling=block128 is not modelled (per tensor or row)");
    }
    Config probe;
    probe.precision = out->precision;
    probe.mma = out->mma;
    const std::optional<KernelOrder> order = KernelOrderOf(probe);
    if (seen_tile && out->tile_k % order->model.block != 0) {
      return error(absl::StrCat("option 'tile_k=", out->tile_k, "': a multiple of ",
                                order->model.block, " (the ", TensorCoreGpuName(*out->mma),
                                " model's inner product for ", PrecisionName(out->precision),
                                ") expected"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ConfigSpec> ParseConfigSpec(absl::string_view spec, absl::string_view field) {
  const std::pair<absl::string_view, absl::string_view> at =
      absl::StrSplit(spec, absl::MaxSplits('@', 1));
  const std::vector<absl::string_view> parts = absl::StrSplit(at.first, ':');
  const bool has_options = at.first.size() < spec.size();
  if (parts.size() < 2 || parts.size() > 3 || parts[0].empty() ||
      (has_options && at.second.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(field,
                     ": 'backend:precision[:bias][@option,...]' expected (e.g. cpu:fp32, "
                     "cublaslt:bf16:fused, cublaslt:fp8e4m3:fused@scaling=row, "
                     "cublaslt:fp32:fused@algo=2), got '",
                     spec, "'"));
  }
  ConfigSpec out;
  out.backend = std::string(parts[0]);
  auto precision = ParsePrecision(parts[1]);
  if (!precision.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " '", spec, "': ", precision.status().message()));
  }
  out.precision = *precision;
  if (parts.size() == 3) {
    auto bias = ParseBiasMode(parts[2]);
    if (!bias.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " '", spec, "': ", bias.status().message()));
    }
    out.bias = *bias;
  }
  if (has_options) {
    absl::Status options = ParseConfigOptions(at.second, spec, field, &out);
    if (!options.ok()) return options;
  }
  return out;
}

std::string Config::ToString() const {
  std::vector<std::string> options;
  const bool mx = precision == Precision::kMxFp8E4M3 || precision == Precision::kMxFp8E5M2;
  if (IsFp8(precision)) {
    options.push_back(absl::StrCat("scaling=", Fp8ScalingName(scaling)));
    if (fast_accum) options.push_back("fast_accum");
  } else if (mx) {
    options.push_back(absl::StrCat("scaling=", MxScaleRoundingName(mx_rounding)));
  }
  if (TakesSplitK(precision) && splitk >= 2) {
    options.push_back(absl::StrCat("splitk=", splitk));
    options.push_back(absl::StrCat("reduce=", SplitKReduceName(reduce)));
  }
  if (mma.has_value()) {
    options.push_back(absl::StrCat("mma=", TensorCoreGpuName(*mma)));
    if (tile_k > 0) options.push_back(absl::StrCat("tile_k=", tile_k));
    if (tile_k > 0 && residue == KResidue::kFirst) options.push_back("residue=first");
  }
  if (algo.has_value()) options.push_back(absl::StrCat("algo=", *algo));
  std::string s = absl::StrCat(backend, ":", PrecisionName(precision), ":", BiasModeName(bias));
  if (!options.empty()) absl::StrAppend(&s, "@", absl::StrJoin(options, ","));
  return s;
}

std::optional<KernelOrder> KernelOrderOf(const Config& c) {
  if (!c.mma.has_value() || !TakesMma(c.precision)) return std::nullopt;
  TensorCoreInput a = TensorCoreInput::kBf16, b = TensorCoreInput::kBf16;
  switch (c.precision) {
    case Precision::kFp16:
      a = b = TensorCoreInput::kFp16;
      break;
    case Precision::kTf32:
    case Precision::kTf32Rna:
    case Precision::kTf32Trunc:
      a = b = TensorCoreInput::kTf32;
      break;
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3: {
      const Fp8Operands f = Fp8OperandsOf(c.precision);
      a = f.input == DType::kFloat8E5M2 ? TensorCoreInput::kE5M2 : TensorCoreInput::kE4M3;
      b = f.weight == DType::kFloat8E5M2 ? TensorCoreInput::kE5M2 : TensorCoreInput::kE4M3;
      break;
    }
    default:
      break;
  }
  absl::StatusOr<TensorCoreModel> model = TensorCoreModelFor(*c.mma, a, b);
  if (!model.ok()) return std::nullopt;  // FP8 on sm80: refused when parsed
  KernelOrder order;
  order.model = *model;
  order.tile_k = c.tile_k;
  order.residue = c.residue;
  if (IsFp8(c.precision) && !c.fast_accum) {
    order.promote = c.tile_k > 0 ? c.tile_k : kDefaultFp8PromoteK;
  }
  return order;
}

Config ResolveConfig(const ConfigSpec& spec, bool has_bias, Activation activation,
                     BiasMode backend_default, Fp8Scaling request_scaling) {
  Config c;
  c.backend = spec.backend;
  c.precision = spec.precision;
  if (IsFp8(spec.precision)) {
    c.scaling = spec.scaling.value_or(request_scaling);
    c.fast_accum = spec.fast_accum;
  }
  if (spec.precision == Precision::kMxFp8E4M3 || spec.precision == Precision::kMxFp8E5M2) {
    c.mx_rounding = spec.mx_rounding.value_or(MxScaleRounding::kFloor);
  }
  if (TakesSplitK(spec.precision) && spec.splitk >= 2) {
    c.splitk = spec.splitk;
    c.reduce = spec.reduce.value_or(SplitKReduce::kOutput);
  }
  if (TakesMma(spec.precision) && spec.mma.has_value()) {
    c.mma = spec.mma;
    c.tile_k = spec.tile_k;
    c.residue = spec.tile_k > 0 ? spec.residue.value_or(KResidue::kLast) : KResidue::kLast;
  }
  c.algo = spec.algo;
  // ReLU commutes with round-to-nearest (it is monotone and odd-symmetric
  // at zero), so without a bias only GELU can tell the placements apart.
  const bool placement_matters = has_bias || activation == Activation::kGeluTanh;
  if (!placement_matters) {
    c.bias = BiasMode::kNone;
  } else if (spec.bias.has_value() && *spec.bias != BiasMode::kNone) {
    c.bias = *spec.bias;
  } else {
    c.bias = backend_default;
  }
  return c;
}

bool ConfigPattern::Matches(const Config& c) const {
  if (backend.has_value() && *backend != c.backend) return false;
  if (precision != c.precision) return false;
  if (!bias.has_value() || *bias == c.bias) return true;
  return *bias == BiasMode::kFused && c.bias == BiasMode::kNone;
}

std::string ConfigPattern::ToString() const {
  std::string s = backend.has_value() ? absl::StrCat(*backend, ":") : "";
  absl::StrAppend(&s, PrecisionName(precision));
  if (bias.has_value()) absl::StrAppend(&s, ":", BiasModeName(*bias));
  return s;
}

absl::StatusOr<ConfigPattern> ParseConfigPattern(absl::string_view text, absl::string_view field) {
  const std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  auto malformed = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", text, "' ", why,
                     "; expected precision[:bias] or backend:precision[:bias] (e.g. tf32, "
                     "bf16:unfused, cpu:fp32:fused)"));
  };
  if (parts.empty() || parts.size() > 3 ||
      absl::c_any_of(parts, [](absl::string_view p) { return p.empty(); })) {
    return malformed("is malformed");
  }
  ConfigPattern out;
  size_t next = 0;
  // The first part is a precision, or else the backend.
  if (!ParsePrecision(parts[0]).ok()) {
    if (parts.size() == 1) return malformed("names no precision");
    out.backend = std::string(parts[0]);
    next = 1;
  }
  absl::StatusOr<Precision> precision = ParsePrecision(parts[next]);
  if (!precision.ok()) return malformed(precision.status().message());
  out.precision = *precision;
  if (++next < parts.size()) {
    absl::StatusOr<BiasMode> bias = ParseBiasMode(parts[next]);
    if (!bias.ok()) return malformed(bias.status().message());
    out.bias = *bias;
    if (++next < parts.size()) return malformed("has a part after the bias");
  }
  return out;
}

}  // namespace tensorcheck
