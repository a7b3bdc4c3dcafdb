#include "server/backends/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/float_formats.h"
#include "server/core/status_macros.h"

namespace tensorcheck {

namespace {

// OpenBLAS's cblas interface takes `blasint` (int in the LP64 build Debian
// ships) for every dimension and leading dimension.
constexpr int64_t kMaxBlasDim = std::numeric_limits<int>::max();

absl::Status CheckDim(int64_t v, absl::string_view name) {
  if (v < 0 || v > kMaxBlasDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("problem.", name, ": a dimension in [0, ", kMaxBlasDim,
                     "] expected, got ", v));
  }
  return absl::OkStatus();
}

// Sanity checks only: the engine validates requests. These keep a caller
// that skipped validation from reading out of bounds.
absl::Status CheckProblem(const LinearProblem& p) {
  if (p.input == nullptr)
    return absl::InvalidArgumentError(
        "problem.input: tensor expected, got null");
  if (p.weight == nullptr)
    return absl::InvalidArgumentError(
        "problem.weight: tensor expected, got null");
  TC_RETURN_IF_ERROR(CheckDim(p.m, "m"));
  TC_RETURN_IF_ERROR(CheckDim(p.n, "n"));
  TC_RETURN_IF_ERROR(CheckDim(p.k, "k"));
  // m, n, k < 2^31, so their pairwise products fit in int64.
  if (p.input->numel() != p.m * p.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input: m*k = ", p.m * p.k, " elements expected, got shape ",
        ShapeString(p.input->shape())));
  }
  const int64_t rows = p.layout == WeightLayout::kOutIn ? p.n : p.k;
  const int64_t cols = p.layout == WeightLayout::kOutIn ? p.k : p.n;
  if (p.weight->rank() != 2 || p.weight->dim(0) != rows ||
      p.weight->dim(1) != cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight: shape [", rows, ", ", cols, "] expected for layout ",
        WeightLayoutName(p.layout), ", got ", ShapeString(p.weight->shape())));
  }
  if (p.bias != nullptr && p.bias->numel() != p.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias: ", p.n, " elements expected, got shape ",
                     ShapeString(p.bias->shape())));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::unique_ptr<T[]>> Allocate(int64_t count) {
  std::unique_ptr<T[]> p(
      new (std::nothrow) T[static_cast<size_t>(std::max<int64_t>(count, 1))]);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", count * static_cast<int64_t>(sizeof(T)),
        " bytes of CPU working memory"));
  }
  return p;
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
      return RoundAll(v, count, [](float f) {
        return RoundToTf32(f, Tf32Rounding::kNearestEven);
      });
    case Precision::kTf32Rna:
      return RoundAll(v, count, [](float f) {
        return RoundToTf32(f, Tf32Rounding::kTiesAway);
      });
    case Precision::kTf32Trunc:
      return RoundAll(v, count, [](float f) {
        return RoundToTf32(f, Tf32Rounding::kTruncate);
      });
    case Precision::kBf16:
      return RoundAll(v, count, [](float f) { return RoundToBf16(f); });
    case Precision::kFp16:
    case Precision::kFp16Acc:
      return RoundAll(v, count, [](float f) { return RoundToFp16(f); });
  }
}

// An operand as fp32 values rounded for `p`. fp32 storage read at fp32
// precision is used in place (no copy); anything else is converted once
// into `owned`.
absl::StatusOr<const float*> FloatOperand(const Tensor& t, Precision p,
                                          std::unique_ptr<float[]>* owned) {
  const bool needs_rounding = p != Precision::kFp32 && p != Precision::kFp64;
  if (t.dtype() == DType::kFloat32 && !needs_rounding) return t.data<float>();
  TC_ASSIGN_OR_RETURN(*owned, Allocate<float>(t.numel()));
  ToFloat(t, owned->get());
  RoundInputs(p, owned->get(), t.numel());
  return static_cast<const float*>(owned->get());
}

absl::StatusOr<const double*> DoubleOperand(const Tensor& t,
                                            std::unique_ptr<double[]>* owned) {
  if (t.dtype() == DType::kFloat64) return t.data<double>();
  TC_ASSIGN_OR_RETURN(*owned, Allocate<double>(t.numel()));
  ToDouble(t, owned->get());
  return static_cast<const double*>(owned->get());
}

// c[m, n] = x[m, k] * w^T, w stored [n, k] (OUT_IN) or [k, n] (IN_OUT); the
// layout becomes BLAS's transpose flag, never a copy.
void Gemm(const float* x, const float* w, WeightLayout layout, int64_t m,
          int64_t n, int64_t k, float* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, 0.0f);
    return;
  }
  const bool out_in = layout == WeightLayout::kOutIn;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0f, x, static_cast<int>(k), w, static_cast<int>(out_in ? k : n),
              0.0f, c, static_cast<int>(n));
}

void Gemm(const double* x, const double* w, WeightLayout layout, int64_t m,
          int64_t n, int64_t k, double* c) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + m * n, 0.0);
    return;
  }
  const bool out_in = layout == WeightLayout::kOutIn;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
              1.0, x, static_cast<int>(k), w, static_cast<int>(out_in ? k : n),
              0.0, c, static_cast<int>(n));
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
    return T(0.5) * v *
           (T(1) + std::tanh(kSqrt2OverPi * (v + kCoeff * v * v * v)));
  }
}

// `acc` and `out` may alias (fp32 accumulator written in place as fp32
// output): each element is read before it is written.
template <typename T, DType kOut, Activation kAct>
void EpilogueLoop(const T* acc, const T* bias, bool unfused, int64_t m,
                  int64_t n, typename OutStorage<kOut>::type* out) {
  for (int64_t i = 0; i < m; ++i) {
    const T* a = acc + i * n;
    auto* y = out + i * n;
    if (!unfused) {
      // fused: round_out(act(acc + b)), one rounding.
      if (bias != nullptr) {
        for (int64_t j = 0; j < n; ++j)
          y[j] = Store<kOut>(Activate<kAct>(a[j] + bias[j]));
      } else {
        for (int64_t j = 0; j < n; ++j)
          y[j] = Store<kOut>(Activate<kAct>(a[j]));
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
void EpilogueForAct(const T* acc, const T* bias, bool unfused, Activation act,
                    int64_t m, int64_t n, Tensor* out) {
  auto* y = out->data<typename OutStorage<kOut>::type>();
  switch (act) {
    case Activation::kNone:
      return EpilogueLoop<T, kOut, Activation::kNone>(acc, bias, unfused, m, n,
                                                      y);
    case Activation::kRelu:
      return EpilogueLoop<T, kOut, Activation::kRelu>(acc, bias, unfused, m, n,
                                                      y);
    case Activation::kGeluTanh:
      return EpilogueLoop<T, kOut, Activation::kGeluTanh>(acc, bias, unfused, m,
                                                          n, y);
  }
}

template <typename T>
void Epilogue(const T* acc, const T* bias, bool unfused, Activation act,
              int64_t m, int64_t n, Tensor* out) {
  switch (out->dtype()) {
    case DType::kFloat64:
      return EpilogueForAct<T, DType::kFloat64>(acc, bias, unfused, act, m, n,
                                                out);
    case DType::kFloat32:
      return EpilogueForAct<T, DType::kFloat32>(acc, bias, unfused, act, m, n,
                                                out);
    case DType::kFloat16:
      return EpilogueForAct<T, DType::kFloat16>(acc, bias, unfused, act, m, n,
                                                out);
    case DType::kBFloat16:
      return EpilogueForAct<T, DType::kBFloat16>(acc, bias, unfused, act, m, n,
                                                 out);
  }
}

// kNone with a bias present cannot come out of ResolveConfig; it is run as
// fused, the single-rounding form.
bool IsUnfused(const Config& config) {
  return config.bias == BiasMode::kUnfused;
}

// ---- fp16acc

// Rounds a double to the nearest fp16 value (ties to even; overflow to
// infinity; NaN stays NaN), kept as a double. A bit-level version of
// DoubleToFp16Bits for the O(mnk) inner loop.
inline double RoundToHalfValue(double s) {
  uint64_t a = DoubleBits(s);
  const uint64_t sign = a & 0x8000000000000000ull;
  a ^= sign;
  double r;
  if (a >= 0x40EFFE0000000000ull) {  // |s| >= 65520 (the tie above 65504)
    if (a > 0x7FF0000000000000ull) return s;  // NaN
    r = std::numeric_limits<double>::infinity();
  } else if (a < 0x3F10000000000000ull) {  // |s| < 2^-14: quantum 2^-24
    // ulp(2^28) is 2^-24, so adding and removing 2^28 rounds to a multiple
    // of 2^-24 in the current (nearest-even) rounding mode.
    r = (BitsToDouble(a) + 0x1p28) - 0x1p28;
  } else {
    // Keep 10 of the 52 mantissa bits, ties to even; a carry into the
    // exponent is the correct result.
    a += (uint64_t{1} << 41) - 1 + ((a >> 42) & 1);
    a &= ~((uint64_t{1} << 42) - 1);
    r = BitsToDouble(a);
  }
  return sign != 0 ? -r : r;
}

// acc[i, j] = fp16(... fp16(fp16(0 + x_i0 w_j0) + x_i1 w_j1) ...), k
// ascending, each multiply-add exact in double and rounded once to fp16.
// Each element is one serial chain of roundings; several columns advance
// together so that the chains overlap in the pipeline.
void Fp16AccumulateRows(const float* x, const float* w, WeightLayout layout,
                        int64_t row_begin, int64_t row_end, int64_t n,
                        int64_t k, float* acc) {
  constexpr int64_t kCols = 8;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* xi = x + i * k;
    float* ci = acc + i * n;
    if (layout == WeightLayout::kOutIn) {
      for (int64_t j0 = 0; j0 < n; j0 += kCols) {
        const int64_t cols = std::min(kCols, n - j0);
        double s[kCols] = {};
        for (int64_t kk = 0; kk < k; ++kk) {
          const double xv = xi[kk];
          for (int64_t c = 0; c < cols; ++c) {
            s[c] = RoundToHalfValue(
                s[c] + xv * static_cast<double>(w[(j0 + c) * k + kk]));
          }
        }
        for (int64_t c = 0; c < cols; ++c)
          ci[j0 + c] = static_cast<float>(s[c]);
      }
    } else {
      // IN_OUT: sweep k outside so the weight rows are read contiguously;
      // each element still accumulates in k-ascending order.
      std::fill(ci, ci + n, 0.0f);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double xv = xi[kk];
        const float* wk = w + kk * n;
        for (int64_t j = 0; j < n; ++j) {
          ci[j] = static_cast<float>(RoundToHalfValue(
              static_cast<double>(ci[j]) + xv * static_cast<double>(wk[j])));
        }
      }
    }
  }
}

void Fp16Accumulate(const float* x, const float* w, WeightLayout layout,
                    int64_t m, int64_t n, int64_t k, int threads, float* acc) {
  const int64_t work = m * n * std::max<int64_t>(k, 1);
  int64_t parts = std::min<int64_t>(threads, m);
  if (work < (int64_t{1} << 20)) parts = 1;
  if (parts <= 1) {
    Fp16AccumulateRows(x, w, layout, 0, m, n, k, acc);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(parts));
  int64_t next = 0;
  for (int64_t t = 0; t < parts; ++t) {
    const int64_t begin = m * t / parts;
    const int64_t end = m * (t + 1) / parts;
    try {
      pool.emplace_back(Fp16AccumulateRows, x, w, layout, begin, end, n, k,
                        acc);
    } catch (const std::system_error&) {
      break;  // No thread to be had: the rest runs on this one.
    }
    next = end;
  }
  Fp16AccumulateRows(x, w, layout, next, m, n, k, acc);
  for (auto& th : pool) th.join();
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

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const Options& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads: 0 (all cores) or a positive count expected, got ",
        options.threads));
  }
  // OpenBLAS's thread count is process-wide; the CPU backend is its only
  // user in the server.
  if (options.threads > 0) openblas_set_num_threads(options.threads);
  return std::unique_ptr<CpuBackend>(new CpuBackend(options));
}

std::vector<Precision> CpuBackend::precisions() const {
  return std::vector<Precision>(std::begin(kAllPrecisions),
                                std::end(kAllPrecisions));
}

std::vector<BiasMode> CpuBackend::bias_modes() const {
  return {BiasMode::kNone, BiasMode::kFused, BiasMode::kUnfused};
}

std::vector<DType> CpuBackend::storage_dtypes() const {
  return std::vector<DType>(std::begin(kAllDTypes), std::end(kAllDTypes));
}

namespace {

absl::StatusOr<Tensor> RunFloat(const LinearProblem& p, const Config& config) {
  const Precision prec = config.precision;
  std::unique_ptr<float[]> x_owned, w_owned, acc_owned;
  TC_ASSIGN_OR_RETURN(const float* x, FloatOperand(*p.input, prec, &x_owned));
  TC_ASSIGN_OR_RETURN(const float* w, FloatOperand(*p.weight, prec, &w_owned));
  TC_ASSIGN_OR_RETURN(Tensor out, Tensor::Create(p.output_dtype, {p.m, p.n}));
  // An fp32 output is its own accumulator: the epilogue runs in place.
  float* acc = nullptr;
  if (p.output_dtype == DType::kFloat32) {
    acc = out.data<float>();
  } else {
    TC_ASSIGN_OR_RETURN(acc_owned, Allocate<float>(p.m * p.n));
    acc = acc_owned.get();
  }
  Gemm(x, w, p.layout, p.m, p.n, p.k, acc);
  std::vector<float> bias;
  if (p.bias != nullptr) {
    bias.resize(static_cast<size_t>(p.n));
    ToFloat(*p.bias, bias.data());  // exact unless the bias is stored fp64
  }
  Epilogue<float>(acc, p.bias != nullptr ? bias.data() : nullptr,
                  IsUnfused(config), p.activation, p.m, p.n, &out);
  return out;
}

absl::StatusOr<Tensor> RunDouble(const LinearProblem& p, const Config& config) {
  std::unique_ptr<double[]> x_owned, w_owned, acc_owned;
  TC_ASSIGN_OR_RETURN(const double* x, DoubleOperand(*p.input, &x_owned));
  TC_ASSIGN_OR_RETURN(const double* w, DoubleOperand(*p.weight, &w_owned));
  TC_ASSIGN_OR_RETURN(Tensor out, Tensor::Create(p.output_dtype, {p.m, p.n}));
  double* acc = nullptr;
  if (p.output_dtype == DType::kFloat64) {
    acc = out.data<double>();
  } else {
    TC_ASSIGN_OR_RETURN(acc_owned, Allocate<double>(p.m * p.n));
    acc = acc_owned.get();
  }
  Gemm(x, w, p.layout, p.m, p.n, p.k, acc);
  std::vector<double> bias;
  if (p.bias != nullptr) {
    bias.resize(static_cast<size_t>(p.n));
    ToDouble(*p.bias, bias.data());
  }
  Epilogue<double>(acc, p.bias != nullptr ? bias.data() : nullptr,
                   IsUnfused(config), p.activation, p.m, p.n, &out);
  return out;
}

absl::StatusOr<Tensor> RunFp16Acc(const LinearProblem& p, const Config& config,
                                  int threads) {
  std::unique_ptr<float[]> x_owned, w_owned;
  TC_ASSIGN_OR_RETURN(const float* x,
                      FloatOperand(*p.input, Precision::kFp16Acc, &x_owned));
  TC_ASSIGN_OR_RETURN(const float* w,
                      FloatOperand(*p.weight, Precision::kFp16Acc, &w_owned));
  TC_ASSIGN_OR_RETURN(Tensor out, Tensor::Create(p.output_dtype, {p.m, p.n}));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> acc, Allocate<float>(p.m * p.n));
  Fp16Accumulate(x, w, p.layout, p.m, p.n, p.k, threads, acc.get());
  std::vector<float> bias;
  if (p.bias != nullptr) {
    bias.resize(static_cast<size_t>(p.n));
    ToFloat(*p.bias, bias.data());
  }
  Epilogue<float>(acc.get(), p.bias != nullptr ? bias.data() : nullptr,
                  IsUnfused(config), p.activation, p.m, p.n, &out);
  return out;
}

}  // namespace

absl::StatusOr<RunResult> CpuBackend::Run(const LinearProblem& problem,
                                          const Config& config,
                                          const RunOptions& options) {
  TC_RETURN_IF_ERROR(CheckProblem(problem));
  int threads = options_.threads;
  if (threads <= 0)
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto run_once = [&]() -> absl::StatusOr<Tensor> {
    switch (config.precision) {
      case Precision::kFp64:
        return RunDouble(problem, config);
      case Precision::kFp16Acc:
        return RunFp16Acc(problem, config, threads);
      default:
        return RunFloat(problem, config);
    }
  };
  RunResult result;
  TC_ASSIGN_OR_RETURN(result.output, run_once());
  const int repeat = std::max(1, options.repeat);
  for (int r = 1; r < repeat; ++r) {
    TC_ASSIGN_OR_RETURN(Tensor again, run_once());
    if (again.bytes() != result.output.bytes()) result.deterministic = false;
  }
  result.runs = repeat;
  result.details["blas"] = "openblas";
  const PrecisionInfo info = GetPrecisionInfo(config.precision);
  if (info.tf32_rounding.has_value()) {
    result.details["tf32_rounding"] =
        std::string(Tf32RoundingName(*info.tf32_rounding));
  }
  return result;
}

absl::Status ComputeMagnitudeSums(const LinearProblem& p, float* abs_dot,
                                  float* sq_dot) {
  TC_RETURN_IF_ERROR(CheckProblem(p));
  if (abs_dot == nullptr || sq_dot == nullptr) {
    return absl::InvalidArgumentError(
        "abs_dot, sq_dot: m*n floats expected, got null");
  }
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> x,
                      Allocate<float>(p.input->numel()));
  TC_ASSIGN_OR_RETURN(std::unique_ptr<float[]> w,
                      Allocate<float>(p.weight->numel()));
  ToFloat(*p.input, x.get());
  ToFloat(*p.weight, w.get());
  const int64_t nx = p.input->numel();
  const int64_t nw = p.weight->numel();
  for (int64_t i = 0; i < nx; ++i) x[i] = std::fabs(x[i]);
  for (int64_t i = 0; i < nw; ++i) w[i] = std::fabs(w[i]);
  Gemm(x.get(), w.get(), p.layout, p.m, p.n, p.k, abs_dot);
  for (int64_t i = 0; i < nx; ++i) x[i] *= x[i];
  for (int64_t i = 0; i < nw; ++i) w[i] *= w[i];
  Gemm(x.get(), w.get(), p.layout, p.m, p.n, p.k, sq_dot);
  const int64_t mn = p.m * p.n;
  for (int64_t i = 0; i < mn; ++i) sq_dot[i] = std::sqrt(sq_dot[i]);
  return absl::OkStatus();
}

}  // namespace tensorcheck
