// The `cpu` backend: exact CPU emulation of every precision of docs/numerics.md.
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> cpu, CpuBackend::Create({}));
//   TC_ASSIGN_OR_RETURN(RunResult r, cpu->Run(problem, config, RunOptions{}));
//
// Products of two TF32, bf16 or fp16 values are exact in fp32, so an
// fp32-accumulate mode is emulated by rounding the inputs to the format and
// running OpenBLAS sgemm; fp64 runs dgemm; fp16acc rounds the running sum to
// fp16 after every multiply-add. Only the summation order differs from a
// GPU.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck {

class CpuBackend final : public LinearBackend {
 public:
  struct Options {
    // BLAS and element-wise worker threads; 0: all cores.
    int threads = 0;
    // A weight that must be converted for a GEMM (any but fp32 at fp32 and
    // fp64 at fp64) is converted one block of output columns at a time:
    // 0 sizes the blocks by stats' kWeightBlockBytes (32 MiB of converted
    // weight, 64 MiB at most); a positive count asks for blocks of about
    // that many columns (tests use a few; see PlanWeightBlocks). The
    // output is the same bit for bit either way.
    int64_t weight_block_columns = 0;
  };

  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const Options& options);

  absl::string_view name() const override { return "cpu"; }
  BackendKind kind() const override { return BackendKind::kHostEmulation; }
  absl::Status Available() const override { return absl::OkStatus(); }
  std::vector<Precision> precisions() const override;
  std::vector<BiasMode> bias_modes() const override;
  BiasMode default_bias_mode() const override { return BiasMode::kFused; }
  bool replays_kernels() const override { return true; }
  std::vector<DType> storage_dtypes() const override;

  using LinearBackend::Run;
  absl::StatusOr<RunResult> Run(const LinearProblem& problem, const Config& config,
                                const RunOptions& options) override;

  // One GEMM per arithmetic: configurations whose input rounding leaves the
  // stored values unchanged share an fp32 GEMM (bf16 tensors under fp32,
  // tf32, tf32rna, tf32trunc and bf16), and the fused and unfused variants
  // of one precision share theirs; each then runs its own epilogue.
  using LinearBackend::RunBatch;
  absl::Status RunBatch(const LinearProblem& problem, const std::vector<PreparedRun>& runs,
                        const RunOptions& options, const BatchConsumer& consume) override;

 private:
  explicit CpuBackend(const Options& options) : options_(options) {}
  int threads() const;  // options_.threads, or the core count
  Options options_;
};

}  // namespace tensorcheck
