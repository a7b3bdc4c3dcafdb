// A multi-pass precision on cuBLASLt (gemm_call.h, PrepareLtMultiPass):
// one prepared cublasLtMatmul per partial product, the partial sums and the
// epilogue by kernels. Why the epilogue is not cuBLASLt's: the definition is
// `act(guard(sum of the low partials) + hi*hi + b)` with each `+` one fp32
// rounding in that order (docs/numerics.md, "Multi-pass precisions"). A
// BIAS epilogue on the last GEMM with the running sum as C would leave that
// order to cuBLASLt (alpha*AB + beta*C + bias, in an order it does not
// document for every kernel, split-K included) and would need C in D's
// type (a bf16 D would round the sum before high x high is added); the
// kernels compute the CPU backend's fused epilogue, in the same order.
// The bias mode is fused (or none), as for every cublaslt configuration.
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/compare_args.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/gemm_call.h"

namespace tensorcheck::cuda::internal {
namespace {

class LtMultiPass final : public GemmCall {
 public:
  explicit LtMultiPass(const MultiPassOperands& operands) : ops_(operands) {}

  // One LtMatmul per partial product. They share the descriptors (same
  // types, shape and workspace; every array 256-byte aligned), so the
  // heuristic's entry `algo` is the same kernel for each.
  absl::Status Prepare(CudaContext& ctx, const RunOptions& options, absl::string_view cfg,
                       absl::string_view device_name, Details* details) {
    const size_t parts = static_cast<size_t>(ops_.scheme.parts);
    if (ops_.scheme.products.empty() || ops_.x_parts.size() != parts ||
        ops_.w_parts.size() != parts || ops_.sum == nullptr || ops_.partial == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("configuration ", cfg, ": multi-pass operands incomplete"));
    }
    for (const std::pair<int, int>& product : ops_.scheme.products) {
      GemmOperands g = ops_.part;
      g.x = ops_.x_parts[static_cast<size_t>(product.first)];
      g.w = ops_.w_parts[static_cast<size_t>(product.second)];
      g.d = nullptr;  // each pass writes its fp32 partial directly
      g.out = DType::kFloat32;
      g.bias = nullptr;
      g.activation = Activation::kNone;
      TC_ASSIGN_OR_RETURN(std::unique_ptr<GemmCall> pass,
                          PrepareLtMatmul(g, ctx, options, cfg, device_name, details));
      passes_.push_back(std::move(pass));
    }
    std::string steps = absl::StrCat(passes_.size(), " cublasLtMatmul (fp32 D), partial sums");
    if (ops_.bias != nullptr) absl::StrAppend(&steps, ", bias add (fp32)");
    if (ops_.activation != Activation::kNone) {
      absl::StrAppend(&steps, ", ", ActivationName(ops_.activation), " (fp32)");
    }
    absl::StrAppend(&steps, ", round to ", DTypeName(ops_.out));
    (*details)["steps"] = steps;
    (*details)["epilogue"] = "device kernels after the partial sums (no cuBLASLt epilogue)";
    return absl::OkStatus();
  }

  absl::Status Run(char* dst) override {
    const int64_t count = ops_.part.m * ops_.part.n;
    const cudaStream_t stream = ops_.part.stream;
    const size_t last = passes_.size() - 1;
    TC_RETURN_IF_ERROR(passes_[0]->Run(reinterpret_cast<char*>(ops_.sum)));
    for (size_t t = 1; t < passes_.size(); ++t) {
      TC_RETURN_IF_ERROR(passes_[t]->Run(reinterpret_cast<char*>(ops_.partial)));
      TC_CUDA_RETURN_IF_ERROR(
          LaunchAddPartial(ops_.sum, ops_.partial, /*guard=*/t == last, count, stream));
    }
    const ActKind act = ToActKind(ops_.activation);
    const ElemType out = ToElem(ops_.out);
    // round_out(act(acc + b)): the sum and the activation in fp32 (each
    // rounded to fp32, as the CPU's epilogue evaluates them), one rounding
    // to the output.
    if (ops_.bias != nullptr) {
      TC_CUDA_RETURN_IF_ERROR(LaunchBiasAdd(ops_.sum, ElemType::kF32, ops_.bias,
                                            ToElem(ops_.bias_type), ops_.part.m, ops_.part.n,
                                            stream));
    }
    TC_CUDA_RETURN_IF_ERROR(LaunchActivation(ops_.sum, ElemType::kF32, act, count, stream));
    TC_CUDA_RETURN_IF_ERROR(LaunchConvert(ops_.sum, ElemType::kF32, dst, out, count, stream));
    return absl::OkStatus();
  }

 private:
  const MultiPassOperands ops_;
  std::vector<std::unique_ptr<GemmCall>> passes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GemmCall>> PrepareLtMultiPass(
    const MultiPassOperands& operands, CudaContext& ctx, const RunOptions& options,
    absl::string_view cfg, absl::string_view device_name, Details* details) {
  auto call = std::make_unique<LtMultiPass>(operands);
  TC_RETURN_IF_ERROR(call->Prepare(ctx, options, cfg, device_name, details));
  return std::unique_ptr<GemmCall>(std::move(call));
}

}  // namespace tensorcheck::cuda::internal
