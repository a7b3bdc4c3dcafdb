// Configurations: which backend runs a linear layer, at which precision,
// with which bias mode. Written `backend:precision[:bias]` everywhere (CLI,
// JSON, Python, Go, logs):
//
//   TC_ASSIGN_OR_RETURN(ConfigSpec spec, ParseConfigSpec("cpu:tf32:fused"));
//   Config c = ResolveConfig(spec, /*has_bias=*/true, Activation::kNone,
//                            /*backend_default=*/BiasMode::kFused);
//   c.ToString() == "cpu:tf32:fused"
//
// The vocabulary of a linear-layer check, below every layer that uses it.
// Precisions follow docs/numerics.md's table. `tf32rna` and `tf32trunc` are TF32
// with ties-away and truncating input rounding.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/float_formats.h"
#include "core/mx_formats.h"
#include "core/tensor.h"
#include "core/tensor_core_model.h"

namespace tensorcheck {

enum class Precision {
  kFp64,
  kFp32,
  kTf32,
  kTf32Rna,
  kTf32Trunc,
  kBf16,
  kFp16,
  kFp16Acc,
  // FP8 scaled GEMMs (torch._scaled_mm): the input's format, then the
  // weight's; docs/numerics.md, "FP8".
  kFp8E4M3,
  kFp8E5M2,
  kFp8E4M3E5M2,
  kFp8E5M2E4M3,
  // Multi-pass fp32 GEMMs (XLA's dot algorithms BF16_BF16_F32_X3/_X6/_X9
  // and TF32_TF32_F32_X3): each fp32 operand split into bf16 (TF32) parts,
  // a set of part x part GEMMs accumulated in fp32, the partial results
  // summed in XLA's order; docs/numerics.md, "Multi-pass precisions".
  kBf16x3,
  kBf16x6,
  kBf16x9,
  kTf32x3,
  // Block-scaled narrow GEMMs (docs/numerics.md, "MXFP8 and NVFP4"):
  // MXFP8 (E4M3 or E5M2 values, 32-element blocks of UE8M0 scales along K)
  // and NVFP4 (E2M1 values, 16-element blocks of E4M3 scales, and a
  // per-tensor fp32 scale per operand).
  kMxFp8E4M3,
  kMxFp8E5M2,
  kNvFp4,
};

// The precisions that multiply wide (fp64/32/16, bf16) inputs, rounding
// them to their input format.
inline constexpr Precision kWidePrecisions[] = {
    Precision::kFp64,      Precision::kFp32, Precision::kTf32, Precision::kTf32Rna,
    Precision::kTf32Trunc, Precision::kBf16, Precision::kFp16, Precision::kFp16Acc};
// The scaled FP8 precisions: FP8 inputs with their scales, or wide inputs
// the configuration's scaling recipe quantises.
inline constexpr Precision kFp8Precisions[] = {Precision::kFp8E4M3, Precision::kFp8E5M2,
                                               Precision::kFp8E4M3E5M2, Precision::kFp8E5M2E4M3};
// The multi-pass precisions (not in kWidePrecisions: no backend's default
// candidates include them).
inline constexpr Precision kMultiPassPrecisions[] = {Precision::kBf16x3, Precision::kBf16x6,
                                                     Precision::kBf16x9, Precision::kTf32x3};
// The block-scaled precisions: narrow operands with their block scales,
// or wide ones the configuration's recipe quantises.
inline constexpr Precision kBlockScaledPrecisions[] = {Precision::kMxFp8E4M3, Precision::kMxFp8E5M2,
                                                       Precision::kNvFp4};
inline constexpr Precision kAllPrecisions[] = {
    Precision::kFp64,      Precision::kFp32,      Precision::kTf32,        Precision::kTf32Rna,
    Precision::kTf32Trunc, Precision::kBf16,      Precision::kFp16,        Precision::kFp16Acc,
    Precision::kFp8E4M3,   Precision::kFp8E5M2,   Precision::kFp8E4M3E5M2, Precision::kFp8E5M2E4M3,
    Precision::kBf16x3,    Precision::kBf16x6,    Precision::kBf16x9,      Precision::kTf32x3,
    Precision::kMxFp8E4M3, Precision::kMxFp8E5M2, Precision::kNvFp4};

inline bool IsFp8(Precision p) {
  return p == Precision::kFp8E4M3 || p == Precision::kFp8E5M2 || p == Precision::kFp8E4M3E5M2 ||
         p == Precision::kFp8E5M2E4M3;
}

inline bool IsBlockScaled(Precision p) {
  return p == Precision::kMxFp8E4M3 || p == Precision::kMxFp8E5M2 || p == Precision::kNvFp4;
}

// What a block-scaled precision multiplies: the operands' dtype, the scale
// dtype, the block's length along K.
struct BlockScaledOperands {
  DType values;
  DType scales;
  int64_t block;
};
BlockScaledOperands BlockScaledOperandsOf(Precision p);  // p must be block-scaled

inline bool IsMultiPass(Precision p) {
  return p == Precision::kBf16x3 || p == Precision::kBf16x6 || p == Precision::kBf16x9 ||
         p == Precision::kTf32x3;
}

// How a multi-pass precision splits an fp32 operand and which part x part
// products it forms, in the order XLA sums them (docs/numerics.md,
// "Multi-pass precisions").
struct MultiPassScheme {
  // 2 or 3 parts. Every part but the last is the running remainder cut to
  // the part format toward zero (bf16: XLA masks the low 16 bits) or, for
  // TF32, rounded ties-away (Triton's cvt.rna.tf32.f32); the remainder
  // after it is exact in fp32. The last part is the remainder rounded to
  // nearest even (bf16) or truncated (TF32: the tensor core reads the top
  // 19 bits of an fp32 register).
  int parts = 2;
  bool tf32 = false;
  // {lhs part, rhs part} of each partial GEMM (0 the highest part), in
  // summation order: partial[0] + partial[1], then + partial[2] ... The
  // last is always {0, 0} (high x high), added after the NaNs of the sum
  // before it are replaced by zeros.
  std::vector<std::pair<int, int>> products;
};
MultiPassScheme MultiPassSchemeOf(Precision p);  // p must be multi-pass

// "hi*lo + lo*hi, NaN -> 0 + hi*hi": the scheme's partial sums in order, as
// the backends' details write them ("partial_sum_order").
std::string PartialSumOrder(const MultiPassScheme& scheme);

// Splits `v` into `scheme.parts` parts (highest first) as the scheme says.
void SplitMultiPass(const MultiPassScheme& scheme, float v, float* parts);

// The FP8 dtypes an fp8 precision multiplies: {input, weight}.
struct Fp8Operands {
  DType input;
  DType weight;
};
Fp8Operands Fp8OperandsOf(Precision p);  // p must be an fp8 precision

// How an fp8 configuration scales: torch._scaled_mm's two recipes, one
// fp32 scale per tensor or one per row of x and per output feature of W;
// or DeepSeek-V3's block-wise scaling, one per 1 x 128 block of x and per
// 128 x 128 block of W, each 128-wide slice of K scaled on its own
// (docs/numerics.md, "Block-wise FP8").
enum class Fp8Scaling { kTensor, kRow, kBlock128 };

inline constexpr Fp8Scaling kFp8Scalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kRow,
                                              Fp8Scaling::kBlock128};

// The extent of K one block-wise scale covers, and of N one weight scale.
inline constexpr int64_t kFp8BlockSize = 128;

// "tensor", "row", "block128".
absl::string_view Fp8ScalingName(Fp8Scaling s);

// "floor", "rceil": an mxfp8 configuration's `scaling=` option.
absl::string_view MxScaleRoundingName(MxScaleRounding r);

// Split-K (docs/numerics.md, "Split-K"): a 16-bit GEMM whose K is cut into
// slices, each accumulated in fp32, and the slices' partial results
// reduced either in the output type (each partial rounded to it, and each
// addition: cuBLASLt's CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE, what
// PyTorch's allow_fp16/bf16_reduced_precision_reduction allow) or in fp32
// (the COMPUTE_TYPE scheme).
enum class SplitKReduce { kOutput, kFp32 };

// "output", "fp32".
absl::string_view SplitKReduceName(SplitKReduce r);

// Split counts a configuration may name, and the ones a diagnosis scans.
inline constexpr int kMaxSplitK = 64;
inline constexpr int kScannedSplitK[] = {2, 3, 4, 6, 8, 16};

// The precisions that take `splitk=`: the 16-bit ones with fp32
// accumulation.
inline bool TakesSplitK(Precision p) { return p == Precision::kBf16 || p == Precision::kFp16; }

// The slice of K each of `splitk` partitions covers, as CUTLASS's split-K
// cuts it (GemmUniversal: ceil(K / splitk) rounded up to a multiple of 8,
// 128 bits of 16-bit elements); the last slice holds what is left, and
// slices past the end of K are empty.
inline int64_t SplitKSlice(int64_t k, int splitk) {
  const int64_t s = splitk > 0 ? (k + splitk - 1) / splitk : k;
  return (s + 7) / 8 * 8;
}

// Kernel replay (docs/numerics.md, "Kernel K order"): the precisions a
// CPU can compute as a GPU kernel does, each hardware inner product by a
// generation's tensor-core model (`mma=sm80|sm90|sm100`): the 16- and
// 19-bit ones with fp32 accumulation, and the scaled FP8 ones (sm90 and
// sm100).
inline bool TakesMma(Precision p) {
  return p == Precision::kBf16 || p == Precision::kFp16 || p == Precision::kTf32 ||
         p == Precision::kTf32Rna || p == Precision::kTf32Trunc || p == Precision::kFp8E4M3 ||
         p == Precision::kFp8E5M2 || p == Precision::kFp8E4M3E5M2 || p == Precision::kFp8E5M2E4M3;
}

// Longest K tile a configuration may name (`tile_k=N`).
inline constexpr int64_t kMaxTileK = 1024;
// FP8 split accumulation's promotion interval when `tile_k` is unset:
// CUTLASS's FP8 tile K, four MMAs of K 32 (its default promotion interval).
inline constexpr int64_t kDefaultFp8PromoteK = 128;

enum class BiasMode { kNone, kFused, kUnfused };

enum class Activation { kNone, kRelu, kGeluTanh };

enum class WeightLayout {
  kOutIn,  // [N, K]: torch.nn.Linear, candle
  kInOut,  // [K, N]: flax nn.Dense kernel
};

// "fp64", "fp32", "tf32", "tf32rna", "tf32trunc", "bf16", "fp16", "fp16acc",
// "fp8e4m3", "fp8e5m2", "fp8e4m3e5m2", "fp8e5m2e4m3", "bf16x3", "bf16x6",
// "bf16x9", "tf32x3", "mxfp8e4m3", "mxfp8e5m2", "nvfp4".
absl::string_view PrecisionName(Precision p);
// A name above, or a JAX dot-algorithm preset written `jax=PRESET`
// (jax.lax.DotAlgorithmPreset's names): `jax=BF16_BF16_F32_X3` is bf16x3
// (JaxPresetPrecisions lists them). The alias is only a way in: the
// precision prints back under its own name. INVALID_ARGUMENT naming the
// precision, or the preset and the known presets.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

// The JAX presets `jax=` accepts, with the precision each names.
struct JaxPreset {
  absl::string_view name;
  Precision precision;
};
const std::vector<JaxPreset>& JaxPresetPrecisions();
// The JAX preset that names `p` exactly, or empty (fp16acc, tf32rna,
// tf32trunc and the fp8 precisions have none).
absl::string_view JaxPresetName(Precision p);

// "none", "fused", "unfused".
absl::string_view BiasModeName(BiasMode b);
absl::StatusOr<BiasMode> ParseBiasMode(absl::string_view name);

// "none", "relu", "gelu".
absl::string_view ActivationName(Activation a);
absl::StatusOr<Activation> ParseActivation(absl::string_view name);

// "out_in", "in_out".
absl::string_view WeightLayoutName(WeightLayout l);
absl::StatusOr<WeightLayout> ParseWeightLayout(absl::string_view name);

// Numerical facts of a precision.
struct PrecisionInfo {
  // Unit roundoff of the multiply's inputs (0 when they are exact).
  double u_input;
  // Unit roundoff of the accumulation.
  double u_accumulate;
  // Whether every multiply-add rounds to fp16 (fp16acc).
  bool fp16_accumulate;
  // TF32 input rounding, when the precision is a TF32 one.
  std::optional<Tf32Rounding> tf32_rounding;
};
// For an fp8 precision: u_input is the quantisation's (the coarser
// format's, for wide inputs the recipe rounds) and u_accumulate fp32's;
// FastAccumInfo below gives fast accumulation's.
PrecisionInfo GetPrecisionInfo(Precision p);

// Significand bits (the leading one included) of the precision's multiply
// inputs: fp64 53, fp32 24, tf32 (all roundings), fp16 and fp16acc 11,
// bf16 8, the fp8 ones their narrower format's (E4M3 4, E5M2 3); a
// multi-pass precision its parts' (bf16xN 8, tf32x3 11): what each pass's
// GEMM multiplies.
int InputSignificandBits(Precision p);

// Rounds one input value as the precision's multiply sees it (identity for
// fp64/fp32). Multi-pass: the sum of its parts (v itself for bf16x6 and
// bf16x9, whose parts hold every bit), which the products do not all see.
float RoundInput(Precision p, float v);

// Whether every value a tensor stored as `storage` can hold is exact in
// the input format of `p` (so the multiply rounds nothing): bf16 and fp16
// values under fp32 and TF32, bf16 under bf16, fp16 under fp16, anything
// under fp64.
bool StorageExactIn(Precision p, DType storage);

// Whether every value of `t` is exact in the input format of `p`: the
// dtype rule above, else a look at the values (stops at the first that
// rounds).
bool ValuesExactIn(Precision p, const Tensor& t);

// The largest `algo=N` a configuration may name (backends offer fewer).
inline constexpr int kMaxAlgorithmIndex = 1023;

// A parsed `backend:precision[:bias][@option,...]` before the request is
// known. Options: `algo=N` (any precision: the backend's algorithm N,
// LinearBackend::Algorithms), for the fp8 precisions
// `scaling=tensor|row|block128` and `fast_accum`, for the mxfp8 ones
// `scaling=floor|rceil`, for bf16 and fp16 `splitk=N[,reduce=output|fp32]`,
// for the TakesMma ones `mma=sm80|sm90|sm100[,tile_k=N][,residue=first|last]`
// (tile_k a multiple of the model's block, at most kMaxTileK; residue
// needs tile_k; FP8 needs sm90 or sm100 and a per-tensor or row scaling).
//
//   ParseConfigSpec("cublaslt:fp8e4m3:fused@scaling=row,fast_accum")
//   ParseConfigSpec("cublaslt:fp32:fused@algo=3")
struct ConfigSpec {
  std::string backend;
  Precision precision = Precision::kFp32;
  std::optional<BiasMode> bias;
  // Unset: the request's scales say (FP8 inputs), else per tensor.
  std::optional<Fp8Scaling> scaling;
  // CUBLASLT_MATMUL_DESC_FAST_ACCUM: no periodic promotion of the partial
  // sums to fp32 (docs/numerics.md, "Fast accumulation").
  bool fast_accum = false;
  // MXFP8 only: how the recipe rounds a block's scale (`scaling=floor`,
  // the OCP spec's and torchao's default; `scaling=rceil`,
  // TransformerEngine's and cuBLAS's). Unset: floor.
  std::optional<MxScaleRounding> mx_rounding;
  // bf16 and fp16 only: K cut into this many slices (`splitk=N`, 2 ..
  // kMaxSplitK), reduced as `reduce=output|fp32` says (default output).
  int splitk = 0;
  std::optional<SplitKReduce> reduce;
  // TakesMma precisions: replay a kernel (`mma=GEN[,tile_k=N][,residue=
  // first|last]`, KernelOrderOf below).
  std::optional<TensorCoreGpu> mma = std::nullopt;
  int64_t tile_k = 0;
  std::optional<KResidue> residue;
  // Unset: the backend's own choice (its algorithm 0).
  std::optional<int> algo = std::nullopt;
};

// INVALID_ARGUMENT (naming `field` and the accepted forms) on a malformed
// spec. Backend names are not checked here.
absl::StatusOr<ConfigSpec> ParseConfigSpec(absl::string_view spec,
                                           absl::string_view field = "config");

// A configuration resolved against a request.
struct Config {
  std::string backend;
  Precision precision = Precision::kFp32;
  BiasMode bias = BiasMode::kNone;
  // fp8 precisions only (kTensor and false otherwise).
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  bool fast_accum = false;
  // mxfp8 precisions only (kFloor otherwise).
  MxScaleRounding mx_rounding = MxScaleRounding::kFloor;
  // bf16 and fp16 only: split-K into `splitk` slices (0: none), the
  // partial results reduced as `reduce` says.
  int splitk = 0;
  SplitKReduce reduce = SplitKReduce::kOutput;
  // TakesMma precisions only: the kernel replayed (unset: none), its K
  // tile (0: none) and where its partial tile goes.
  std::optional<TensorCoreGpu> mma = std::nullopt;
  int64_t tile_k = 0;
  KResidue residue = KResidue::kLast;
  // The backend's algorithm N (docs/numerics.md, "Algorithms"); unset: the
  // backend's own choice for the problem, which may depend on its shape.
  std::optional<int> algo = std::nullopt;

  // Canonical `backend:precision:bias`, then the options after one `@`:
  // `scaling=...[,fast_accum]` for an fp8 precision, `scaling=floor|rceil`
  // for an mxfp8 one, `splitk=N,reduce=...` when split, `mma=GEN[,tile_k=N]
  // [,residue=first]` for a replay, and `algo=N` when set
  // (`cublaslt:fp32:fused@algo=3`, `cpu:fp8e4m3:none@scaling=row,algo=0`,
  // `cpu:bf16:fused@splitk=2,reduce=fp32,mma=sm90,tile_k=64`).
  std::string ToString() const;
  bool operator==(const Config& o) const {
    return backend == o.backend && precision == o.precision && bias == o.bias &&
           scaling == o.scaling && fast_accum == o.fast_accum && mx_rounding == o.mx_rounding &&
           splitk == o.splitk && reduce == o.reduce && mma == o.mma && tile_k == o.tile_k &&
           residue == o.residue && algo == o.algo;
  }
};

// The K order a replaying configuration walks (its `mma`, tile and
// residue; for FP8 without fast accumulation, promotion once per tile,
// kDefaultFp8PromoteK without one); nullopt without `mma`. The model's
// input formats are the precision's: bf16, fp16, TF32 (every rounding),
// FP8 E4M3/E5M2 per operand.
std::optional<KernelOrder> KernelOrderOf(const Config& c);

// Resolves the bias mode. Without a bias and without an activation whose
// placement can change the result (GELU), the mode is `none`: fused and
// unfused compute the same function. Otherwise an unspecified mode takes
// the backend's default. An fp8 precision's unspecified scaling takes
// `request_scaling` (the request's scales' recipe, or kTensor).
Config ResolveConfig(const ConfigSpec& spec, bool has_bias, Activation activation,
                     BiasMode backend_default, Fp8Scaling request_scaling = Fp8Scaling::kTensor);

// A configuration the user accepts (VerifyRequest.accept):
// `backend:precision[:bias]`, `backend:precision`, `precision[:bias]` or
// `precision` alone; a part left out matches any. `fused` also matches
// `none` (without a bias or GELU the placements compute one function).
struct ConfigPattern {
  std::optional<std::string> backend;
  Precision precision = Precision::kFp32;
  std::optional<BiasMode> bias;

  bool Matches(const Config& c) const;
  // As written, canonical: `tf32`, `cpu:bf16:unfused`.
  std::string ToString() const;
};

// INVALID_ARGUMENT naming `field` and the accepted forms.
absl::StatusOr<ConfigPattern> ParseConfigPattern(absl::string_view text,
                                                 absl::string_view field = "accept");

}  // namespace tensorcheck
