// The element types of the device kernels (internal to this folder), in a
// header of their own without CUDA, so that code shared by host and device
// (narrow_patterns.h, compare_thread.h) names them in a build without CUDA
// too.
//
//   ElemType t = ToElem(DType::kBFloat16);  // ElemType::kBF16 (compare_args.h)
//   LaunchConvert(src, ElemType::kF32, dst, t, count, stream);
#pragma once

namespace tensorcheck::cuda {

// Device element types (the same order as tensorcheck::DType).
enum class ElemType : int { kF64 = 0, kF32 = 1, kF16 = 2, kBF16 = 3 };

}  // namespace tensorcheck::cuda
