// Backends whose outputs live on a device compare them there, so that only
// the statistics come back (docs/architecture.md: on a GPU host the statistics run on
// the device). The engine asks LinearBackend::comparing() and, when it is
// not null, hands the comparisons to RunAndCompare instead of comparing on
// the host.
//
//   if (ComparingBackend* c = backend->comparing()) {
//     OutputComparison vs_ref{&reference, /*output_is_actual=*/true, opts};
//     PreparedRun prepared = backend->Prepare(problem, config);
//     TC_ASSIGN_OR_RETURN(ComparedRun r,
//                         c->RunAndCompare(problem, prepared, {}, {vs_ref}, false));
//     r.stats[0].max_abs, ...
//   }
//
// This is the one place where the backends' interface meets stats' types;
// linear_backend.h stays free of them (stats depends on backends' config).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "server/backends/linear_backend.h"
#include "server/stats/diff_stats.h"

namespace tensorcheck {

// Compare(output, other) when output_is_actual, else Compare(other, output),
// with `options` (its predicted_sigma/error_bound are host arrays).
struct OutputComparison {
  const Tensor* other = nullptr;
  bool output_is_actual = true;
  CompareOptions options;
};

struct ComparedRun {
  // `run.output` is empty unless the output was asked for.
  RunResult run;
  std::vector<DiffStats> stats;  // one per comparison, in order
};

class ComparingBackend {
 public:
  virtual ~ComparingBackend() = default;

  // Runs `prepared` as LinearBackend::Run, then the comparisons where the
  // output is. Errors: Run's, and INVALID_ARGUMENT as Compare answers.
  virtual absl::StatusOr<ComparedRun> RunAndCompare(
      const LinearProblem& problem, const PreparedRun& prepared, const RunOptions& options,
      const std::vector<OutputComparison>& comparisons, bool return_output) = 0;
};

}  // namespace tensorcheck
