// Replays of a named GPU's default kernels (docs/numerics.md, "Kernel K
// order"): the GPU names a request may give, and the K orders cuBLASLt's
// heuristic kernels walk, per precision and shape, as a GPU run records
// them (the GPU pack's kernel_orders/<generation>.json, loaded by the
// server's --kernel_orders flag).
//
//   TC_ASSIGN_OR_RETURN(TensorCoreGpu gpu, ParseGpuName("h100", "gpu"));
//   ReplayOrder r = ReplayOrderFor(tables, gpu, Precision::kBf16, 1921, 3072, 4096);
//   // r.options: "mma=sm90,tile_k=64" when recorded, "mma=sm90" otherwise.
//
// Pure functions and immutable tables: thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/linear_config.h"
#include "core/tensor_core_model.h"

namespace tensorcheck {

// One kernel the heuristic picked on the recording GPU: its precision and
// layer (m rows of x, n outputs, k inputs) and the replay's options
// (`mma=...[,tile_k=N][,residue=...][,splitk=N,reduce=...]`).
struct RecordedKernel {
  Precision precision = Precision::kBf16;
  int64_t m = 0, n = 0, k = 0;
  std::string options;
};

// The kernels one GPU run recorded.
struct KernelOrderTable {
  TensorCoreGpu gpu = TensorCoreGpu::kSm90;
  std::string device;    // the GPU's name, as CUDA gives it
  std::string recorded;  // the UTC date of the run
  std::vector<RecordedKernel> kernels;
};

// The GPU names a request may give (`gpu`): a100 (sm80), h100, h200,
// gh200 (sm90), b200, gb200 (sm100), and the generations' own names
// sm80, sm90, sm100. Case-insensitive. INVALID_ARGUMENT naming `field`
// and the accepted names.
absl::StatusOr<TensorCoreGpu> ParseGpuName(absl::string_view name, absl::string_view field);

// A table from its JSON (the format docs/numerics.md gives); `source`
// names it in errors. INVALID_ARGUMENT on a malformed table or kernel
// (a precision without a replay, options that do not parse for it or
// name another generation).
absl::StatusOr<KernelOrderTable> ParseKernelOrderTable(absl::string_view json,
                                                       absl::string_view source);

// Every *.json file of `dir`, in name order; an error names the file.
absl::StatusOr<std::vector<KernelOrderTable>> LoadKernelOrderTables(const std::string& dir);

// The replay of `gpu`'s default kernel for this precision and layer: the
// recorded kernel of the same precision (the TF32 roundings share TF32's
// records) and layer, else the generation's model with no tile (blocks
// from k = 0, no split: what a kernel without split-K walks when K is a
// multiple of its tile); `source` says which, in a sentence.
struct ReplayOrder {
  std::string options;
  std::string source;
};
ReplayOrder ReplayOrderFor(const std::vector<KernelOrderTable>& tables, TensorCoreGpu gpu,
                           Precision precision, int64_t m, int64_t n, int64_t k);

}  // namespace tensorcheck
