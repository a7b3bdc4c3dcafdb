// The element types of the device kernels (internal to this folder): stats'
// rules::ElemType (server/stats/element_rules.h), the key of the layouts
// and ULP rules that host and device share, under the name the kernels
// have always used. No CUDA here, so that code shared by host and device
// (narrow_patterns.h, compare_thread.h) names it in a build without CUDA
// too.
//
//   ElemType t = ToElem(DType::kBFloat16);  // ElemType::kBF16 (compare_args.h)
//   LaunchConvert(src, ElemType::kF32, dst, t, count, stream);
#pragma once

#include "server/stats/element_rules.h"

namespace tensorcheck::cuda {

// Device element types (the same order as tensorcheck::DType).
using ElemType = ::tensorcheck::rules::ElemType;

}  // namespace tensorcheck::cuda
