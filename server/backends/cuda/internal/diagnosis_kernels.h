// A diagnosis's per-element passes on the device (internal to this
// folder): stats' diagnosis_passes.h over device arrays. Each thread runs
// the very per-element rules the host's passes run
// (server/stats/diagnosis_rules.h), on values widened exactly to double and
// ULP distances counted in the compared type as the device comparison
// counts them (internal/compare_thread.h's element access, element_rules.h's
// DistanceFromBits), which equal the host's DiagnosisUlp.
//
//   const int blocks = DiagnosisBlocks(count);  // partials to read back
//   DeviceScoreArgs a;
//   a.observed = {d_observed, ElemType::kBF16};
//   a.candidate = {d_candidate, ElemType::kF32};
//   a.pair_sigma = d_pair_sigma;  a.pair_accumulation_sigma = d_acc_sigma;
//   a.flip_grid = nullptr;  a.mask = d_mask;  a.compared = ElemType::kBF16;  a.count = count;
//   TC_CUDA_RETURN_IF_ERROR(LaunchScore(a, d_partials, stream));  // d_partials: blocks sums
//   // copy the `blocks` partials back, synchronise, then on the host:
//   rules::ScoreSums s;
//   for (int b = 0; b < blocks; ++b) rules::MergeScore(s, partials[b]);
//
// Sums are deterministic: the grid depends only on `count`
// (DiagnosisBlocks), each thread adds its elements in index order (a
// grid-stride loop) with the Add rule, each block merges its threads' sums
// in shared memory in a fixed tree order with the Merge rule and writes
// one partial; the caller merges the partials in block order with the same
// Merge rule. No floating-point atomics. The integer sums equal the
// host's; the floating ones (expected_disagreements, err_sq, sigma_sq) are
// the same terms added in this order, equal to the host's element-order
// sums up to rounding. The differing counts are integer atomics, exact.
//
// Each launcher enqueues on `stream` and returns the launch status
// (cudaGetLastError): cudaErrorInvalidValue for arguments it can see are
// wrong (a null array that `count` > 0 needs, an element type out of
// range); execution errors surface at the next synchronisation. All
// pointers are device pointers. count <= 0 launches nothing (and writes no
// partials: DiagnosisBlocks is then 0). A mask is one byte per element,
// non-zero where the element is read; a null mask reads every element.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "server/backends/cuda/internal/elem_type.h"
#include "server/stats/diagnosis_rules.h"

namespace tensorcheck::cuda {

// The block partials a reducing pass over `count` elements writes: one per
// block, min(ceil(count / 256), 1024); 0 when count <= 0.
int DiagnosisBlocks(int64_t count);

// `count` elements of `type` (the array's dtype), read widened exactly to
// double; their bits in the compared type are the stored bits when `type`
// is the compared type, else the value rounded to nearest even in it.
struct DeviceValues {
  const void* data = nullptr;
  ElemType type = ElemType::kF32;
};

// SameBitsPass for two arrays of the same element type and count: the
// number of elements whose stored bits differ, as DiagnosisBlocks(count)
// partial counts (sum them).
cudaError_t LaunchCountBitsDiffer(const void* a, const void* b, ElemType type, int64_t count,
                                  int64_t* partials, cudaStream_t stream);

// MarkConsistentPass: mask[i] = 1 where it is 0 and rules::ElementConsistent
// holds for (observed[i], candidate[i]) with pair_sigma[i]; `partials`
// receives the number of elements the mask holds set afterwards, as
// DiagnosisBlocks(count) partial counts (sum them).
struct DeviceMarkArgs {
  DeviceValues observed, candidate;
  const float* pair_sigma = nullptr;
  ElemType compared = ElemType::kF32;
  uint8_t* mask = nullptr;  // required; read and written
  int64_t count = 0;
};
cudaError_t LaunchMarkConsistent(const DeviceMarkArgs& args, int64_t* partials,
                                 cudaStream_t stream);

// ScorePass: rules::AddToScore over the masked-in elements, the flip grid
// where given, else rules::OutputSpacing at the candidate's value in the
// compared type, rounded to float.
struct DeviceScoreArgs {
  DeviceValues observed, candidate;
  const float* pair_sigma = nullptr;
  const float* pair_accumulation_sigma = nullptr;
  const float* flip_grid = nullptr;  // nullable
  const uint8_t* mask = nullptr;     // nullable: every element
  ElemType compared = ElemType::kF32;
  int64_t count = 0;
};
cudaError_t LaunchScore(const DeviceScoreArgs& args, rules::ScoreSums* partials,
                        cudaStream_t stream);

// PairedPass: where rules::PairedElementCounts(best[i], runner[i],
// sigma[i]), rules::AddToPaired with the observed output's ULP distances
// from best and from the runner-up.
struct DevicePairedArgs {
  DeviceValues observed, best, runner;
  const float* sigma = nullptr;   // best's pair sigma
  const uint8_t* mask = nullptr;  // nullable: every element
  ElemType compared = ElemType::kF32;
  int64_t count = 0;
};
cudaError_t LaunchPaired(const DevicePairedArgs& args, rules::PairedSums* partials,
                         cudaStream_t stream);

// DifferingPass: the masked-in elements whose ULP distance in the compared
// type is above 0, counted per column (i % cols), per row (i / cols) and
// in total. The three counters are zeroed on `stream` first (so count <= 0
// still reports zeros), then added to with integer atomics. An element in
// a last, partial row (count not a multiple of cols) counts in its column
// and the total only. cols >= 1.
struct DeviceDifferingArgs {
  DeviceValues a, b;
  const uint8_t* mask = nullptr;  // nullable: every element
  ElemType compared = ElemType::kF32;
  int64_t count = 0;
  int64_t cols = 1;
  unsigned long long* columns = nullptr;  // out: cols counters
  unsigned long long* rows = nullptr;     // out: count / cols counters (null when 0 of them)
  unsigned long long* total = nullptr;    // out: one counter
};
cudaError_t LaunchDiffering(const DeviceDifferingArgs& args, cudaStream_t stream);

// ErrorPass: rules::AddToError(observed[i], reference[i], sigma[i]) over
// the masked-in elements.
struct DeviceErrorArgs {
  DeviceValues observed, reference;
  const float* sigma_vs_reference = nullptr;
  const uint8_t* mask = nullptr;  // nullable: every element
  int64_t count = 0;
};
cudaError_t LaunchErrorVsReference(const DeviceErrorArgs& args, rules::ErrorSums* partials,
                                   cudaStream_t stream);

}  // namespace tensorcheck::cuda
