#include "server/backends/cuda/internal/multi_pass_rules.h"

#include "absl/strings/str_cat.h"

namespace tensorcheck::cuda::internal {

const char* PartComputeName(PartCompute c) {
  switch (c) {
    case PartCompute::k32F:
      return "CUBLAS_COMPUTE_32F";
    case PartCompute::k32FFastTf32:
      return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case PartCompute::k32FEmulated16BFx9:
      return "CUBLAS_COMPUTE_32F_EMULATED_16BFX9";
  }
  return "CUBLAS_COMPUTE_?";
}

absl::StatusOr<MultiPassGemm> CheckMultiPass(const MultiPassQuery& query) {
  const Config& c = query.config;
  const std::string cfg = c.ToString();
  if (!IsMultiPass(c.precision)) {
    return absl::InvalidArgumentError(
        absl::StrCat("configuration ", cfg, ": not a multi-pass precision"));
  }
  MultiPassGemm g;
  if (c.backend == "cublaslt") {
    g.method = MultiPassMethod::kPartialGemms;
    g.scheme = MultiPassSchemeOf(c.precision);
    g.part = g.scheme.tf32 ? DType::kFloat32 : DType::kBFloat16;
    g.compute = g.scheme.tf32 ? PartCompute::k32FFastTf32 : PartCompute::k32F;
    return g;
  }
  if (c.backend != "cublas") {
    return absl::InvalidArgumentError(
        absl::StrCat("configuration ", cfg, ": backend '", c.backend, "' is not a CUDA backend"));
  }
  if (c.precision != Precision::kBf16x9) {
    return absl::FailedPreconditionError(
        absl::StrCat("configuration ", cfg,
                     ": cuBLAS's own multi-pass arithmetic is BF16x9 only "
                     "(CUBLAS_COMPUTE_32F_EMULATED_16BFX9); use cublaslt:",
                     PrecisionName(c.precision), " for XLA's partial GEMMs"));
  }
  if (query.device.has_value() && (query.device->major < kEmulatedBf16x9Device.major ||
                                   (query.device->major == kEmulatedBf16x9Device.major &&
                                    query.device->minor < kEmulatedBf16x9Device.minor))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "configuration ", cfg,
        ": cuBLAS's BF16x9 emulation (CUBLAS_COMPUTE_32F_EMULATED_16BFX9) runs on Blackwell "
        "(compute capability ",
        kEmulatedBf16x9Device.major, ".", kEmulatedBf16x9Device.minor,
        " or later), this device is ", query.device->major, ".", query.device->minor,
        "; cublaslt:bf16x9 runs XLA's nine partial GEMMs on any device"));
  }
  g.method = MultiPassMethod::kCublasEmulatedBf16x9;
  g.part = DType::kFloat32;
  g.compute = PartCompute::k32FEmulated16BFx9;
  return g;
}

}  // namespace tensorcheck::cuda::internal
