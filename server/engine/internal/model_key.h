// The parameters an error-model array depends on, on one request: arrays
// with equal keys are equal, so a run computes each once (shared by the
// host execution and the device one; internal to server/engine).
#pragma once

#include <algorithm>
#include <map>
#include <tuple>

#include "core/linear_config.h"
#include "server/stats/error_model.h"

namespace tensorcheck::internal {

struct ModelKey {
  enum Kind { kSigma, kBound, kPairSigma, kPairAccumulation };
  Kind kind = kSigma;
  double u_input = 0;  // effective: 0 when the inputs are exact (kSigma, kBound)
  double u_accumulate = 0;
  bool fp16_accumulate = false;
  bool unfused = false;
  // kPairAccumulation: ErrorModelInput::accumulation_scale; 1 otherwise.
  double accumulation_scale = 1;
  // ErrorModelInput::reduce_terms: split-K reduced in the output type.
  int reduce_terms = 0;
  bool operator<(const ModelKey& o) const {
    return std::tie(kind, u_input, u_accumulate, fp16_accumulate, unfused, accumulation_scale,
                    reduce_terms) < std::tie(o.kind, o.u_input, o.u_accumulate, o.fp16_accumulate,
                                             o.unfused, o.accumulation_scale, o.reduce_terms);
  }
};

// The key of precision `p`'s array of `kind`; `inputs_exact`: the request's
// input and weight are exact in p's input format (ValuesExactIn);
// `product_bits`: the significand bits of a product of an input and a
// weight value as p multiplies them (ModelKeys::ProductBits; read for
// kPairAccumulation only).
inline ModelKey MakeModelKey(ModelKey::Kind kind, Precision p, bool unfused, bool inputs_exact,
                             int product_bits = 106) {
  const PrecisionInfo info = GetPrecisionInfo(p);
  ModelKey key;
  key.kind = kind;
  key.u_accumulate = info.u_accumulate;
  key.fp16_accumulate = info.fp16_accumulate;
  key.unfused = unfused && kind != ModelKey::kPairAccumulation;
  switch (kind) {
    case ModelKey::kSigma:
      key.u_input = inputs_exact ? 0.0 : info.u_input;
      break;
    case ModelKey::kPairAccumulation:
      // Short products into an fp32 accumulator only: fp16acc rounds every
      // product, fp64 accumulates far below any output grid, and the fp8
      // precisions keep the model (a GPU's fp8 accumulator is narrower than
      // fp32; docs/numerics.md, "FP8").
      if (info.u_accumulate == 0x1p-24 && !info.fp16_accumulate && !IsFp8(p)) {
        key.accumulation_scale = ShortProductAccumulationScale(product_bits);
      }
      break;
    case ModelKey::kBound:
      // The hard bound's u_p: the precision's coarsest unit, or its
      // accumulation's when the inputs are exact (u_input 0 then).
      key.u_input = inputs_exact ? 0.0 : BoundUnitRoundoff(p);
      key.u_accumulate = inputs_exact ? info.u_accumulate : 0.0;
      key.fp16_accumulate = false;
      break;
    default:
      break;  // the input rounding cancels between two orders
  }
  return key;
}

// The split-K slices whose partials a configuration reduces in the output
// type (ErrorModelInput::reduce_terms); 0 for every other configuration.
inline int ReduceTermsOf(const Config& c) {
  return TakesSplitK(c.precision) && c.splitk >= 2 && c.reduce == SplitKReduce::kOutput ? c.splitk
                                                                                        : 0;
}

// MakeModelKey for one request: whether its input and weight are exact in
// a precision's input format is looked at once per precision (a pass over
// the values when the dtype does not settle it).
class ModelKeys {
 public:
  ModelKeys(const Tensor& input, const Tensor& weight) : input_(input), weight_(weight) {}

  // `reduce_terms`: ReduceTermsOf the configuration.
  ModelKey Of(ModelKey::Kind kind, Precision p, bool unfused, int reduce_terms = 0) {
    ModelKey key = OfPrecision(kind, p, unfused);
    key.reduce_terms = reduce_terms;
    return key;
  }

  ModelKey OfPrecision(ModelKey::Kind kind, Precision p, bool unfused) {
    // The fp8 precisions' bound keeps the input unit: a GPU's fp8
    // accumulator is narrower than fp32 (docs/numerics.md, "FP8").
    const bool reads_exact = kind == ModelKey::kSigma || (kind == ModelKey::kBound && !IsFp8(p));
    return MakeModelKey(kind, p, unfused, reads_exact && InputsExact(p),
                        kind == ModelKey::kPairAccumulation && !IsFp8(p) ? ProductBits(p) : 106);
  }

  // Significand bits of an input value times a weight value as `p`
  // multiplies them: each operand has p's input bits, or fewer where all
  // its values are bf16 (8) or TF32 (11) values, whatever their storage.
  int ProductBits(Precision p) {
    const int bits = InputSignificandBits(p);
    return std::min(bits, OperandBits(input_, &input_bits_)) +
           std::min(bits, OperandBits(weight_, &weight_bits_));
  }

 private:
  // The bits of `t`'s values (above), looked at once.
  static int OperandBits(const Tensor& t, int* cached) {
    if (*cached == 0) {
      *cached = ValuesExactIn(Precision::kBf16, t)   ? 8
                : ValuesExactIn(Precision::kTf32, t) ? 11
                                                     : 53;
    }
    return *cached;
  }

  bool InputsExact(Precision p) {
    auto it = exact_.find(p);
    if (it != exact_.end()) return it->second;
    const bool exact = ValuesExactIn(p, input_) && ValuesExactIn(p, weight_);
    exact_[p] = exact;
    return exact;
  }

  const Tensor& input_;
  const Tensor& weight_;
  std::map<Precision, bool> exact_;
  int input_bits_ = 0;  // 0: not looked at yet
  int weight_bits_ = 0;
};

}  // namespace tensorcheck::internal
