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
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/dtype.h"
#include "server/core/float_formats.h"
#include "server/core/tensor.h"

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
};

inline constexpr Precision kAllPrecisions[] = {
    Precision::kFp64,      Precision::kFp32, Precision::kTf32, Precision::kTf32Rna,
    Precision::kTf32Trunc, Precision::kBf16, Precision::kFp16, Precision::kFp16Acc};

enum class BiasMode { kNone, kFused, kUnfused };

enum class Activation { kNone, kRelu, kGeluTanh };

enum class WeightLayout {
  kOutIn,  // [N, K]: torch.nn.Linear, candle
  kInOut,  // [K, N]: flax nn.Dense kernel
};

// "fp64", "fp32", "tf32", "tf32rna", "tf32trunc", "bf16", "fp16", "fp16acc".
absl::string_view PrecisionName(Precision p);
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

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
PrecisionInfo GetPrecisionInfo(Precision p);

// Rounds one input value as the precision's multiply sees it (identity for
// fp64/fp32).
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

// A parsed `backend:precision[:bias]` before the request is known.
struct ConfigSpec {
  std::string backend;
  Precision precision = Precision::kFp32;
  std::optional<BiasMode> bias;
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

  // Canonical `backend:precision:bias`.
  std::string ToString() const;
  bool operator==(const Config& o) const {
    return backend == o.backend && precision == o.precision && bias == o.bias;
  }
};

// Resolves the bias mode. Without a bias and without an activation whose
// placement can change the result (GELU), the mode is `none`: fused and
// unfused compute the same function. Otherwise an unspecified mode takes
// the backend's default.
Config ResolveConfig(const ConfigSpec& spec, bool has_bias, Activation activation,
                     BiasMode backend_default);

}  // namespace tensorcheck
