// LayerShape: the one description of a linear layer's shape,
// y = act(x W^T + b) for x viewed as [m, k] (any leading shape) and W
// stored [n, k] (OUT_IN) or [k, n] (IN_OUT), y [m, n] in `output_dtype`.
//
//   LayerShape shape{/*m=*/4, /*n=*/1024, /*k=*/4096, WeightLayout::kInOut};
//   shape.output_dtype = DType::kBFloat16;
//   LinearProblem problem{shape, &x, &w};   // a derived struct: shape first
//
// Every struct that describes a layer over its operands (LinearProblem's
// tensors, a device session's arrays, the magnitude sums' operands, the
// cuBLASLt rules' layer) derives from it and adds only its operands; none
// restates these fields. It holds no operand and no operand dtype: the
// input's, weight's and bias's dtypes are those of the tensors (or arrays)
// beside it, and whether there is a bias is whether one is given.
//
// A plain value: no invariants are checked here. The plan
// (Engine::MakePlan) fills it from the request's tensors after checking
// them, so a LayerShape that reaches a backend has m, n, k > 0 and the
// weight's shape agrees with `layout`.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/linear_config.h"

namespace tensorcheck {

struct LayerShape {
  int64_t m = 0;  // rows of x: the product of its leading dimensions
  int64_t n = 0;  // output features
  int64_t k = 0;  // input features: the reduction's length
  WeightLayout layout = WeightLayout::kOutIn;
  Activation activation = Activation::kNone;
  DType output_dtype = DType::kFloat32;

  // This shape (a derived struct's, sliced).
  const LayerShape& shape() const { return *this; }
  LayerShape& shape() { return *this; }

  friend bool operator==(const LayerShape& a, const LayerShape& b) {
    return a.layout == b.layout && a.activation == b.activation &&
           a.output_dtype == b.output_dtype && a.m == b.m && a.n == b.n && a.k == b.k;
  }
  friend bool operator!=(const LayerShape& a, const LayerShape& b) { return !(a == b); }
};

}  // namespace tensorcheck
