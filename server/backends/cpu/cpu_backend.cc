#include "server/backends/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <optional>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float_formats.h"
#include "core/fp8_scaling.h"
#include "core/mx_formats.h"
#include "core/status_macros.h"
#include "server/backends/cpu/internal/allocate.h"
#include "server/backends/cpu/internal/fp16_accumulate.h"
#include "server/backends/cpu/internal/fp8_accumulate.h"
#include "server/backends/cpu/internal/tensor_core_accumulate.h"
#include "server/stats/blas_gemm.h"

namespace tensorcheck {

namespace {

// OpenBLAS's cblas interface takes `blasint` (int in the LP64 build Debian
// ships) for every dimension and leading dimension.
constexpr int64_t kMaxBlasDim = std::numeric_limits<int>::max();

absl::Status CheckDim(int64_t v, absl::string_view name) {
  if (v < 0 || v > kMaxBlasDim) {
    return absl::InvalidArgumentError(absl::StrCat("problem.", name, ": a dimension in [0, ",
                                                   kMaxBlasDim, "] expected, got ", v));
  }
  return absl::OkStatus();
}

// Sanity checks only: the engine validates requests. These keep a caller
// that skipped validation from reading out of bounds.
absl::Status CheckProblem(const LinearProblem& p) {
  if (p.input == nullptr)
    return absl::InvalidArgumentError("problem.input: tensor expected, got null");
  if (p.weight == nullptr)
    return absl::InvalidArgumentError("problem.weight: tensor expected, got null");
  TC_RETURN_IF_ERROR(CheckDim(p.m, "m"));
  TC_RETURN_IF_ERROR(CheckDim(p.n, "n"));
  TC_RETURN_IF_ERROR(CheckDim(p.k, "k"));
  // m, n, k < 2^31, so their pairwise products fit in int64.
  if (p.input->numel() != p.m * p.k) {
    return absl::InvalidArgumentError(absl::StrCat("input: m*k = ", p.m * p.k,
                                                   " elements expected, got shape ",
                                                   ShapeString(p.input->shape())));
  }
  const int64_t rows = p.layout == WeightLayout::kOutIn ? p.n : p.k;
  const int64_t cols = p.layout == WeightLayout::kOutIn ? p.k : p.n;
  if (p.weight->rank() != 2 || p.weight->dim(0) != rows || p.weight->dim(1) != cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight: shape [", rows, ", ", cols, "] expected for layout ",
                     WeightLayoutName(p.layout), ", got ", ShapeString(p.weight->shape())));
  }
  if (p.bias != nullptr && p.bias->numel() != p.n) {
    return absl::InvalidArgumentError(absl::StrCat("bias: ", p.n, " elements expected, got shape ",
                                                   ShapeString(p.bias->shape())));
  }
  if (IsNarrow(p.output_dtype) || p.output_dtype == DType::kFloat8E8M0Fnu) {
    return absl::InvalidArgumentError(
        absl::StrCat("output_dtype: a wide dtype expected, got ", DTypeName(p.output_dtype)));
  }
  if (IsNarrow(p.input->dtype())) {
    // Block-wise scales: one per block (docs/numerics.md, "Block-wise FP8";
    // MXFP8's float8_e8m0fnu and NVFP4's float8_e4m3fn ones too).
    const ScaleBlocks& b = p.scale_blocks;
    const int64_t slices = b.block_wise() ? CeilDiv(p.k, b.k) : 1;
    const int64_t x_count = b.block_wise() ? p.m * slices : p.m;
    const int64_t w_count = b.block_wise() ? CeilDiv(p.n, b.n) * slices : p.n;
    for (const auto& [scale, name, count] :
         {std::tuple<const Tensor*, const char*, int64_t>{p.input_scale, "input_scale", x_count},
          {p.weight_scale, "weight_scale", w_count}}) {
      if (scale == nullptr || (scale->dtype() != DType::kFloat32 && !b.block_wise()) ||
          (scale->numel() != 1 && scale->numel() != count)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": float32 with 1 or ", count, " elements expected"));
      }
    }
  }
  return absl::OkStatus();
}

template <typename Round>
void RoundAll(float* v, int64_t count, Round round) {
  for (int64_t i = 0; i < count; ++i) v[i] = round(v[i]);
}

// Applies RoundInput(p, .) to every element, with the switch outside the loop.
void RoundInputs(Precision p, float* v, int64_t count) {
  switch (p) {
    case Precision::kFp64:
    case Precision::kFp32:
      return;
    case Precision::kTf32:
      return RoundAll(v, count, [](float f) { return RoundToTf32(f, Tf32Rounding::kNearestEven); });
    case Precision::kTf32Rna:
      return RoundAll(v, count, [](float f) { return RoundToTf32(f, Tf32Rounding::kTiesAway); });
    case Precision::kTf32Trunc:
      return RoundAll(v, count, [](float f) { return RoundToTf32(f, Tf32Rounding::kTruncate); });
    case Precision::kBf16:
      return RoundAll(v, count, [](float f) { return RoundToBf16(f); });
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return RoundAll(v, count, [](float f) { return RoundToFp16(f); });
    case Precision::kFp8E4M3:
    case Precision::kFp8E5M2:
    case Precision::kFp8E4M3E5M2:
    case Precision::kFp8E5M2E4M3:
      // Never asked: FP8 arithmetic multiplies FP8 values (stored, or
      // quantised with their scales by the recipe), which round nothing.
      return;
    case Precision::kBf16x3:
    case Precision::kBf16x6:
    case Precision::kBf16x9:
    case Precision::kTf32x3:
      // Never asked: multi-pass arithmetic splits its operands
      // (AccumulateMultiPass).
      return;
    case Precision::kMxFp8E4M3:
    case Precision::kMxFp8E5M2:
    case Precision::kNvFp4:
      // Never asked: block-scaled arithmetic dequantises its operands
      // (AccumulateBlockScaled).
      return;
  }
}

// Whether `p` rounds fp32 values before the multiply.
bool NeedsRounding(Precision p) { return p != Precision::kFp32 && p != Precision::kFp64; }

// An operand as fp32 values rounded for `p`. fp32 storage read at fp32
// precision is used in place (no copy); anything else is converted once
// into `owned`. Used whole for the input only: the weight goes block by
// block (Accumulate).
absl::StatusOr<const float*> FloatOperand(const Tensor& t, Precision p,
                                          std::unique_ptr<float[]>* owned) {
  if (t.dtype() == DType::kFloat32 && !NeedsRounding(p)) return t.data<float>();
  TC_ASSIGN_OR_RETURN(*owned, internal::Allocate<float>(t.numel()));
  ToFloat(t, owned->get());
  RoundInputs(p, owned->get(), t.numel());
  return static_cast<const float*>(owned->get());
}

absl::StatusOr<const double*> DoubleOperand(const Tensor& t, std::unique_ptr<double[]>* owned) {
  if (t.dtype() == DType::kFloat64) return t.data<double>();
  TC_ASSIGN_OR_RETURN(*owned, internal::Allocate<double>(t.numel()));
  ToDouble(t, owned->get());
  return static_cast<const double*>(owned->get());
}

// ---- Epilogue: bias, activation and the output rounding, in one pass.

template <DType kOut>
struct OutStorage {
  using type = uint16_t;
};
template <>
struct OutStorage<DType::kFloat64> {
  using type = double;
};
template <>
struct OutStorage<DType::kFloat32> {
  using type = float;
};

// Rounds `v` to the output dtype and widens it back to T, once.
template <DType kOut, typename T>
inline T RoundOut(T v) {
  if constexpr (kOut == DType::kFloat64) {
    return v;
  } else if constexpr (kOut == DType::kFloat32) {
    return static_cast<T>(static_cast<float>(v));
  } else if constexpr (kOut == DType::kFloat16) {
    if constexpr (std::is_same_v<T, float>) {
      return RoundToFp16(v);
    } else {
      return Fp16BitsToFloat(DoubleToFp16Bits(v));
    }
  } else {
    if constexpr (std::is_same_v<T, float>) {
      return RoundToBf16(v);
    } else {
      return Bf16BitsToFloat(DoubleToBf16Bits(v));
    }
  }
}

// Rounds `v` once to the output dtype and stores it.
template <DType kOut, typename T>
inline typename OutStorage<kOut>::type Store(T v) {
  if constexpr (kOut == DType::kFloat64) {
    return static_cast<double>(v);
  } else if constexpr (kOut == DType::kFloat32) {
    return static_cast<float>(v);
  } else if constexpr (kOut == DType::kFloat16) {
    if constexpr (std::is_same_v<T, float>) {
      return FloatToFp16Bits(v);
    } else {
      return DoubleToFp16Bits(v);
    }
  } else {
    if constexpr (std::is_same_v<T, float>) {
      return FloatToBf16Bits(v);
    } else {
      return DoubleToBf16Bits(v);
    }
  }
}

// The activation evaluated in T (fp32, or fp64 for the fp64 precision).
template <Activation kAct, typename T>
inline T Activate(T v) {
  if constexpr (kAct == Activation::kNone) {
    return v;
  } else if constexpr (kAct == Activation::kRelu) {
    return v < T(0) ? T(0) : v;  // NaN passes through
  } else {
    // GELU, tanh form (cuBLASLt's and PyTorch's approximate='tanh').
    const T kSqrt2OverPi = static_cast<T>(0.79788456080286535588);
    const T kCoeff = static_cast<T>(0.044715);
    return T(0.5) * v * (T(1) + std::tanh(kSqrt2OverPi * (v + kCoeff * v * v * v)));
  }
}

// `acc` and `out` may alias (fp32 accumulator written in place as fp32
// output): each element is read before it is written.
template <typename T, DType kOut, Activation kAct>
void EpilogueLoop(const T* acc, const T* bias, bool unfused, int64_t m, int64_t n,
                  typename OutStorage<kOut>::type* out) {
  for (int64_t i = 0; i < m; ++i) {
    const T* a = acc + i * n;
    auto* y = out + i * n;
    if (!unfused) {
      // fused: round_out(act(acc + b)), one rounding.
      if (bias != nullptr) {
        for (int64_t j = 0; j < n; ++j) y[j] = Store<kOut>(Activate<kAct>(a[j] + bias[j]));
      } else {
        for (int64_t j = 0; j < n; ++j) y[j] = Store<kOut>(Activate<kAct>(a[j]));
      }
    } else {
      // unfused: t = round_out(acc); u = round_out(t + b); round_out(act(u)).
      for (int64_t j = 0; j < n; ++j) {
        T u = RoundOut<kOut>(a[j]);
        if (bias != nullptr) u = RoundOut<kOut>(u + bias[j]);
        y[j] = Store<kOut>(Activate<kAct>(u));
      }
    }
  }
}

template <typename T, DType kOut>
void EpilogueForAct(const T* acc, const T* bias, bool unfused, Activation act, int64_t m, int64_t n,
                    Tensor* out) {
  auto* y = out->data<typename OutStorage<kOut>::type>();
  switch (act) {
    case Activation::kNone:
      return EpilogueLoop<T, kOut, Activation::kNone>(acc, bias, unfused, m, n, y);
    case Activation::kRelu:
      return EpilogueLoop<T, kOut, Activation::kRelu>(acc, bias, unfused, m, n, y);
    case Activation::kGeluTanh:
      return EpilogueLoop<T, kOut, Activation::kGeluTanh>(acc, bias, unfused, m, n, y);
  }
}

template <typename T>
void Epilogue(const T* acc, const T* bias, bool unfused, Activation act, int64_t m, int64_t n,
              Tensor* out) {
  switch (out->dtype()) {
    case DType::kFloat64:
      return EpilogueForAct<T, DType::kFloat64>(acc, bias, unfused, act, m, n, out);
    case DType::kFloat32:
      return EpilogueForAct<T, DType::kFloat32>(acc, bias, unfused, act, m, n, out);
    case DType::kFloat16:
      return EpilogueForAct<T, DType::kFloat16>(acc, bias, unfused, act, m, n, out);
    case DType::kBFloat16:
      return EpilogueForAct<T, DType::kBFloat16>(acc, bias, unfused, act, m, n, out);
    case DType::kFloat8E4M3Fn:
    case DType::kFloat8E5M2:
    case DType::kFloat4E2M1Fn:
    case DType::kFloat8E8M0Fnu:
      return;  // not an output dtype: CheckProblem refuses it
  }
}

absl::string_view Tf32RoundingName(Tf32Rounding r) {
  switch (r) {
    case Tf32Rounding::kNearestEven:
      return "nearest_even";
    case Tf32Rounding::kTiesAway:
      return "ties_away";
    case Tf32Rounding::kTruncate:
      return "truncate";
  }
  return "unknown";
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const Options& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads: 0 (all cores) or a positive count expected, got ", options.threads));
  }
  // OpenBLAS's thread count is process-wide; the CPU backend is its only
  // user in the server.
  if (options.threads > 0) openblas_set_num_threads(options.threads);
  return std::unique_ptr<CpuBackend>(new CpuBackend(options));
}

std::vector<Precision> CpuBackend::precisions() const {
  return std::vector<Precision>(std::begin(kAllPrecisions), std::end(kAllPrecisions));
}

std::vector<BiasMode> CpuBackend::bias_modes() const {
  return {BiasMode::kNone, BiasMode::kFused, BiasMode::kUnfused};
}

std::vector<DType> CpuBackend::storage_dtypes() const {
  return std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes));
}

namespace {

// How a configuration multiplies, on one problem: configurations with
// equal Arithmetic compute the same accumulator x.W^T bit for bit, and
// differ at most in their epilogues.
struct Arithmetic {
  enum Kind { kFp64, kFp32, kFp16Acc, kFp8, kMultiPass, kBlockScaled };
  Kind kind = kFp32;
  // kFp32: the input rounding the multiply applies; kFp32 when it leaves
  // both stored operands unchanged (bf16 tensors under fp32, tf32 or
  // bf16: one GEMM). kFp8: the fp8 precision.
  Precision rounding = Precision::kFp32;
  // kMultiPass: the multi-pass precision (never merged with kFp32: even
  // where every left-out product is 0, the sum of partials can differ
  // from one GEMM in the sign of a zero).
  // kFp8: the recipe that quantises wide operands (FP8 ones come with
  // their scales), and fast accumulation.
  Fp8Scaling scaling = Fp8Scaling::kTensor;
  bool fast_accum = false;
  // kBlockScaled (`rounding` the mxfp8 or nvfp4 precision): the MXFP8
  // recipe's scale rounding for wide operands.
  MxScaleRounding mx_rounding = MxScaleRounding::kFloor;
  // kFp32: split-K into `splitk` slices (0: one GEMM), reduced as `reduce`.
  int splitk = 0;
  SplitKReduce reduce = SplitKReduce::kOutput;
  // kFp32 and kFp8: a kernel replay's K order (docs/numerics.md, "Kernel K
  // order"; KernelOrderOf the configuration); `rounding` is then the
  // precision itself, whose formats the model takes.
  std::optional<KernelOrder> order = std::nullopt;
  bool operator==(const Arithmetic& o) const {
    return kind == o.kind && rounding == o.rounding && scaling == o.scaling &&
           fast_accum == o.fast_accum && mx_rounding == o.mx_rounding && splitk == o.splitk &&
           reduce == o.reduce && order == o.order;
  }
};

Arithmetic ArithmeticOf(const LinearProblem& p, const Config& config) {
  const Precision precision = config.precision;
  if (IsFp8(precision)) {
    // FP8 operands bring their scales; the scaling still says how they are
    // applied (single scales of a 1 x 1 layer fit either recipe).
    Arithmetic a{Arithmetic::kFp8, precision, config.scaling, config.fast_accum};
    a.order = KernelOrderOf(config);
    return a;
  }
  switch (precision) {
    case Precision::kFp64:
      return {Arithmetic::kFp64, Precision::kFp64};
    case Precision::kFp16Acc:
      return {Arithmetic::kFp16Acc, Precision::kFp16Acc};
    default:
      break;
  }
  if (IsMultiPass(precision)) return {Arithmetic::kMultiPass, precision};
  if (IsBlockScaled(precision)) {
    Arithmetic a{Arithmetic::kBlockScaled, precision};
    // Scales that came with the operands leave the recipe nothing to do.
    if (!IsNarrow(p.input->dtype())) a.mx_rounding = config.mx_rounding;
    return a;
  }
  // Rounding changes nothing when exact: the stored values, read as fp32,
  // are the operands (fp32 precision reads fp64 storage exactly only when
  // the values are fp32 ones, which ValuesExactIn checked). A replay keeps
  // its precision, whose formats the model takes; only the TF32 roundings
  // are one replay where the values are TF32 ones.
  const bool exact = ValuesExactIn(precision, *p.input) && ValuesExactIn(precision, *p.weight);
  Precision rounding = exact ? Precision::kFp32 : precision;
  if (config.mma.has_value()) {
    const bool tf32 = precision == Precision::kTf32Rna || precision == Precision::kTf32Trunc;
    rounding = exact && tf32 ? Precision::kTf32 : precision;
  }
  Arithmetic a{Arithmetic::kFp32, rounding};
  a.order = KernelOrderOf(config);
  if (config.splitk >= 2 && TakesSplitK(precision)) {
    a.splitk = config.splitk;
    a.reduce = config.reduce;
  }
  return a;
}

// Dequantisation scales of an accumulator: one per row of x and per
// output feature of W, or one each (per tensor). Empty: none (wide
// operands).
struct Scales {
  std::vector<float> input, weight;
  bool row_wise = false;
  bool empty() const { return input.empty(); }
};

std::vector<float> ScaleValues(const Tensor* scale) {
  std::vector<float> v;
  if (scale == nullptr) return v;
  v.resize(static_cast<size_t>(scale->numel()));
  ToFloat(*scale, v.data());
  return v;
}

// x.W^T of one Arithmetic before any epilogue: [m, n] in fp32, or fp64
// for kFp64. A weight stored as the GEMM's type and not rounded (fp32 at
// fp32, fp64 at fp64) is read in place; any other is widened, and rounded,
// one block of output columns at a time into a buffer of at most about
// 64 MiB (PlanWeightBlocks; `block_columns` > 0: blocks of about that many
// columns), whose product is copied into its columns of the accumulator:
// each element's dot product is the same computation, bit for bit, as
// with a single block (BlasGemmBlock says when). `stop` is checked before
// each block.
absl::StatusOr<Tensor> Accumulate(const LinearProblem& p, Arithmetic a, int threads,
                                  int64_t block_columns, const StopSignal* stop);

// Elements [k0, k0 + ks) of K as floats: x's into x_out [m, ks], and W's
// into w_out [n, ks] whatever W's layout (`row`: n floats of scratch for an
// IN_OUT weight's rows). The slices of block-wise FP8 and of split-K.
void WidenSliceOfK(const LinearProblem& p, int64_t k0, int64_t ks, float* row, float* x_out,
                   float* w_out) {
  for (int64_t i = 0; i < p.m; ++i) WidenRange(*p.input, i * p.k + k0, ks, x_out + i * ks);
  if (p.layout == WeightLayout::kOutIn) {
    for (int64_t j = 0; j < p.n; ++j) WidenRange(*p.weight, j * p.k + k0, ks, w_out + j * ks);
    return;
  }
  for (int64_t t = 0; t < ks; ++t) {
    WidenRange(*p.weight, (k0 + t) * p.n, p.n, row);
    for (int64_t j = 0; j < p.n; ++j) w_out[j * ks + t] = row[j];
  }
}

// Block-wise FP8 (docs/numerics.md, "Block-wise FP8"): for each 128-wide
// slice of K, the exact products of FP8 operands summed in fp32 (split:
// OpenBLAS's order; `fast_accum`: the fast-accumulation model within the
// slice), then promoted into the fp32 accumulator as DeepGEMM does,
// acc = fma(partial, fl32(sx * sw), acc), sx the slice's scale for the
// row of x and sw the weight block's for the output feature. `scales`
// hold x's [M, ceil(K/128)] and W's ([ceil(N/128), ceil(K/128)] for
// OUT_IN, transposed for IN_OUT) row-major.
absl::StatusOr<Tensor> AccumulateFp8Blocks(const LinearProblem& p, const Scales& scales,
                                           bool fast_accum, int threads, const StopSignal* stop) {
  const int64_t slices = CeilDiv(p.k, kFp8BlockSize);
  const int64_t weight_blocks = CeilDiv(p.n, kFp8BlockSize);
  const bool out_in = p.layout == WeightLayout::kOutIn;
  if (static_cast<int64_t>(scales.input.size()) != p.m * slices ||
      static_cast<int64_t>(scales.weight.size()) != weight_blocks * slices) {
    return absl::InternalError("block-wise scales do not match the layer");
  }
  TC_ASSIGN_OR_RETURN(Tensor acc, Tensor::Create(DType::kFloat32, {p.m, p.n}));
  float* c = acc.data<float>();
  std::fill(c, c + p.m * p.n, 0.0f);
  const int64_t width = std::min(p.k, kFp8BlockSize);
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> xb, internal::Allocate<float>(p.m * width));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wb, internal::Allocate<float>(p.n * width));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> row, internal::Allocate<float>(p.n));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> partial, internal::Allocate<float>(p.m * p.n));
  for (int64_t s = 0; s < slices; ++s) {
    TC_RETURN_IF_ERROR(CheckStop(stop));
    const int64_t k0 = s * kFp8BlockSize, kw = std::min(kFp8BlockSize, p.k - k0);
    WidenSliceOfK(p, k0, kw, row.get(), xb.get(), wb.get());
    if (fast_accum) {
      TC_RETURN_IF_ERROR(internal::Fp8FastAccumulate(xb.get(), wb.get(), WeightLayout::kOutIn, p.m,
                                                     p.n, kw, /*ldw=*/kw, FastAccumModel{}, threads,
                                                     partial.get(), /*ldc=*/p.n, stop));
    } else {
      TC_RETURN_IF_ERROR(
          BlasGemm(xb.get(), wb.get(), WeightLayout::kOutIn, p.m, p.n, kw, partial.get(), stop));
    }
    for (int64_t i = 0; i < p.m; ++i) {
      const float sx = scales.input[static_cast<size_t>(i * slices + s)];
      for (int64_t j = 0; j < p.n; ++j) {
        const int64_t jb = j / kFp8BlockSize;
        const float sw =
            scales.weight[static_cast<size_t>(out_in ? jb * slices + s : s * weight_blocks + jb)];
        c[i * p.n + j] = std::fma(partial[i * p.n + j], sx * sw, c[i * p.n + j]);
      }
    }
  }
  return acc;
}

// kFp8: x.W^T of the FP8 values, unscaled, and the scales to apply: the
// request's FP8 operands, or the wide ones quantised by `a`'s recipe. The
// split accumulator is an fp32 GEMM of the exact products (OpenBLAS's
// order); fast accumulation runs the model.
absl::StatusOr<Tensor> AccumulateFp8(const LinearProblem& p, Arithmetic a, int threads,
                                     int64_t block_columns, const StopSignal* stop,
                                     Scales* scales) {
  const Fp8Operands formats = Fp8OperandsOf(a.rounding);
  LinearProblem q = p;
  std::optional<Fp8Quantized> qx, qw;
  scales->row_wise = a.scaling == Fp8Scaling::kRow;
  if (IsFp8(p.input->dtype())) {
    scales->input = ScaleValues(p.input_scale);
    scales->weight = ScaleValues(p.weight_scale);
  } else {
    const bool out_in = p.layout == WeightLayout::kOutIn;
    const int64_t w_outer = out_in ? p.n : p.k, w_inner = out_in ? p.k : p.n;
    const Fp8Format x_format = *Fp8FormatOf(formats.input);
    const Fp8Format w_format = *Fp8FormatOf(formats.weight);
    if (a.scaling == Fp8Scaling::kBlock128) {
      TC_ASSIGN_OR_RETURN(qx, QuantizeFp8Blocks(*p.input, p.m, p.k, x_format, Fp8BlockOf(false)));
      TC_ASSIGN_OR_RETURN(
          qw, QuantizeFp8Blocks(*p.weight, w_outer, w_inner, w_format, Fp8BlockOf(true)));
    } else {
      TC_ASSIGN_OR_RETURN(qx, QuantizeFp8(*p.input, p.m, p.k, x_format, a.scaling));
      TC_ASSIGN_OR_RETURN(qw, QuantizeFp8(*p.weight, w_outer, w_inner, w_format, a.scaling,
                                          /*per_column=*/!out_in));
    }
    q.input = &qx->values;
    q.weight = &qw->values;
    scales->input = std::move(qx->scales);
    scales->weight = std::move(qw->scales);
  }
  if (a.scaling == Fp8Scaling::kBlock128) {
    if (a.order.has_value()) {
      return absl::FailedPreconditionError(
          "a kernel replay (mma=) of block-wise FP8 is not modelled: per tensor or row scaling");
    }
    Tensor acc;
    TC_ASSIGN_OR_RETURN(acc, AccumulateFp8Blocks(q, *scales, a.fast_accum, threads, stop));
    *scales = Scales{};  // applied block by block
    return acc;
  }
  const std::optional<KernelOrder>& order = a.order;
  if (!a.fast_accum && !order.has_value()) {
    // FP8 values read as fp32 are exact and so are their products.
    return Accumulate(q, Arithmetic{Arithmetic::kFp32, Precision::kFp32}, threads, block_columns,
                      stop);
  }
  std::unique_ptr<float[]> x_owned;
  TC_ASSIGN_OR_RETURN(const float* x, FloatOperand(*q.input, Precision::kFp32, &x_owned));
  TC_ASSIGN_OR_RETURN(Tensor acc, Tensor::Create(DType::kFloat32, {p.m, p.n}));
  float* c = acc.data<float>();
  const WeightBlocks blocks =
      PlanWeightBlocks(p.m, p.n, p.k, sizeof(float), block_columns, /*blas=*/false);
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wb,
                      internal::Allocate<float>(blocks.padded_columns * p.k));
  for (int64_t b = 0; b < blocks.count; ++b) {
    TC_RETURN_IF_ERROR(CheckStop(stop));
    const int64_t j0 = blocks.begin(b), nb = blocks.columns_of(b);
    WidenWeightBlock(*q.weight, p.layout, j0, nb, nb, wb.get());
    if (order.has_value()) {
      TC_RETURN_IF_ERROR(internal::TensorCoreAccumulate(x, wb.get(), p.layout, p.m, nb, p.k,
                                                        /*ldw=*/nb, *order, threads, c + j0,
                                                        /*ldc=*/p.n, stop));
    } else {
      TC_RETURN_IF_ERROR(internal::Fp8FastAccumulate(x, wb.get(), p.layout, p.m, nb, p.k,
                                                     /*ldw=*/nb, FastAccumModel{}, threads, c + j0,
                                                     /*ldc=*/p.n, stop));
    }
  }
  return acc;
}

// One operand split into its parts: parts[i] holds part i (0 the highest)
// of every value, fp32, shaped as the operand. fp64 storage is rounded to
// fp32 first (the multi-pass algorithms take fp32 operands).
absl::StatusOr<std::vector<Tensor>> SplitOperand(const Tensor& t, const MultiPassScheme& scheme) {
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> values, internal::Allocate<float>(t.numel()));
  ToFloat(t, values.get());
  std::vector<Tensor> parts;
  std::vector<float*> out;
  for (int i = 0; i < scheme.parts; ++i) {
    TC_ASSIGN_OR_RETURN(Tensor part, Tensor::Create(DType::kFloat32, t.shape()));
    out.push_back(part.data<float>());
    parts.push_back(std::move(part));
  }
  float split[3];
  for (int64_t e = 0; e < t.numel(); ++e) {
    SplitMultiPass(scheme, values[e], split);
    for (int i = 0; i < scheme.parts; ++i) out[i][e] = split[i];
  }
  return parts;
}

// NVFP4's per-tensor scales as an accumulator's scales (one each: applied
// as cuBLASLt's alpha, fl32(gx * gw)); none without them.
Scales GlobalScales(const LinearProblem& p) {
  Scales s;
  if (p.input_global_scale == nullptr || p.weight_global_scale == nullptr) return s;
  s.input = ScaleValues(p.input_global_scale);
  s.weight = ScaleValues(p.weight_global_scale);
  return s;
}

// kBlockScaled (docs/numerics.md, "MXFP8 and NVFP4"): each operand's
// values times their block's scale, exact in fp32 (UE8M0 powers of two;
// E2M1 times E4M3, 6 significant bits), then an fp32 GEMM of those
// (OpenBLAS's order); NVFP4's per-tensor scales go to `scales`, to apply
// as one alpha. Wide operands are quantised first by the precision's
// recipe (torchao's MX or TransformerEngine's MXFP8 rounding;
// TransformerEngine's NVFP4).
absl::StatusOr<Tensor> AccumulateBlockScaled(const LinearProblem& p, Arithmetic a, int threads,
                                             int64_t block_columns, const StopSignal* stop,
                                             Scales* scales) {
  const bool out_in = p.layout == WeightLayout::kOutIn;
  const int64_t w_outer = out_in ? p.n : p.k, w_inner = out_in ? p.k : p.n;
  Tensor x, w;
  if (IsNarrow(p.input->dtype())) {
    TC_ASSIGN_OR_RETURN(DequantizedOperands d, DequantizeOperands(p, DType::kFloat32));
    x = std::move(d.input);
    w = std::move(d.weight);
    *scales = GlobalScales(p);
  } else {
    auto quantise = [&](const Tensor& t, int64_t outer, int64_t inner,
                        bool per_column) -> absl::StatusOr<std::pair<Tensor, float>> {
      TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> v, internal::Allocate<float>(t.numel()));
      ToFloat(t, v.get());
      const absl::Span<const float> values(v.get(), static_cast<size_t>(t.numel()));
      BlockScaled q;
      if (a.rounding == Precision::kNvFp4) {
        TC_ASSIGN_OR_RETURN(q, QuantizeNvFp4(values, outer, inner, per_column));
      } else {
        const Fp8Format f =
            a.rounding == Precision::kMxFp8E5M2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3Fn;
        TC_ASSIGN_OR_RETURN(q, QuantizeMxFp8(values, outer, inner, f, a.mx_rounding, per_column));
      }
      TC_RETURN_IF_ERROR(CheckStop(stop));
      return std::make_pair(*FromFloats(DType::kFloat32, t.shape(), DequantizeBlockScaled(q)),
                            q.global_scale);
    };
    TC_ASSIGN_OR_RETURN(auto qx, quantise(*p.input, p.m, p.k, false));
    TC_ASSIGN_OR_RETURN(auto qw, quantise(*p.weight, w_outer, w_inner, /*per_column=*/!out_in));
    x = std::move(qx.first);
    w = std::move(qw.first);
    if (a.rounding == Precision::kNvFp4) {
      scales->input = {qx.second};
      scales->weight = {qw.second};
    }
  }
  LinearProblem q = p;
  q.input = &x;
  q.weight = &w;
  return Accumulate(q, Arithmetic{Arithmetic::kFp32, Precision::kFp32}, threads, block_columns,
                    stop);
}

// Split-K (docs/numerics.md, "Split-K"): K cut into a.splitk slices
// (SplitKSlice: CUTLASS's), each an fp32 GEMM of the rounded operands
// (OpenBLAS's order within the slice; a replay's kernel order, from a zero
// accumulator, with one), the partial results reduced left to
// right: in the output type (each partial rounded to it, then each
// addition done in fp32 and rounded to it) or in fp32. Every slice's
// operands are widened into buffers of [m or n, slice] floats.
absl::StatusOr<Tensor> AccumulateSplitK(const LinearProblem& p, Arithmetic a, int threads,
                                        const StopSignal* stop) {
  const std::optional<KernelOrder>& order = a.order;
  const int64_t slice = SplitKSlice(p.k, a.splitk);
  const int64_t mn = p.m * p.n;
  TC_ASSIGN_OR_RETURN(Tensor acc, Tensor::Create(DType::kFloat32, {p.m, p.n}));
  float* r = acc.data<float>();
  const int64_t width = std::min(p.k, slice);
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> xs, internal::Allocate<float>(p.m * width));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> ws, internal::Allocate<float>(p.n * width));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> row, internal::Allocate<float>(p.n));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> partial, internal::Allocate<float>(mn));
  const DType out = p.output_dtype;
  const bool in_output = a.reduce == SplitKReduce::kOutput;
  for (int64_t k0 = 0; k0 < p.k; k0 += slice) {
    TC_RETURN_IF_ERROR(CheckStop(stop));
    const int64_t ks = std::min(slice, p.k - k0);
    const bool first = k0 == 0;
    WidenSliceOfK(p, k0, ks, row.get(), xs.get(), ws.get());
    RoundInputs(a.rounding, xs.get(), p.m * ks);
    RoundInputs(a.rounding, ws.get(), p.n * ks);
    if (order.has_value()) {
      TC_RETURN_IF_ERROR(internal::TensorCoreAccumulate(xs.get(), ws.get(), WeightLayout::kOutIn,
                                                        p.m, p.n, ks, /*ldw=*/ks, *order, threads,
                                                        partial.get(), /*ldc=*/p.n, stop));
    } else {
      TC_RETURN_IF_ERROR(
          BlasGemm(xs.get(), ws.get(), WeightLayout::kOutIn, p.m, p.n, ks, partial.get(), stop));
    }
    for (int64_t e = 0; e < mn; ++e) {
      if (!in_output) {
        r[e] = first ? partial[e] : r[e] + partial[e];
      } else {
        const float pe = RoundToDType(partial[e], out);
        r[e] = first ? pe : RoundToDType(r[e] + pe, out);
      }
    }
  }
  return acc;
}

// kMultiPass: the scheme's partial GEMMs, each an fp32 GEMM of parts
// (products of bf16 or TF32 parts are exact in fp32, so each is what a
// bf16 or TF32 GEMM with fp32 accumulation computes, in OpenBLAS's
// order), summed in the scheme's order: partial[0] + partial[1] + ...,
// NaNs of that sum replaced by zeros (XLA's guard against inf * 0 in a
// low part), then + the high x high partial.
absl::StatusOr<Tensor> AccumulateMultiPass(const LinearProblem& p, Precision precision, int threads,
                                           int64_t block_columns, const StopSignal* stop) {
  const MultiPassScheme scheme = MultiPassSchemeOf(precision);
  TC_ASSIGN_OR_RETURN(std::vector<Tensor> xs, SplitOperand(*p.input, scheme));
  TC_ASSIGN_OR_RETURN(std::vector<Tensor> ws, SplitOperand(*p.weight, scheme));
  const Arithmetic exact{Arithmetic::kFp32, Precision::kFp32};
  std::optional<Tensor> sum;
  const size_t last = scheme.products.size() - 1;
  for (size_t t = 0; t < scheme.products.size(); ++t) {
    TC_RETURN_IF_ERROR(CheckStop(stop));
    LinearProblem q = p;
    q.input = &xs[static_cast<size_t>(scheme.products[t].first)];
    q.weight = &ws[static_cast<size_t>(scheme.products[t].second)];
    TC_ASSIGN_OR_RETURN(Tensor partial, Accumulate(q, exact, threads, block_columns, stop));
    if (!sum.has_value()) {
      sum = std::move(partial);
      continue;
    }
    float* s = sum->data<float>();
    const float* d = partial.data<float>();
    const int64_t count = p.m * p.n;
    // Before the last partial, XLA keeps infinities and zeroes NaNs:
    // select(inf >= |s|, s, 0).
    const bool guard = t == last;
    for (int64_t e = 0; e < count; ++e) s[e] = (guard && std::isnan(s[e]) ? 0.0f : s[e]) + d[e];
  }
  return *std::move(sum);
}

absl::StatusOr<Tensor> Accumulate(const LinearProblem& p, Arithmetic a, int threads,
                                  int64_t block_columns, const StopSignal* stop) {
  const Tensor& weight = *p.weight;
  switch (a.kind) {
    case Arithmetic::kFp8:
      return absl::InternalError("FP8 arithmetic goes through AccumulateFp8");
    case Arithmetic::kBlockScaled:
      return absl::InternalError("block-scaled arithmetic goes through AccumulateBlockScaled");
    case Arithmetic::kMultiPass:
      return AccumulateMultiPass(p, a.rounding, threads, block_columns, stop);
    case Arithmetic::kFp64: {
      std::unique_ptr<double[]> x_owned;
      TC_ASSIGN_OR_RETURN(const double* x, DoubleOperand(*p.input, &x_owned));
      TC_ASSIGN_OR_RETURN(Tensor acc, Tensor::Create(DType::kFloat64, {p.m, p.n}));
      double* c = acc.data<double>();
      if (weight.dtype() == DType::kFloat64) {
        TC_RETURN_IF_ERROR(BlasGemm(x, weight.data<double>(), p.layout, p.m, p.n, p.k, c, stop));
        return acc;
      }
      const WeightBlocks blocks = PlanWeightBlocks(p.m, p.n, p.k, sizeof(double), block_columns);
      TC_ASSIGN_OR_RETURN(std::unique_ptr<double[]> wb,
                          internal::Allocate<double>(blocks.padded_columns * p.k));
      TC_ASSIGN_OR_RETURN(std::unique_ptr<double[]> scratch,
                          internal::Allocate<double>(blocks.padded_columns * p.m));
      for (int64_t b = 0; b < blocks.count; ++b) {
        TC_RETURN_IF_ERROR(CheckStop(stop));
        const int64_t j0 = blocks.begin(b), nb = blocks.columns_of(b);
        const int64_t padded = PaddedColumns(nb);
        WidenWeightBlock(weight, p.layout, j0, nb, padded, wb.get());
        TC_RETURN_IF_ERROR(BlasGemmBlock(x, wb.get(), p.layout, p.m, p.n, p.k, j0, nb, padded,
                                         scratch.get(), c, stop));
      }
      return acc;
    }
    case Arithmetic::kFp32:
    case Arithmetic::kFp16Acc: {
      if (a.kind == Arithmetic::kFp32 && a.splitk >= 2) {
        return AccumulateSplitK(p, a, threads, stop);
      }
      const bool fp16acc = a.kind == Arithmetic::kFp16Acc;
      // A replay runs the tensor-core model in the kernel's K order, each
      // element on its own, as fp16acc's loops do.
      const std::optional<KernelOrder>& order = a.order;
      const bool own_loops = fp16acc || order.has_value();
      std::unique_ptr<float[]> x_owned;
      TC_ASSIGN_OR_RETURN(const float* x, FloatOperand(*p.input, a.rounding, &x_owned));
      TC_ASSIGN_OR_RETURN(Tensor acc, Tensor::Create(DType::kFloat32, {p.m, p.n}));
      float* c = acc.data<float>();
      if (weight.dtype() == DType::kFloat32 && !NeedsRounding(a.rounding) && !own_loops) {
        // fp16acc always rounds, so this is the BLAS product.
        TC_RETURN_IF_ERROR(BlasGemm(x, weight.data<float>(), p.layout, p.m, p.n, p.k, c, stop));
        return acc;
      }
      const WeightBlocks blocks =
          PlanWeightBlocks(p.m, p.n, p.k, sizeof(float), block_columns, /*blas=*/!own_loops);
      TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> wb,
                          internal::Allocate<float>(blocks.padded_columns * p.k));
      std::unique_ptr<float[]> scratch;
      if (!own_loops) {
        TC_ASSIGN_OR_RETURN(scratch, internal::Allocate<float>(blocks.padded_columns * p.m));
      }
      for (int64_t b = 0; b < blocks.count; ++b) {
        TC_RETURN_IF_ERROR(CheckStop(stop));
        const int64_t j0 = blocks.begin(b), nb = blocks.columns_of(b);
        // fp16 accumulation and a replay sum each element on its own: their
        // blocks need no padding, and go straight into the accumulator.
        const int64_t padded = own_loops ? nb : PaddedColumns(nb);
        WidenWeightBlock(weight, p.layout, j0, nb, padded, wb.get());
        RoundInputs(a.rounding, wb.get(), padded * p.k);
        if (order.has_value()) {
          TC_RETURN_IF_ERROR(internal::TensorCoreAccumulate(x, wb.get(), p.layout, p.m, nb, p.k,
                                                            /*ldw=*/nb, *order, threads, c + j0,
                                                            /*ldc=*/p.n, stop));
        } else if (fp16acc) {
          TC_RETURN_IF_ERROR(internal::Fp16Accumulate(x, wb.get(), p.layout, p.m, nb, p.k, threads,
                                                      c + j0, /*ldc=*/p.n, stop));
        } else {
          TC_RETURN_IF_ERROR(BlasGemmBlock(x, wb.get(), p.layout, p.m, p.n, p.k, j0, nb, padded,
                                           scratch.get(), c, stop));
        }
      }
      return acc;
    }
  }
  return absl::InternalError("unknown arithmetic");
}

// The dequantisation of an FP8 accumulator, in place, before the
// epilogue: per tensor acc * fl32(sx * sw) (cuBLASLt folds the two scales
// into alpha), row-wise (acc * sx[i]) * sw[j]; each product rounded to the
// accumulator's type (docs/numerics.md, "FP8").
template <typename T>
void ApplyScales(const Scales& s, int64_t m, int64_t n, T* acc) {
  if (!s.row_wise) {
    const T alpha = static_cast<T>(s.input[0]) * static_cast<T>(s.weight[0]);
    for (int64_t i = 0; i < m * n; ++i) acc[i] *= alpha;
    return;
  }
  for (int64_t i = 0; i < m; ++i) {
    const T sx = static_cast<T>(s.input.size() == 1 ? s.input[0] : s.input[static_cast<size_t>(i)]);
    for (int64_t j = 0; j < n; ++j) {
      const T sw =
          static_cast<T>(s.weight.size() == 1 ? s.weight[0] : s.weight[static_cast<size_t>(j)]);
      acc[i * n + j] = (acc[i * n + j] * sx) * sw;
    }
  }
}

void ApplyScales(const Scales& s, const LinearProblem& p, Tensor* acc) {
  if (s.empty()) return;
  if (acc->dtype() == DType::kFloat64) {
    ApplyScales(s, p.m, p.n, acc->data<double>());
  } else {
    ApplyScales(s, p.m, p.n, acc->data<float>());
  }
}

// x.W^T of `a`, dequantised: what the epilogue starts from.
absl::StatusOr<Tensor> ScaledAccumulate(const LinearProblem& p, Arithmetic a, int threads,
                                        int64_t block_columns, const StopSignal* stop) {
  Scales scales;
  absl::StatusOr<Tensor> acc;
  if (a.kind == Arithmetic::kFp64 && p.scale_blocks.block_wise()) {
    // The dequantised layer of block-scaled operands: each value times its
    // block's scale, exact in fp64, then the fp64 product and NVFP4's
    // per-tensor scales.
    TC_ASSIGN_OR_RETURN(DequantizedOperands d, DequantizeOperands(p, DType::kFloat64));
    LinearProblem dequantised = p;
    dequantised.input = &d.input;
    dequantised.weight = &d.weight;
    dequantised.input_scale = dequantised.weight_scale = nullptr;
    dequantised.scale_blocks = ScaleBlocks{};
    acc = Accumulate(dequantised, a, threads, block_columns, stop);
    scales = GlobalScales(p);
  } else if (a.kind == Arithmetic::kBlockScaled) {
    acc = AccumulateBlockScaled(p, a, threads, block_columns, stop, &scales);
  } else if (a.kind == Arithmetic::kFp8) {
    acc = AccumulateFp8(p, a, threads, block_columns, stop, &scales);
  } else {
    acc = Accumulate(p, a, threads, block_columns, stop);
  }
  if (!acc.ok()) return acc.status();
  // The fp64 reference of per-tensor or row-wise FP8 operands: the
  // dequantised layer.
  if (a.kind == Arithmetic::kFp64 && IsFp8(p.input->dtype()) && !p.scale_blocks.block_wise()) {
    scales.input = ScaleValues(p.input_scale);
    scales.weight = ScaleValues(p.weight_scale);
    scales.row_wise = scales.input.size() > 1 || scales.weight.size() > 1;
  }
  ApplyScales(scales, p, &*acc);
  return acc;
}

// The bias, activation and output rounding of `config` applied to `acc`.
// With `in_place` and an output stored like the accumulator, the
// epilogue overwrites `acc` and returns it (no second buffer).
template <typename T>
absl::StatusOr<Tensor> FinishAs(const LinearProblem& p, const Config& config, Tensor& acc,
                                bool in_place) {
  std::vector<T> bias;
  if (p.bias != nullptr) {
    bias.resize(static_cast<size_t>(p.n));
    // Exact unless the bias is stored in fp64 and T is float.
    if constexpr (std::is_same_v<T, float>) {
      ToFloat(*p.bias, bias.data());
    } else {
      ToDouble(*p.bias, bias.data());
    }
  }
  const T* b = p.bias != nullptr ? bias.data() : nullptr;
  // kNone with a bias present cannot come out of ResolveConfig; it is run
  // as fused, the single-rounding form.
  const bool unfused = config.bias == BiasMode::kUnfused;
  if (in_place && acc.dtype() == p.output_dtype) {
    Epilogue<T>(acc.data<T>(), b, unfused, p.activation, p.m, p.n, &acc);
    return std::move(acc);
  }
  TC_ASSIGN_OR_RETURN(Tensor out, Tensor::Create(p.output_dtype, {p.m, p.n}));
  Epilogue<T>(acc.data<T>(), b, unfused, p.activation, p.m, p.n, &out);
  return out;
}

absl::StatusOr<Tensor> Finish(const LinearProblem& p, const Config& config, Tensor& acc,
                              bool in_place) {
  if (acc.dtype() == DType::kFloat64) {
    return FinishAs<double>(p, config, acc, in_place);
  }
  return FinishAs<float>(p, config, acc, in_place);
}

// The kernel: OpenBLAS's GEMM, or this project's loops where the
// accumulation is its own (fp16acc, FP8 fast accumulation), which keep one
// summation order per element whatever the batch (docs/numerics.md,
// "Batch invariance").
std::map<std::string, std::string> DetailsOf(const Config& config) {
  const bool own_loops = config.precision == Precision::kFp16Acc ||
                         (IsFp8(config.precision) && config.fast_accum) || config.mma.has_value();
  std::map<std::string, std::string> details;
  if (own_loops) {
    details["kernel"] = "tensorcheck loops (one dot product per element)";
  } else {
    details["blas"] = "openblas";
  }
  if (IsMultiPass(config.precision)) {
    const MultiPassScheme scheme = MultiPassSchemeOf(config.precision);
    details["passes"] = absl::StrCat(scheme.products.size(), " ", scheme.tf32 ? "tf32" : "bf16",
                                     " GEMMs with fp32 accumulation");
    details["partial_sum_order"] = PartialSumOrder(scheme);
  }
  const PrecisionInfo info = GetPrecisionInfo(config.precision);
  if (info.tf32_rounding.has_value()) {
    details["tf32_rounding"] = std::string(Tf32RoundingName(*info.tf32_rounding));
  }
  if (config.splitk >= 2 && TakesSplitK(config.precision)) {
    details["splitk"] = absl::StrCat(config.splitk);
    details["reduction"] = config.reduce == SplitKReduce::kOutput
                               ? "partials rounded to the output type and added in it"
                               : "partials added in fp32";
  }
  if (IsBlockScaled(config.precision)) {
    const BlockScaledOperands b = BlockScaledOperandsOf(config.precision);
    details["block_scaling"] = absl::StrCat(
        DTypeName(b.values), " values, ", DTypeName(b.scales), " scales per ", b.block,
        " elements of K", config.precision == Precision::kNvFp4 ? ", per-tensor fp32 scales" : "");
    if (config.precision != Precision::kNvFp4) {
      details["scale_rounding"] = std::string(MxScaleRoundingName(config.mx_rounding));
    }
    details["accumulation"] = "fp32 GEMM of the dequantised values";
  }
  if (const std::optional<KernelOrder> order = KernelOrderOf(config)) {
    const TensorCoreModel& m = order->model;
    details["replay"] = absl::StrCat(
        TensorCoreGpuName(*config.mma), " tensor-core model: blocks of ", m.block,
        " products aligned to ", m.align_bits, " fraction bits, truncated to ", m.result_bits,
        " bits",
        order->tile_k > 0 ? absl::StrCat("; K tiles of ", order->tile_k, ", residue ",
                                         KResidueName(order->residue))
                          : "",
        order->promote > 0 ? absl::StrCat("; promoted to fp32 every ", order->promote) : "");
  }
  if (IsFp8(config.precision)) {
    details["fp8_scaling"] = std::string(Fp8ScalingName(config.scaling));
    if (config.mma.has_value()) {
      details["accumulation"] = config.fast_accum ? "fast (the tensor-core model's chain)"
                                                  : "fp32 (promotions of the model's partials)";
    } else if (config.fast_accum) {
      const FastAccumModel model;
      details["accumulation"] =
          absl::StrCat("fast (model: ", model.accumulator_bits, " fraction bits, groups of ",
                       model.group, ", truncating)");
    } else {
      details["accumulation"] = "fp32 (split accumulator)";
    }
  }
  return details;
}

}  // namespace

int CpuBackend::threads() const {
  if (options_.threads > 0) return options_.threads;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

absl::StatusOr<RunResult> CpuBackend::Run(const LinearProblem& problem, const Config& config,
                                          const RunOptions& options) {
  TC_RETURN_IF_ERROR(CheckProblem(problem));
  const Arithmetic arithmetic = ArithmeticOf(problem, config);
  auto run_once = [&]() -> absl::StatusOr<Tensor> {
    TC_ASSIGN_OR_RETURN(Tensor acc, ScaledAccumulate(problem, arithmetic, threads(),
                                                     options_.weight_block_columns, options.stop));
    return Finish(problem, config, acc, /*in_place=*/true);
  };
  RunResult result;
  TC_ASSIGN_OR_RETURN(result.output, run_once());
  const int repeat = std::max(1, options.repeat);
  for (int r = 1; r < repeat; ++r) {
    TC_RETURN_IF_ERROR(CheckStop(options.stop));
    TC_ASSIGN_OR_RETURN(Tensor again, run_once());
    if (again.bytes() != result.output.bytes()) result.deterministic = false;
  }
  result.runs = repeat;
  result.details = DetailsOf(config);
  return result;
}

absl::Status CpuBackend::RunBatch(const LinearProblem& problem,
                                  const std::vector<PreparedRun>& runs, const RunOptions& options,
                                  const BatchConsumer& consume) {
  // Repeated runs check each configuration's own determinism.
  if (options.repeat > 1) {
    return LinearBackend::RunBatch(problem, runs, options, consume);
  }
  std::vector<Config> configs;
  configs.reserve(runs.size());
  for (const PreparedRun& run : runs) {
    TC_RETURN_IF_ERROR(run.status());
    configs.push_back(run.config());
  }
  TC_RETURN_IF_ERROR(CheckProblem(problem));
  // Configurations grouped by arithmetic, groups in the order of their
  // first member (so configs[0] comes first).
  struct Group {
    Arithmetic arithmetic;
    std::vector<size_t> members;
  };
  std::vector<Group> groups;
  // ArithmeticOf may scan the operands (ValuesExactIn): once per precision
  // and FP8 options, not once per configuration (fused, unfused and the
  // reference share one).
  std::map<std::tuple<Precision, Fp8Scaling, bool, MxScaleRounding, int, SplitKReduce,
                      std::optional<TensorCoreGpu>, int64_t, KResidue>,
           Arithmetic>
      arithmetic_of;
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const auto key = std::make_tuple(c.precision, c.scaling, c.fast_accum, c.mx_rounding, c.splitk,
                                     c.reduce, c.mma, c.tile_k, c.residue);
    auto known = arithmetic_of.find(key);
    if (known == arithmetic_of.end())
      known = arithmetic_of.emplace(key, ArithmeticOf(problem, c)).first;
    const Arithmetic a = known->second;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.arithmetic == a; });
    if (it == groups.end()) {
      groups.push_back({a, {i}});
    } else {
      it->members.push_back(i);
    }
  }
  for (const Group& group : groups) {
    const std::vector<size_t>& members = group.members;
    const Config& first = configs[members.front()];
    absl::StatusOr<Tensor> accumulated = ScaledAccumulate(
        problem, group.arithmetic, threads(), options_.weight_block_columns, options.stop);
    if (!accumulated.ok()) {
      return WithConfigContext(accumulated.status(), first);
    }
    Tensor& acc = *accumulated;
    for (size_t j = 0; j < members.size();) {
      // Members j..same-1 name the same configuration (a reference that is
      // also a candidate): one epilogue, copies of its output.
      const Config& config = configs[members[j]];
      size_t same = j + 1;
      while (same < members.size() && configs[members[same]] == config) ++same;
      absl::StatusOr<Tensor> finished =
          Finish(problem, config, acc, /*in_place=*/same == members.size());
      if (!finished.ok()) {
        return WithConfigContext(finished.status(), config);
      }
      Tensor output = *std::move(finished);
      for (size_t d = j; d < same; ++d) {
        RunResult result;
        result.output = d + 1 < same ? output.Clone() : std::move(output);
        result.details = DetailsOf(config);
        if (d > 0) result.shared_computation = first.ToString();
        TC_RETURN_IF_ERROR(consume(members[d], std::move(result)));
      }
      j = same;
    }
  }
  return absl::OkStatus();
}

}  // namespace tensorcheck
