#include "server/backends/cuda/internal/replay_rules.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cuda/internal/splitk_rules.h"

namespace tensorcheck::cuda::internal {
namespace {

absl::Status NoReplay(absl::string_view why) { return absl::FailedPreconditionError(why); }

}  // namespace

std::optional<int64_t> StagesTileK(uint32_t stages_id) {
  if (stages_id == 0) return int64_t{0};  // CUBLASLT_MATMUL_STAGES_UNDEFINED
  for (const LtStages& s : kLtStages) {
    if (s.id == stages_id) return int64_t{s.k};
  }
  return std::nullopt;
}

std::string LtStagesName(uint32_t stages_id) {
  if (stages_id == 0) return "UNDEFINED";
  for (const LtStages& s : kLtStages) {
    if (s.id == stages_id) {
      return s.count == 0 ? absl::StrCat(s.k, "xAUTO") : absl::StrCat(s.k, "x", s.count);
    }
  }
  return absl::StrCat("id ", stages_id);
}

std::optional<TensorCoreGpu> ReplayGeneration(ComputeCapability cc) {
  if (cc.major == 8 && (cc.minor == 0 || cc.minor == 6 || cc.minor == 9)) {
    return TensorCoreGpu::kSm80;
  }
  if (cc.major == 9 && cc.minor == 0) return TensorCoreGpu::kSm90;
  if (cc.major == 10 && cc.minor == 0) return TensorCoreGpu::kSm100;
  return std::nullopt;
}

absl::StatusOr<SplitKReduce> ReplayReduce(uint32_t scheme, DType d, DType out) {
  switch (static_cast<LtReductionScheme>(scheme)) {
    case LtReductionScheme::kComputeType:
      return SplitKReduce::kFp32;
    case LtReductionScheme::kOutputType:
      if (d == DType::kFloat32) return SplitKReduce::kFp32;
      if (d == out) return SplitKReduce::kOutput;
      return NoReplay(absl::StrCat("CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE reduces in D's type ",
                                   DTypeName(d), ", and the output is ", DTypeName(out),
                                   ": reduce=output rounds to the output's"));
    case LtReductionScheme::kInplace:
      if (d == DType::kFloat32) return SplitKReduce::kFp32;
      return NoReplay(absl::StrCat(
          "CUBLASLT_REDUCTION_SCHEME_INPLACE adds each slice's fp32 partial to the running ",
          DTypeName(d),
          " output (cublasLt.h: \"using the output buffer (and output data type)\"); "
          "reduce=output rounds each partial before adding it and reduce=fp32 rounds once, "
          "so neither is that sum"));
    case LtReductionScheme::kNone:
      break;
  }
  return NoReplay(absl::StrCat("split-K with reduction scheme ", scheme,
                               " (not COMPUTE_TYPE, OUTPUT_TYPE or INPLACE): no reduction to "
                               "replay"));
}

bool ReplayApplies(const Config& config) { return TakesMma(config.precision); }

absl::StatusOr<std::string> ReplayConfig(const ReplayRun& run, const LtAlgoConfig& algo) {
  const Config& c = run.config;
  const absl::string_view precision = PrecisionName(c.precision);
  if (!ReplayApplies(c)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no kernel replay for ", precision, " (bf16, fp16, tf32 and the fp8 precisions have one)"));
  }
  if (c.precision == Precision::kTf32Rna || c.precision == Precision::kTf32Trunc) {
    return NoReplay(
        absl::StrCat(precision,
                     " runs on the device as inputs rounded by a kernel, then a strict-fp32 GEMM "
                     "(CUBLAS_COMPUTE_32F_PEDANTIC): no TF32 tensor-core kernel to replay"));
  }
  const std::optional<TensorCoreGpu> gen = ReplayGeneration(run.device);
  if (!gen.has_value()) {
    return NoReplay(absl::StrCat("compute capability ", run.device.major, ".", run.device.minor,
                                 " has no tensor-core model (8.0, 8.6, 8.9 sm80; 9.0 sm90; "
                                 "10.0 sm100)"));
  }
  if (IsFp8(c.precision) && *gen == TensorCoreGpu::kSm80) {
    return NoReplay(absl::StrCat("compute capability ", run.device.major, ".", run.device.minor,
                                 " replays as sm80, whose model has no FP8 tensor cores"));
  }
  if (IsFp8(c.precision) && c.scaling == Fp8Scaling::kBlock128) {
    return NoReplay("scaling=block128 is not modelled (per tensor or row)");
  }
  if (!algo.stages.has_value() || !algo.splitk.has_value() || !algo.scheme.has_value()) {
    return NoReplay(
        "cuBLASLt did not tell the algorithm's stages, split-K count or reduction scheme");
  }
  const std::optional<int64_t> tile_k = StagesTileK(*algo.stages);
  if (!tile_k.has_value()) {
    return NoReplay(absl::StrCat("stages id ", *algo.stages,
                                 " is not in this build's cublasLt.h (its K is unknown)"));
  }

  Config r;
  r.backend = "cpu";
  r.precision = c.precision;
  r.bias = c.bias;
  if (IsFp8(c.precision)) {
    r.scaling = c.scaling;
    r.fast_accum = c.fast_accum;
  }
  if (*algo.splitk > 1) {
    if (!TakesSplitK(c.precision)) {
      return NoReplay(absl::StrCat("the kernel splits K in ", *algo.splitk,
                                   " and the CPU's split-K covers bf16 and fp16 only, not ",
                                   precision));
    }
    if (*algo.splitk > kMaxSplitK) {
      return NoReplay(absl::StrCat("the kernel splits K in ", *algo.splitk,
                                   ", more than a configuration names (", kMaxSplitK, ")"));
    }
    TC_ASSIGN_OR_RETURN(r.reduce, ReplayReduce(*algo.scheme, run.d, run.out));
    r.splitk = *algo.splitk;
  }
  r.mma = *gen;
  r.tile_k = *tile_k;
  // Where the partial K tile goes is not told (replay_rules.h): the
  // default, last.
  r.residue = KResidue::kLast;

  const std::string text = r.ToString();
  absl::StatusOr<ConfigSpec> spec = ParseConfigSpec(text, "replay");
  if (!spec.ok()) return NoReplay(spec.status().message());
  const Config back =
      ResolveConfig(*spec, /*has_bias=*/r.bias != BiasMode::kNone, Activation::kNone,
                    /*backend_default=*/BiasMode::kFused, r.scaling);
  if (back.ToString() != text) {
    return absl::InternalError(
        absl::StrCat("replay '", text, "' reads back as '", back.ToString(), "'"));
  }
  return text;
}

void DescribeReplay(const ReplayRun& run, const LtAlgoConfig& algo,
                    std::map<std::string, std::string>* details) {
  if (!ReplayApplies(run.config)) return;
  absl::StatusOr<std::string> replay = ReplayConfig(run, algo);
  if (replay.ok()) {
    (*details)["replay"] = *replay;
  } else {
    (*details)["replay_unavailable"] = std::string(replay.status().message());
  }
}

}  // namespace tensorcheck::cuda::internal
