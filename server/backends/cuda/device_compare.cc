#include "server/backends/cuda/internal/device_compare.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_status.h"

namespace tensorcheck::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t Aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Copies `count` elements of T from the device.
template <typename T>
absl::StatusOr<std::vector<T>> CopyBack(const char* device, int64_t count, cudaStream_t stream) {
  std::vector<T> out(static_cast<size_t>(count));
  if (count == 0) return out;
  TC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), device, sizeof(T) * out.size(), cudaMemcpyDeviceToHost, stream));
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace

DeviceCompare::DeviceCompare(int64_t total, const CompareOptions& options)
    : total_(total), options_(options), cols_(options.cols == 0 ? total : options.cols) {
  count_groups_ = options.top_groups > 0 && total > 0;

  int64_t offset = 0;
  auto add = [&](int64_t bytes) {
    const int64_t at = offset;
    offset += Aligned(bytes);
    return at;
  };
  layout_.scratch = add(static_cast<int64_t>(CompareScratchBytes(total)));
  layout_.result = add(sizeof(CompareResult));
  layout_.worst = add(sizeof(WorstEntry) * static_cast<int64_t>(options.top_k));
  layout_.nonfinite = add(sizeof(long long) * int64_t{kNonFiniteCapacity});
  if (count_groups_ && cols_ > 0) {
    layout_.cols = add(sizeof(unsigned long long) * cols_);
    layout_.rows = add(sizeof(unsigned long long) * (total / cols_));
  }
  layout_.total = offset;
}

absl::Status DeviceCompare::Validate() const { return ValidateCompare(total_, total_, options_); }

int64_t DeviceCompare::bytes() const { return layout_.total; }

absl::Status DeviceCompare::Enqueue(const DeviceArray& actual, const DeviceArray& expected,
                                    char* memory, cudaStream_t stream) {
  TC_RETURN_IF_ERROR(ValidateCompare(actual.numel, expected.numel, options_));
  if (actual.numel != total_) {
    return absl::InternalError(
        absl::StrCat("device compare: prepared for ", total_, " elements, given ", actual.numel));
  }
  memory_ = memory;
  stream_ = stream;
  if (total_ == 0) return absl::OkStatus();

  CompareArgs args = MakeCompareArgs(actual, expected, options_);
  args.nonfinite_indices = reinterpret_cast<long long*>(memory + layout_.nonfinite);
  args.nonfinite_capacity = kNonFiniteCapacity;
  // The error model's arrays, where the session keeps them; the bound is
  // read under the bound preset only.
  args.sigma = options_.predicted_sigma;
  if (options_.tolerance.preset == TolerancePreset::kBound) args.bound = options_.error_bound;
  auto* result = reinterpret_cast<CompareResult*>(memory + layout_.result);
  auto* cols =
      count_groups_ ? reinterpret_cast<unsigned long long*>(memory + layout_.cols) : nullptr;
  auto* rows =
      count_groups_ ? reinterpret_cast<unsigned long long*>(memory + layout_.rows) : nullptr;
  TC_CUDA_RETURN_IF_ERROR(
      LaunchCompareTotals(args, memory + layout_.scratch, result, cols, rows, stream));
  if (options_.top_k > 0) {
    TC_CUDA_RETURN_IF_ERROR(LaunchSelectWorst(args, options_.top_k, memory + layout_.scratch,
                                              reinterpret_cast<WorstEntry*>(memory + layout_.worst),
                                              result, stream));
  }
  TC_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&result_, result, sizeof(result_), cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

absl::StatusOr<DiffStats> DeviceCompare::Finish() {
  if (total_ == 0) return Compare(Tensor(), Tensor(), options_);
  const DiffTotals t = ToDiffTotals(result_);

  std::vector<ElementDiff> worst;
  if (options_.top_k > 0) {
    const int64_t count = std::min<int64_t>(result_.worst_count, options_.top_k);
    TC_ASSIGN_OR_RETURN(std::vector<WorstEntry> entries,
                        CopyBack<WorstEntry>(memory_ + layout_.worst, count, stream_));
    worst.reserve(entries.size());
    for (const WorstEntry& w : entries) {
      ElementDiff d = DescribeElement(w.index, w.actual, w.expected, options_.compared_dtype);
      d.actual_bits = w.actual_bits;  // as stored, when stored in the compared type
      d.expected_bits = w.expected_bits;
      worst.push_back(d);
    }
  }
  DiffStats s = FinishDiffStats(total_, t, std::move(worst), options_);
  if (s.mismatched > 0 && count_groups_) {
    auto to_counts = [](const std::vector<unsigned long long>& v) {
      return std::vector<int64_t>(v.begin(), v.end());
    };
    TC_ASSIGN_OR_RETURN(auto cols,
                        CopyBack<unsigned long long>(memory_ + layout_.cols, cols_, stream_));
    TC_ASSIGN_OR_RETURN(
        auto rows, CopyBack<unsigned long long>(memory_ + layout_.rows, total_ / cols_, stream_));
    s.top_columns = TopGroupCounts(to_counts(cols), options_.top_groups, s.mismatched);
    s.top_rows = TopGroupCounts(to_counts(rows), options_.top_groups, s.mismatched);
  }
  return s;
}

}  // namespace tensorcheck::cuda
