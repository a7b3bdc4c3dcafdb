// Batch invariance: does a configuration give a row the same bits whatever
// batch the row is computed in? Libraries choose kernels by the problem's
// shape (cuBLASLt's heuristic looks at M), and kernels that split K or tile
// differently sum in other orders, so `linear(x)[:1]` need not equal
// `linear(x[:1])` (docs/numerics.md, "Batch invariance").
//
//   TC_ASSIGN_OR_RETURN(BatchInvarianceOutcome b,
//                       CheckBatchInvariance(*backend, prepared, problem, {1, 8}, options));
//   b.invariant, b.sub_batches[0].rows_differing, b.sub_batches[0].details["algo"]
//
// The whole batch runs once more (so its algorithm is reported beside the
// sub-batches'), then each sub-batch size s runs rows [0, s), [s, 2s), ...
// (the last run may hold fewer rows) and every row is compared bit for bit
// with the whole batch's. Row-wise FP8 input scales are sliced with their
// rows; a per-tensor scale is the same for every run, while a recipe the
// server applies to wide operands takes each run's own amax, as a dynamic
// quantisation in a serving stack does.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/linear_config.h"
#include "server/backends/linear_backend.h"

namespace tensorcheck {

struct SubBatchOutcome {
  int64_t batch_size = 0;  // rows per run
  int64_t runs = 0;
  // Rows not bitwise identical to the whole batch's, and the largest ULP
  // distance (in the output dtype) of any of their elements.
  int64_t rows_differing = 0;
  uint64_t max_ulp = 0;
  // What the backend reported of the run of `batch_size` rows (the
  // algorithm it chose: "algo", "algo_tile", ...; timings left out), and
  // of the last, shorter run when there is one.
  std::map<std::string, std::string> details;
  std::map<std::string, std::string> tail_details;
  int64_t tail_rows = 0;  // 0 when every run has batch_size rows
};

struct BatchInvarianceOutcome {
  // Every row bitwise identical in every sub-batch size.
  bool invariant = true;
  int64_t rows = 0;            // M
  int64_t rows_differing = 0;  // rows that differ in some sub-batch size
  uint64_t max_ulp = 0;
  std::map<std::string, std::string> full_batch_details;
  std::vector<SubBatchOutcome> sub_batches;  // in the order of `batch_sizes`
};

// Runs `prepared` (its configuration prepared by `backend` for
// `problem`) on the whole `problem`, and its configuration on sub-batches
// of each size in `batch_sizes` (each in 1..m, checked by the caller;
// prepared once per number of rows, a layer of its own) and compares the
// rows. Stops with options.stop's status between runs.
absl::StatusOr<BatchInvarianceOutcome> CheckBatchInvariance(LinearBackend& backend,
                                                            const PreparedRun& prepared,
                                                            const LinearProblem& problem,
                                                            const std::vector<int64_t>& batch_sizes,
                                                            const RunOptions& options);

// Backend details that describe the kernel, not the run (timings dropped).
std::map<std::string, std::string> KernelDetails(const std::map<std::string, std::string>& details);

}  // namespace tensorcheck
