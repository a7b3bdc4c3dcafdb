// Fuzz target: the configuration-string parser (`backend:precision[:bias]`,
// core/linear_config.h) and the other names a request or the CLI
// spells (precision, bias mode, activation, weight layout, dtype,
// tolerance preset).
//
// An accepted spec must resolve to a Config whose canonical string parses
// back to the same Config; a refused one is INVALID_ARGUMENT. A crash,
// undefined behaviour or a broken round trip is a bug.
//
//   scripts/fuzz.sh 60     # builds build-fuzz, runs every target
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/linear_config.h"
#include "server/stats/tolerance.h"

namespace tensorcheck {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "config_fuzzer: %s\n", what.c_str());
  std::abort();
}

template <typename T>
void CheckRefusal(const absl::StatusOr<T>& r, absl::string_view what) {
  if (!r.ok() && r.status().code() != absl::StatusCode::kInvalidArgument) {
    Fail(absl::StrCat(what, ": unexpected status ", r.status().ToString()));
  }
}

void CheckSpec(absl::string_view text) {
  absl::StatusOr<ConfigSpec> spec = ParseConfigSpec(text, "configs[0]");
  CheckRefusal(spec, "ParseConfigSpec");
  if (!spec.ok()) return;
  for (const bool has_bias : {false, true}) {
    for (const Activation activation :
         {Activation::kNone, Activation::kRelu, Activation::kGeluTanh}) {
      for (const BiasMode fallback : {BiasMode::kFused, BiasMode::kUnfused}) {
        const Config config = ResolveConfig(*spec, has_bias, activation, fallback);
        const std::string canonical = config.ToString();
        absl::StatusOr<ConfigSpec> again = ParseConfigSpec(canonical);
        if (!again.ok()) {
          Fail(absl::StrCat("canonical '", canonical, "' is refused: ", again.status().ToString()));
        }
        const Config resolved = ResolveConfig(*again, has_bias, activation, fallback);
        if (!(resolved == config) || resolved.ToString() != canonical) {
          Fail(absl::StrCat("'", text, "' -> '", canonical, "' -> '", resolved.ToString(), "'"));
        }
      }
    }
  }
}

template <typename Parse, typename Name>
void CheckNameRoundTrip(absl::string_view text, Parse parse, Name name, absl::string_view what) {
  auto parsed = parse(text);
  CheckRefusal(parsed, what);
  if (!parsed.ok()) return;
  auto again = parse(name(*parsed));
  if (!again.ok() || *again != *parsed) {
    Fail(absl::StrCat(what, ": '", text, "' does not round-trip through its name"));
  }
}

}  // namespace
}  // namespace tensorcheck

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorcheck;  // NOLINT(build/namespaces): a C entry point
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  CheckSpec(text);
  CheckNameRoundTrip(text, ParsePrecision, PrecisionName, "precision");
  CheckNameRoundTrip(text, ParseBiasMode, BiasModeName, "bias mode");
  CheckNameRoundTrip(text, ParseActivation, ActivationName, "activation");
  CheckNameRoundTrip(text, ParseWeightLayout, WeightLayoutName, "weight layout");
  CheckNameRoundTrip(text, ParseDType, DTypeName, "dtype");
  CheckNameRoundTrip(text, ParseDType, DTypeShortName, "dtype (short name)");
  CheckNameRoundTrip(text, ParseTolerancePreset, TolerancePresetName, "tolerance preset");
  return 0;
}
