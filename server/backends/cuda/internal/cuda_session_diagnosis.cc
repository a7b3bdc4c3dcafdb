// CudaSession's diagnosis passes (device_session.h; the kernels in
// diagnosis_kernels.h): each reduces per-block partials merged in block
// order and synchronises the lane's stream for its sums.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "server/backends/cuda/cuda_backends.h"
#include "server/backends/cuda/cuda_status.h"
#include "server/backends/cuda/internal/cuda_kernels.h"
#include "server/backends/cuda/internal/cuda_session.h"
#include "server/backends/cuda/internal/device_compare.h"
#include "server/backends/cuda/internal/diagnosis_kernels.h"
#include "server/backends/cuda/internal/error_model_kernels.h"
#include "server/backends/cuda/internal/gemm_call.h"
#include "server/backends/cuda/internal/gemm_plan.h"
#include "server/stats/error_model.h"

namespace tensorcheck::cuda {

namespace {

bool KnownDType(DType d) {
  return std::find(std::begin(kWideDTypes), std::end(kWideDTypes), d) != std::end(kWideDTypes);
}

absl::Status CheckCompared(DType compared, absl::string_view what) {
  if (KnownDType(compared)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": compared dtype ", static_cast<int>(compared), " is not one of ours"));
}

// An array of values for a pass: a session array, not freed, not a mask,
// of `count` elements (any count where `count` < 0) and of float32 where
// `float32` (the error-model arrays and the flip grid, which the kernels
// read as float).
absl::StatusOr<const CudaSession::Array*> PassArray(const CudaSession& session, ArrayRef ref,
                                                    absl::string_view what, int64_t count,
                                                    bool float32) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* a, session.Get(ref, what));
  if (a->data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the device array was freed"));
  }
  if (a->mask_count >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a mask, not an array of values"));
  }
  if (count >= 0 && a->count != count) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", a->count, " elements where ", count, " are expected"));
  }
  if (float32 && a->dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", DTypeName(a->dtype), " where float32 is expected"));
  }
  return a;
}

// A mask of the session (NewMask), not freed, of `count` elements.
absl::StatusOr<const CudaSession::Array*> PassMask(const CudaSession& session, ArrayRef ref,
                                                   absl::string_view what, int64_t count) {
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* m, session.Get(ref, what));
  if (m->data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": the device array was freed"));
  }
  if (m->mask_count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a mask (NewMask)"));
  }
  if (count >= 0 && m->mask_count != count) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": a mask of ", m->mask_count,
                                                   " elements where ", count, " are expected"));
  }
  return m;
}

// A nullable mask's bytes: null (every element) where `ref` is invalid.
absl::StatusOr<const uint8_t*> OptionalMask(const CudaSession& session, ArrayRef ref,
                                            absl::string_view what, int64_t count) {
  if (!ref.valid()) return nullptr;
  TC_ASSIGN_OR_RETURN(const CudaSession::Array* m, PassMask(session, ref, what, count));
  return static_cast<const uint8_t*>(m->data);
}

DeviceValues ValuesOf(const CudaSession::Array& a) { return {a.data, ToElem(a.dtype)}; }

// A reducing pass over `count` elements: `launch(partials)` enqueues it
// with DiagnosisBlocks(count) partial sums in a session array; they come
// back to the host and are merged there in block order with `merge`, so
// the result is the same on every run.
template <typename Sums, typename Launch, typename Merge>
absl::StatusOr<Sums> ReduceOnDevice(CudaSession& session, int64_t count, const char* name,
                                    const Launch& launch, const Merge& merge) {
  Sums total{};
  const int blocks = DiagnosisBlocks(count);
  if (blocks == 0) return total;
  const int64_t bytes = static_cast<int64_t>(sizeof(Sums)) * blocks;
  TC_ASSIGN_OR_RETURN(ArrayRef ref, session.Allocate(DType::kFloat64, (bytes + 7) / 8));
  Sums* partials = static_cast<Sums*>(session.data(ref));
  std::vector<Sums> host(static_cast<size_t>(blocks));
  absl::Status status = session.Checked(ToStatus(launch(partials), name));
  if (status.ok()) {
    status =
        session.Checked(ToStatus(cudaMemcpyAsync(host.data(), partials, static_cast<size_t>(bytes),
                                                 cudaMemcpyDeviceToHost, session.stream()),
                                 "cudaMemcpyAsync"));
  }
  if (status.ok()) {
    status =
        session.Checked(ToStatus(cudaStreamSynchronize(session.stream()), "cudaStreamSynchronize"));
  }
  session.Free(ref);
  TC_RETURN_IF_ERROR(status);
  for (const Sums& part : host) merge(total, part);
  return total;
}

void AddCount(int64_t& into, const int64_t& part) { into += part; }

}  // namespace

absl::StatusOr<bool> CudaSession::SameBits(ArrayRef a, ArrayRef b) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* x, PassArray(*this, a, "same bits: a", -1, false));
  TC_ASSIGN_OR_RETURN(const Array* y, PassArray(*this, b, "same bits: b", -1, false));
  bool same = false;
  if (x->dtype == y->dtype && x->count == y->count) {
    if (x->data == y->data) {
      same = true;
    } else {
      const ElemType type = ToElem(x->dtype);
      TC_ASSIGN_OR_RETURN(const int64_t differing, ReduceOnDevice<int64_t>(
                                                       *this, x->count, "LaunchCountBitsDiffer",
                                                       [&](int64_t* partials) {
                                                         return LaunchCountBitsDiffer(
                                                             x->data, y->data, type, x->count,
                                                             partials, stream_);
                                                       },
                                                       AddCount));
      same = differing == 0;
    }
  }
  ++counters_.diagnosis_passes;
  return same;
}

absl::StatusOr<ArrayRef> CudaSession::NewMask(int64_t count) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  if (count < 0) {
    return absl::InvalidArgumentError(absl::StrCat("new mask: ", count, " elements"));
  }
  // Four mask bytes to a float32 word.
  TC_ASSIGN_OR_RETURN(ArrayRef mask, Allocate(DType::kFloat32, count / 4 + (count % 4 != 0)));
  Array& m = arrays_[static_cast<size_t>(mask.id)];
  m.mask_count = count;
  TC_RETURN_IF_ERROR(Checked(ToStatus(
      cudaMemsetAsync(m.data, 0, static_cast<size_t>(count), stream_), "cudaMemsetAsync")));
  return mask;
}

absl::StatusOr<int64_t> CudaSession::MarkConsistent(ArrayRef mask, ArrayRef observed,
                                                    ArrayRef candidate, ArrayRef pair_sigma,
                                                    DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o,
                      PassArray(*this, observed, "mark consistent: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* v,
                      PassArray(*this, candidate, "mark consistent: candidate", count, false));
  TC_ASSIGN_OR_RETURN(const Array* sigma,
                      PassArray(*this, pair_sigma, "mark consistent: pair_sigma", count, true));
  TC_ASSIGN_OR_RETURN(const Array* m, PassMask(*this, mask, "mark consistent: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(compared, "mark consistent"));
  DeviceMarkArgs args;
  args.observed = ValuesOf(*o);
  args.candidate = ValuesOf(*v);
  args.pair_sigma = static_cast<const float*>(sigma->data);
  args.compared = ToElem(compared);
  args.mask = static_cast<uint8_t*>(m->data);
  args.count = count;
  TC_ASSIGN_OR_RETURN(const int64_t set, ReduceOnDevice<int64_t>(
                                             *this, count, "LaunchMarkConsistent",
                                             [&](int64_t* partials) {
                                               return LaunchMarkConsistent(args, partials, stream_);
                                             },
                                             AddCount));
  ++counters_.diagnosis_passes;
  return set;
}

absl::StatusOr<rules::ScoreSums> CudaSession::Score(const SessionScoreSpec& spec) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o,
                      PassArray(*this, spec.observed, "score: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* v,
                      PassArray(*this, spec.candidate, "score: candidate", count, false));
  TC_ASSIGN_OR_RETURN(const Array* pair,
                      PassArray(*this, spec.pair_sigma, "score: pair_sigma", count, true));
  TC_ASSIGN_OR_RETURN(const Array* acc, PassArray(*this, spec.pair_accumulation_sigma,
                                                  "score: pair_accumulation_sigma", count, true));
  const float* grid = nullptr;
  if (spec.flip_grid.valid()) {
    TC_ASSIGN_OR_RETURN(const Array* g,
                        PassArray(*this, spec.flip_grid, "score: flip_grid", count, true));
    grid = static_cast<const float*>(g->data);
  }
  TC_ASSIGN_OR_RETURN(const uint8_t* mask, OptionalMask(*this, spec.mask, "score: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(spec.compared, "score"));
  DeviceScoreArgs args;
  args.observed = ValuesOf(*o);
  args.candidate = ValuesOf(*v);
  args.pair_sigma = static_cast<const float*>(pair->data);
  args.pair_accumulation_sigma = static_cast<const float*>(acc->data);
  args.flip_grid = grid;
  args.mask = mask;
  args.compared = ToElem(spec.compared);
  args.count = count;
  TC_ASSIGN_OR_RETURN(rules::ScoreSums sums, ReduceOnDevice<rules::ScoreSums>(
                                                 *this, count, "LaunchScore",
                                                 [&](rules::ScoreSums* partials) {
                                                   return LaunchScore(args, partials, stream_);
                                                 },
                                                 rules::MergeScore));
  ++counters_.diagnosis_passes;
  return sums;
}

absl::StatusOr<rules::PairedSums> CudaSession::Paired(ArrayRef observed, ArrayRef best,
                                                      ArrayRef runner, ArrayRef sigma,
                                                      ArrayRef mask, DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o, PassArray(*this, observed, "paired: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* b, PassArray(*this, best, "paired: best", count, false));
  TC_ASSIGN_OR_RETURN(const Array* r, PassArray(*this, runner, "paired: runner", count, false));
  TC_ASSIGN_OR_RETURN(const Array* s, PassArray(*this, sigma, "paired: sigma", count, true));
  TC_ASSIGN_OR_RETURN(const uint8_t* m, OptionalMask(*this, mask, "paired: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(compared, "paired"));
  DevicePairedArgs args;
  args.observed = ValuesOf(*o);
  args.best = ValuesOf(*b);
  args.runner = ValuesOf(*r);
  args.sigma = static_cast<const float*>(s->data);
  args.mask = m;
  args.compared = ToElem(compared);
  args.count = count;
  TC_ASSIGN_OR_RETURN(rules::PairedSums sums, ReduceOnDevice<rules::PairedSums>(
                                                  *this, count, "LaunchPaired",
                                                  [&](rules::PairedSums* partials) {
                                                    return LaunchPaired(args, partials, stream_);
                                                  },
                                                  rules::MergePaired));
  ++counters_.diagnosis_passes;
  return sums;
}

absl::StatusOr<DifferingCounts> CudaSession::Differing(ArrayRef a, ArrayRef b, ArrayRef mask,
                                                       int64_t cols, DType compared) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* x, PassArray(*this, a, "differing: a", -1, false));
  const int64_t count = x->count;
  TC_ASSIGN_OR_RETURN(const Array* y, PassArray(*this, b, "differing: b", count, false));
  TC_ASSIGN_OR_RETURN(const uint8_t* m, OptionalMask(*this, mask, "differing: mask", count));
  TC_RETURN_IF_ERROR(CheckCompared(compared, "differing"));
  DifferingCounts d;
  if (cols <= 0) {
    ++counters_.diagnosis_passes;
    return d;
  }
  const int64_t rows = count / cols;
  if (cols > std::numeric_limits<int64_t>::max() - 1 - rows) {
    return absl::ResourceExhaustedError("differing: counter array size overflows");
  }
  // The counters in one array: columns, then rows, then the total.
  const int64_t counters = cols + rows + 1;
  TC_ASSIGN_OR_RETURN(ArrayRef ref, Allocate(DType::kFloat64, counters));
  auto* device_counts = static_cast<unsigned long long*>(data(ref));
  DeviceDifferingArgs args;
  args.a = ValuesOf(*x);
  args.b = ValuesOf(*y);
  args.mask = m;
  args.compared = ToElem(compared);
  args.count = count;
  args.cols = cols;
  args.columns = device_counts;
  args.rows = rows > 0 ? device_counts + cols : nullptr;
  args.total = device_counts + cols + rows;
  std::vector<unsigned long long> host(static_cast<size_t>(counters));
  absl::Status status = Checked(ToStatus(LaunchDiffering(args, stream_), "LaunchDiffering"));
  if (status.ok()) {
    status =
        Checked(ToStatus(cudaMemcpyAsync(host.data(), device_counts,
                                         static_cast<size_t>(counters) * sizeof(unsigned long long),
                                         cudaMemcpyDeviceToHost, stream_),
                         "cudaMemcpyAsync"));
  }
  if (status.ok()) {
    status = Checked(ToStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
  }
  Free(ref);
  TC_RETURN_IF_ERROR(status);
  d.columns.assign(host.begin(), host.begin() + cols);
  d.rows.assign(host.begin() + cols, host.begin() + cols + rows);
  d.total = static_cast<int64_t>(host[static_cast<size_t>(cols + rows)]);
  ++counters_.diagnosis_passes;
  return d;
}

absl::StatusOr<rules::ErrorSums> CudaSession::ErrorVsReference(ArrayRef observed,
                                                               ArrayRef reference,
                                                               ArrayRef sigma_vs_reference,
                                                               ArrayRef mask) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* o,
                      PassArray(*this, observed, "error vs reference: observed", -1, false));
  const int64_t count = o->count;
  TC_ASSIGN_OR_RETURN(const Array* r,
                      PassArray(*this, reference, "error vs reference: reference", count, false));
  TC_ASSIGN_OR_RETURN(
      const Array* s,
      PassArray(*this, sigma_vs_reference, "error vs reference: sigma_vs_reference", count, true));
  TC_ASSIGN_OR_RETURN(const uint8_t* m,
                      OptionalMask(*this, mask, "error vs reference: mask", count));
  DeviceErrorArgs args;
  args.observed = ValuesOf(*o);
  args.reference = ValuesOf(*r);
  args.sigma_vs_reference = static_cast<const float*>(s->data);
  args.mask = m;
  args.count = count;
  TC_ASSIGN_OR_RETURN(rules::ErrorSums sums, ReduceOnDevice<rules::ErrorSums>(
                                                 *this, count, "LaunchErrorVsReference",
                                                 [&](rules::ErrorSums* partials) {
                                                   return LaunchErrorVsReference(args, partials,
                                                                                 stream_);
                                                 },
                                                 rules::MergeError));
  ++counters_.diagnosis_passes;
  return sums;
}

absl::StatusOr<std::vector<uint8_t>> CudaSession::DownloadMask(ArrayRef mask) {
  TC_RETURN_IF_ERROR(CheckStop(stop_));
  TC_ASSIGN_OR_RETURN(const Array* m, PassMask(*this, mask, "download mask", -1));
  std::vector<uint8_t> bytes(static_cast<size_t>(m->mask_count));
  TC_RETURN_IF_ERROR(Checked(StagedDownload(m->data, bytes.data(), m->mask_count)));
  ++counters_.downloads;
  counters_.download_bytes += m->mask_count;
  return bytes;
}

}  // namespace tensorcheck::cuda
