#include "server/engine/batch_invariance.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/stop_signal.h"
#include "server/stats/ulp.h"

namespace tensorcheck {
namespace {

// Rows [first, first + rows) of a row-major tensor whose rows hold
// `row_elems` elements, as a view (the request outlives it). FP4 rows of
// an even length start on a byte (the request's checks see to it).
absl::StatusOr<Tensor> RowsOf(const Tensor& t, int64_t first, int64_t rows, int64_t row_elems,
                              std::vector<int64_t> shape) {
  const auto* base = static_cast<const char*>(t.raw());
  return Tensor::Borrow(t.dtype(), std::move(shape),
                        base + StorageBytes(t.dtype(), first * row_elems),
                        static_cast<size_t>(StorageBytes(t.dtype(), rows * row_elems)), nullptr);
}

// The rows of the whole batch's output and a sub-batch's, compared.
class RowComparison {
 public:
  RowComparison(const Tensor& whole, int64_t n) : whole_(whole), n_(n) {}

  // Compares `part` (rows first.. of the whole) into `sub` and marks the
  // rows that differ in `differing`.
  void Add(const Tensor& part, int64_t first, SubBatchOutcome* sub,
           std::vector<bool>* differing) const {
    const size_t row_bytes = static_cast<size_t>(n_) * ItemSize(whole_.dtype());
    const auto* a = static_cast<const char*>(whole_.raw());
    const auto* b = static_cast<const char*>(part.raw());
    const int64_t rows = part.numel() / n_;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t row = first + r;
      if (std::memcmp(a + static_cast<size_t>(row) * row_bytes,
                      b + static_cast<size_t>(r) * row_bytes, row_bytes) == 0) {
        continue;
      }
      ++sub->rows_differing;
      (*differing)[static_cast<size_t>(row)] = true;
      for (int64_t j = 0; j < n_; ++j) {
        const uint64_t ulp =
            UlpDistance(whole_.GetDouble(row * n_ + j), part.GetDouble(r * n_ + j), whole_.dtype());
        sub->max_ulp = std::max(sub->max_ulp, ulp);
      }
    }
  }

 private:
  const Tensor& whole_;
  const int64_t n_;
};

}  // namespace

std::map<std::string, std::string> KernelDetails(
    const std::map<std::string, std::string>& details) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : details) {
    if (!absl::EndsWith(key, "_ms")) out.emplace(key, value);
  }
  return out;
}

absl::StatusOr<BatchInvarianceOutcome> CheckBatchInvariance(LinearBackend& backend,
                                                            const PreparedRun& prepared,
                                                            const LinearProblem& problem,
                                                            const std::vector<int64_t>& batch_sizes,
                                                            const RunOptions& options) {
  RunOptions once = options;
  once.repeat = 1;
  BatchInvarianceOutcome out;
  out.rows = problem.m;
  TC_ASSIGN_OR_RETURN(RunResult whole, backend.Run(problem, prepared, once));
  // The sub-batches' layers, by their number of rows.
  std::map<int64_t, PreparedRun> parts;
  out.full_batch_details = KernelDetails(whole.details);
  const RowComparison compare(whole.output, problem.n);
  const bool row_scales = problem.input_scale != nullptr && problem.input_scale->numel() > 1;
  std::vector<bool> differing(static_cast<size_t>(problem.m), false);
  for (const int64_t size : batch_sizes) {
    SubBatchOutcome sub;
    sub.batch_size = size;
    for (int64_t first = 0; first < problem.m; first += size) {
      TC_RETURN_IF_ERROR(CheckStop(options.stop));
      const int64_t rows = std::min(size, problem.m - first);
      TC_ASSIGN_OR_RETURN(Tensor input,
                          RowsOf(*problem.input, first, rows, problem.k, {rows, problem.k}));
      std::optional<Tensor> scale;
      LinearProblem part = problem;
      part.input = &input;
      part.m = rows;
      if (row_scales) {
        // Row-wise [M] or block-wise [M, ceil(K/128)]: the part's rows.
        const int64_t per_row = problem.input_scale->numel() / problem.m;
        TC_ASSIGN_OR_RETURN(scale, RowsOf(*problem.input_scale, first, rows, per_row,
                                          per_row == 1 && problem.input_scale->rank() < 2
                                              ? std::vector<int64_t>{rows}
                                              : std::vector<int64_t>{rows, per_row}));
        part.input_scale = &*scale;
      }
      auto known = parts.find(rows);
      if (known == parts.end()) {
        known = parts.emplace(rows, backend.Prepare(part, prepared.config())).first;
      }
      TC_ASSIGN_OR_RETURN(RunResult run, backend.Run(part, known->second, once));
      ++sub.runs;
      if (first == 0) sub.details = KernelDetails(run.details);
      if (rows < size) {
        sub.tail_rows = rows;
        sub.tail_details = KernelDetails(run.details);
      }
      compare.Add(run.output, first, &sub, &differing);
    }
    out.max_ulp = std::max(out.max_ulp, sub.max_ulp);
    out.sub_batches.push_back(std::move(sub));
  }
  out.rows_differing = std::count(differing.begin(), differing.end(), true);
  out.invariant = out.rows_differing == 0;
  return out;
}

}  // namespace tensorcheck
