// The parameters an error-model array depends on, on one request: arrays
// with equal keys are equal, so a run computes each once (shared by the
// host execution and the device one; internal to server/engine).
#pragma once

#include <map>
#include <tuple>

#include "server/core/linear_config.h"
#include "server/stats/error_model.h"

namespace tensorcheck::internal {

struct ModelKey {
  enum Kind { kSigma, kBound, kPairSigma, kPairAccumulation };
  Kind kind = kSigma;
  double u_input = 0;  // effective: 0 when the inputs are exact
  double u_accumulate = 0;
  bool fp16_accumulate = false;
  bool unfused = false;
  bool operator<(const ModelKey& o) const {
    return std::tie(kind, u_input, u_accumulate, fp16_accumulate, unfused) <
           std::tie(o.kind, o.u_input, o.u_accumulate, o.fp16_accumulate, o.unfused);
  }
};

// The key of precision `p`'s array of `kind`; `inputs_exact`: the request's
// input and weight are exact in p's input format (ValuesExactIn).
inline ModelKey MakeModelKey(ModelKey::Kind kind, Precision p, bool unfused, bool inputs_exact) {
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
    case ModelKey::kBound:
      // The hard bound's u_p does not depend on the data.
      key.u_input = BoundUnitRoundoff(p);
      key.u_accumulate = 0;
      key.fp16_accumulate = false;
      break;
    default:
      break;  // the input rounding cancels between two orders
  }
  return key;
}

// MakeModelKey for one request: whether its input and weight are exact in
// a precision's input format is looked at once per precision (a pass over
// the values when the dtype does not settle it).
class ModelKeys {
 public:
  ModelKeys(const Tensor& input, const Tensor& weight) : input_(input), weight_(weight) {}

  ModelKey Of(ModelKey::Kind kind, Precision p, bool unfused) {
    return MakeModelKey(kind, p, unfused, kind == ModelKey::kSigma && InputsExact(p));
  }

 private:
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
};

}  // namespace tensorcheck::internal
