// A diagnosis's passes over whole tensors on the host: the per-element
// rules of diagnosis_rules.h run element by element, in element order.
// The engine's host diagnosis runs them over the candidates' outputs
// (server/engine/internal/diagnosis_evidence.h); a device runs the same
// rules in its kernels (DeviceSession's diagnosis calls).
//
//   std::vector<uint8_t> explained(count, 0);
//   MarkConsistentPass(observed, candidate, pair_sigma, DType::kBFloat16, &explained);
//   rules::ScoreSums s = ScorePass({&observed, &candidate, pair_sigma, acc_sigma, grid,
//                                   explained.data(), DType::kBFloat16});
//
// Values are read widened to double (Tensor::GetDouble) and ULP distances
// counted in the compared dtype. A `mask` selects the elements a pass
// reads (non-zero: read); null reads every element. Every array holds
// observed.numel() elements. Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "server/core/tensor.h"
#include "server/stats/diagnosis_rules.h"

namespace tensorcheck {

// UlpDistance in `dtype`, without its conversions where the values are
// equal (most elements of the closest candidates): +0 and -0 are 0 apart.
uint64_t DiagnosisUlp(double a, double b, DType dtype);

// Whether two tensors hold the same bytes.
bool SameBitsPass(const Tensor& a, const Tensor& b);

// Sets mask[i] where element i of `observed` is consistent with
// `candidate` (rules::ElementConsistent with `pair_sigma`); returns how
// many elements the mask holds set afterwards.
int64_t MarkConsistentPass(const Tensor& observed, const Tensor& candidate, const float* pair_sigma,
                           DType compared, std::vector<uint8_t>* mask);

struct ScorePassInput {
  const Tensor* observed = nullptr;
  const Tensor* candidate = nullptr;
  const float* pair_sigma = nullptr;
  const float* pair_accumulation_sigma = nullptr;
  // The flip grid; null: the output spacing at the candidate's value.
  const float* flip_grid = nullptr;
  const uint8_t* mask = nullptr;
  DType compared = DType::kFloat32;
};
rules::ScoreSums ScorePass(const ScorePassInput& in);

// The paired sign test's counts of `runner` against `best` (sigma: best's
// pair sigma).
rules::PairedSums PairedPass(const Tensor& observed, const Tensor& best, const Tensor& runner,
                             const float* sigma, const uint8_t* mask, DType compared);

// Elements where `a` and `b` differ in bits (ULP distance above 0), by
// column and by row of a [count / cols, cols] matrix.
struct DifferingCounts {
  std::vector<int64_t> columns;  // cols entries
  std::vector<int64_t> rows;     // count / cols entries
  int64_t total = 0;
};
DifferingCounts DifferingPass(const Tensor& a, const Tensor& b, const uint8_t* mask, int64_t cols,
                              DType compared);

// The observed output against the reference with the sigma against the
// exact result.
rules::ErrorSums ErrorPass(const Tensor& observed, const Tensor& reference,
                           const float* sigma_vs_reference, const uint8_t* mask);

}  // namespace tensorcheck
