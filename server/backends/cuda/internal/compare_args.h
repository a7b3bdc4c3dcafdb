// From stats' CompareOptions to the device comparison's kernel arguments,
// and from the kernels' result back to stats' totals (internal to this
// folder). Host code without CUDA: DeviceCompare uses it to drive the
// kernels, and CompareThreadTest to run the kernels' per-thread code on the
// host, in a build without CUDA too.
//
//   CompareArgs args = MakeCompareArgs({x.raw(), x.dtype(), x.numel()},
//                                      {y.raw(), y.dtype(), y.numel()}, options);
//   ... the totals pass fills a CompareResult ...
//   DiffStats s = FinishDiffStats(total, ToDiffTotals(result), {}, options);
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "server/backends/cuda/internal/kernel_args.h"
#include "server/stats/diff_stats.h"
#include "server/stats/ulp.h"

namespace tensorcheck::cuda {

// The device element type of a dtype (stats' mapping onto the shared rules'
// type, which the device's ElemType is).
inline ElemType ToElem(DType d) { return ElemTypeOf(d); }

// A device array of `numel` elements of `dtype`.
struct DeviceArray {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
};

// The kernels' arguments for comparing `actual` with `expected` under
// `options` (the device scratch pointers, sigma and bound left unset).
CompareArgs MakeCompareArgs(const DeviceArray& actual, const DeviceArray& expected,
                            const CompareOptions& options);

// The totals pass's result as stats' DiffTotals (before the sigma
// correction and `worst`, which Finish adds).
DiffTotals ToDiffTotals(const CompareResult& result);

}  // namespace tensorcheck::cuda
