// How a thread of the device comparison's passes walks its elements, and
// which kernel instance runs (internal to this folder): ForEachVector takes
// 16-byte vectors when both arrays are stored in the compared type (each
// offered first to the lean path), element by element otherwise; KernelType
// and Dispatch pick the instance for the arrays at hand. Host and device
// alike: the host model is one thread (first 0, stride 1).
//
//   template <int kType>
//   struct OneThread {  // Dispatch calls Run of the instance KernelType picked
//     static void Run(const CompareArgs& args, ThreadTotals& t, ...) {
//       ForEachVector<kType, kLean<kType>>(
//           args, /*first=*/0, /*stride=*/1,
//           [&](int64_t first, const Vec16& ra, const Vec16& re) { return false; },
//           [&](int64_t i, const Element& x) { Accumulate(args, layout, i, x, t, ...); });
//     }
//   };
//   Dispatch<OneThread>(KernelType(args), args, t, ...);
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "server/backends/cuda/internal/compare_thread.h"
#include "server/backends/cuda/internal/device_intrinsics.h"
#include "server/backends/cuda/internal/elem_type.h"
#include "server/backends/cuda/internal/kernel_args.h"

namespace tensorcheck::cuda::cmp {

// Kernel instances: an ElemType value when both arrays are stored in the
// compared type (16-byte vectors), kAnyTypes otherwise (element by element).
inline constexpr int kAnyTypes = -1;

// Calls f(i, element) for each element a thread owns (first, first +
// stride, ...; the host model: 0 and 1), in increasing index order: 16-byte
// vectors when both arrays are stored in the compared type (kType), the
// next vectors loaded before the current ones are used.
// Each vector goes first to on_vector(its first index, actual, expected);
// when that returns false, f takes its elements.
// kRareFallback: on_vector takes nearly every vector, so f's loop is kept
// rolled (registers for the common path, not for eight inlined copies of f).
// (clang-format would indent a declaration that follows a macro.)
// clang-format off
TC_EXEC_CHECK_DISABLE  // on the device, on_vector and f are device lambdas
template <int kType, bool kRareFallback, typename V, typename F>
TC_HOST_DEVICE void ForEachVector(const CompareArgs& args, int64_t first, int64_t stride,
                                  V&& on_vector, F&& f) {
  // clang-format on
  int64_t vectorised = 0;
  if constexpr (kType != kAnyTypes) {
    constexpr ElemType type = static_cast<ElemType>(kType);
    constexpr int per = kPerVector<type>;
    const int64_t vectors = args.total / per;
    vectorised = vectors * per;
    const Vec16* a4 = static_cast<const Vec16*>(args.actual);
    const Vec16* e4 = static_cast<const Vec16*>(args.expected);
    Vec16 ra{}, re{};
    if (first < vectors) {
      ra = a4[first];
      re = e4[first];
    }
    for (int64_t q = first; q < vectors; q += stride) {
      Vec16 na{}, ne{};
      if (q + stride < vectors) {
        na = a4[q + stride];
        ne = e4[q + stride];
      }
      if (!on_vector(q * per, ra, re)) {
        TC_PRAGMA(unroll(kRareFallback ? 1 : per))
        for (int j = 0; j < per; ++j) {
          Element x;
          Decode<type>(ra, j, &x.a, &x.ba);
          Decode<type>(re, j, &x.e, &x.be);
          f(q * per + j, x);
        }
      }
      ra = na;
      re = ne;
    }
  }
  for (int64_t i = vectorised + first; i < args.total; i += stride) f(i, LoadElement(args, i));
}

// Instances whose vectors can take the lean path.
template <int kType>
inline constexpr bool kLean =
    kType == static_cast<int>(ElemType::kF32) || kType == static_cast<int>(ElemType::kF16) ||
    kType == static_cast<int>(ElemType::kBF16);

// The instance for these arrays: the compared type when both are stored
// in it, else kAnyTypes.
inline int KernelType(const CompareArgs& args) {
  const bool same = args.actual_type == args.compared && args.expected_type == args.compared;
  return same ? static_cast<int>(args.compared) : kAnyTypes;
}

// Calls Launch<type>::Run(args...) for the instance KernelType picked.
template <template <int> class Launch, typename... Args>
decltype(auto) Dispatch(int type, Args&&... args) {
  switch (type) {
    case static_cast<int>(ElemType::kF64):
      return Launch<static_cast<int>(ElemType::kF64)>::Run(args...);
    case static_cast<int>(ElemType::kF32):
      return Launch<static_cast<int>(ElemType::kF32)>::Run(args...);
    case static_cast<int>(ElemType::kF16):
      return Launch<static_cast<int>(ElemType::kF16)>::Run(args...);
    case static_cast<int>(ElemType::kBF16):
      return Launch<static_cast<int>(ElemType::kBF16)>::Run(args...);
    default:
      return Launch<kAnyTypes>::Run(args...);
  }
}

}  // namespace tensorcheck::cuda::cmp
