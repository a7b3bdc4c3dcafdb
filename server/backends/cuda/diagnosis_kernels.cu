// A diagnosis's per-element passes on the device (diagnosis_kernels.h):
// per-block partial sums reduced in a fixed order, and the differing
// counts by integer atomics.
#include <algorithm>
#include <cstdint>

#include "server/backends/cuda/internal/compare_thread.h"
#include "server/backends/cuda/internal/diagnosis_kernels.h"
#include "server/stats/diagnosis_rules.h"
#include "server/stats/element_rules.h"
#include "server/stats/error_model_rules.h"

namespace tensorcheck::cuda {
namespace {

using cmp::ull;

constexpr int kThreads = 256;  // a power of two: the block's tree reduction halves it
constexpr int64_t kMaxBlocks = 1024;
constexpr unsigned int kFullMask = 0xffffffffu;

static_assert(kThreads % 32 == 0, "whole warps");

__device__ __forceinline__ int64_t FirstIndex() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t Stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

bool ValidType(ElemType t) {
  return t == ElemType::kF64 || t == ElemType::kF32 || t == ElemType::kF16 || t == ElemType::kBF16;
}

bool ValidValues(const DeviceValues& v) { return v.data != nullptr && ValidType(v.type); }

// ---- element access (diagnosis_passes.cc's, on the device)

__device__ __forceinline__ bool Reads(const uint8_t* mask, int64_t i) {
  return mask == nullptr || mask[i] != 0;
}

__device__ __forceinline__ double Value(const DeviceValues& v, int64_t i) {
  return cmp::Load(v.data, v.type, i);
}

// Element i's bits in `compared`: as stored when the array is of that
// type, else its value rounded to nearest even in it.
__device__ __forceinline__ ull Bits(const DeviceValues& v, int64_t i, double value,
                                    ElemType compared) {
  return v.type == compared ? cmp::RawBits(v.data, v.type, i) : cmp::BitsOf(value, compared);
}

// DiagnosisUlp(va, vb, compared) of element i of `a` and `b` (values va,
// vb): 0 where the values are equal, else the distance of their bits in
// the compared type.
__device__ __forceinline__ uint64_t Ulp(const DeviceValues& a, double va, const DeviceValues& b,
                                        double vb, int64_t i, ElemType compared,
                                        const rules::BitLayout& layout) {
  if (va == vb) return 0;
  return rules::DistanceFromBits(Bits(a, i, va, compared), Bits(b, i, vb, compared), layout);
}

// ---- the passes: each thread's Add per element, Merge across threads

struct BitsDifferPass {
  using Sums = int64_t;
  const void* a;
  const void* b;
  ElemType type;
  int64_t count;

  __device__ __forceinline__ void Add(Sums& s, int64_t i) const {
    if (cmp::RawBits(a, type, i) != cmp::RawBits(b, type, i)) ++s;
  }
  __device__ __forceinline__ static void Merge(Sums& into, const Sums& part) { into += part; }
};

struct MarkPass {
  using Sums = int64_t;
  DeviceMarkArgs a;
  rules::BitLayout layout;
  int64_t count;

  __device__ __forceinline__ void Add(Sums& s, int64_t i) const {
    uint8_t m = a.mask[i];
    if (m == 0) {
      const double o = Value(a.observed, i);
      const double v = Value(a.candidate, i);
      if (rules::ElementConsistent(o, v, Ulp(a.observed, o, a.candidate, v, i, a.compared, layout),
                                   a.pair_sigma[i])) {
        m = 1;
        a.mask[i] = 1;
      }
    }
    if (m != 0) ++s;
  }
  __device__ __forceinline__ static void Merge(Sums& into, const Sums& part) { into += part; }
};

struct ScorePass {
  using Sums = rules::ScoreSums;
  DeviceScoreArgs a;
  rules::BitLayout layout;
  int64_t count;

  __device__ __forceinline__ void Add(Sums& s, int64_t i) const {
    if (!Reads(a.mask, i)) return;
    const double o = Value(a.observed, i);
    const double v = Value(a.candidate, i);
    const float grid = a.flip_grid != nullptr
                           ? a.flip_grid[i]
                           : __double2float_rn(rules::OutputSpacing(v, a.compared));
    rules::AddToScore(s, o, v, Ulp(a.observed, o, a.candidate, v, i, a.compared, layout),
                      a.pair_sigma[i], a.pair_accumulation_sigma[i], grid);
  }
  __device__ __forceinline__ static void Merge(Sums& into, const Sums& part) {
    rules::MergeScore(into, part);
  }
};

struct PairedPass {
  using Sums = rules::PairedSums;
  DevicePairedArgs a;
  rules::BitLayout layout;
  int64_t count;

  __device__ __forceinline__ void Add(Sums& s, int64_t i) const {
    if (!Reads(a.mask, i)) return;
    const double bv = Value(a.best, i), rv = Value(a.runner, i);
    if (!rules::PairedElementCounts(bv, rv, a.sigma[i])) return;
    const double o = Value(a.observed, i);
    rules::AddToPaired(s, Ulp(a.observed, o, a.best, bv, i, a.compared, layout),
                       Ulp(a.observed, o, a.runner, rv, i, a.compared, layout));
  }
  __device__ __forceinline__ static void Merge(Sums& into, const Sums& part) {
    rules::MergePaired(into, part);
  }
};

struct ErrorPass {
  using Sums = rules::ErrorSums;
  DeviceErrorArgs a;
  int64_t count;

  __device__ __forceinline__ void Add(Sums& s, int64_t i) const {
    if (!Reads(a.mask, i)) return;
    rules::AddToError(s, Value(a.observed, i), Value(a.reference, i), a.sigma_vs_reference[i]);
  }
  __device__ __forceinline__ static void Merge(Sums& into, const Sums& part) {
    rules::MergeError(into, part);
  }
};

// ---- kernels

// Each thread adds its elements (a grid-stride loop, in index order) into
// its own sums; the block merges them in shared memory in a fixed tree
// order and writes its partial to partials[blockIdx.x].
template <typename Pass>
__global__ void __launch_bounds__(kThreads)
    ReduceKernel(const Pass pass, typename Pass::Sums* partials) {
  using Sums = typename Pass::Sums;
  static_assert(sizeof(Sums) % sizeof(ull) == 0 && alignof(Sums) <= alignof(ull),
                "the shared storage holds whole 8-byte words");
  // Raw storage: the sums have default member initializers, which a
  // __shared__ variable cannot have.
  __shared__ ull storage[kThreads * (sizeof(Sums) / sizeof(ull))];
  Sums* shared = reinterpret_cast<Sums*>(storage);
  Sums s{};
  for (int64_t i = FirstIndex(); i < pass.count; i += Stride()) pass.Add(s, i);
  shared[threadIdx.x] = s;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) {
      Pass::Merge(shared[threadIdx.x], shared[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

// The differing counts. The loop is uniform across each warp (every lane
// runs the same iterations, lanes past `count` reading nothing), so the
// warp-wide votes see all 32 lanes: one atomic per distinct column and row
// among a warp's differing elements, and one per warp for the total.
__global__ void __launch_bounds__(kThreads) DifferingKernel(const DeviceDifferingArgs a) {
  const rules::BitLayout layout = rules::LayoutOf(a.compared);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t rows = a.count / a.cols;
  ull total = 0;  // lane 0's
  const int64_t warp_first = static_cast<int64_t>(blockIdx.x) * blockDim.x + (threadIdx.x - lane);
  for (int64_t base = warp_first; base < a.count; base += Stride()) {
    const int64_t i = base + lane;
    bool differs = false;
    if (i < a.count && Reads(a.mask, i)) {
      const double va = Value(a.a, i), vb = Value(a.b, i);
      differs = Ulp(a.a, va, a.b, vb, i, a.compared, layout) != 0;
    }
    const unsigned int vote = __ballot_sync(kFullMask, differs);
    if (vote == 0) continue;
    if (lane == 0) total += static_cast<ull>(__popc(vote));
    // Lanes without a differing element match each other on ~0, which no
    // column or row index is, and add nothing.
    const ull col = differs ? static_cast<ull>(i % a.cols) : ~0ull;
    const unsigned int same_col = __match_any_sync(kFullMask, col);
    if (differs && lane == __ffs(static_cast<int>(same_col)) - 1) {
      atomicAdd(&a.columns[col], static_cast<ull>(__popc(same_col)));
    }
    const int64_t r = i / a.cols;
    const ull row = differs && r < rows ? static_cast<ull>(r) : ~0ull;
    const unsigned int same_row = __match_any_sync(kFullMask, row);
    if (row != ~0ull && lane == __ffs(static_cast<int>(same_row)) - 1) {
      atomicAdd(&a.rows[row], static_cast<ull>(__popc(same_row)));
    }
  }
  if (lane == 0 && total != 0) atomicAdd(a.total, total);
}

template <typename Pass>
cudaError_t LaunchReduce(const Pass& pass, typename Pass::Sums* partials, cudaStream_t stream) {
  ReduceKernel<Pass><<<DiagnosisBlocks(pass.count), kThreads, 0, stream>>>(pass, partials);
  return cudaGetLastError();
}

}  // namespace

int DiagnosisBlocks(int64_t count) {
  if (count <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks));
}

cudaError_t LaunchCountBitsDiffer(const void* a, const void* b, ElemType type, int64_t count,
                                  int64_t* partials, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (a == nullptr || b == nullptr || partials == nullptr || !ValidType(type)) {
    return cudaErrorInvalidValue;
  }
  return LaunchReduce(BitsDifferPass{a, b, type, count}, partials, stream);
}

cudaError_t LaunchMarkConsistent(const DeviceMarkArgs& args, int64_t* partials,
                                 cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  if (!ValidValues(args.observed) || !ValidValues(args.candidate) || args.pair_sigma == nullptr ||
      args.mask == nullptr || !ValidType(args.compared) || partials == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchReduce(MarkPass{args, rules::LayoutOf(args.compared), args.count}, partials, stream);
}

cudaError_t LaunchScore(const DeviceScoreArgs& args, rules::ScoreSums* partials,
                        cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  if (!ValidValues(args.observed) || !ValidValues(args.candidate) || args.pair_sigma == nullptr ||
      args.pair_accumulation_sigma == nullptr || !ValidType(args.compared) || partials == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchReduce(ScorePass{args, rules::LayoutOf(args.compared), args.count}, partials,
                      stream);
}

cudaError_t LaunchPaired(const DevicePairedArgs& args, rules::PairedSums* partials,
                         cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  if (!ValidValues(args.observed) || !ValidValues(args.best) || !ValidValues(args.runner) ||
      args.sigma == nullptr || !ValidType(args.compared) || partials == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchReduce(PairedPass{args, rules::LayoutOf(args.compared), args.count}, partials,
                      stream);
}

cudaError_t LaunchDiffering(const DeviceDifferingArgs& args, cudaStream_t stream) {
  const int64_t count = std::max<int64_t>(args.count, 0);
  if (args.cols < 1 || args.columns == nullptr || args.total == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t rows = count / args.cols;
  if ((rows > 0 && args.rows == nullptr) ||
      (count > 0 && (!ValidValues(args.a) || !ValidValues(args.b) || !ValidType(args.compared)))) {
    return cudaErrorInvalidValue;
  }
  const size_t counter = sizeof(unsigned long long);
  cudaError_t e =
      cudaMemsetAsync(args.columns, 0, static_cast<size_t>(args.cols) * counter, stream);
  if (e == cudaSuccess && rows > 0) {
    e = cudaMemsetAsync(args.rows, 0, static_cast<size_t>(rows) * counter, stream);
  }
  if (e == cudaSuccess) e = cudaMemsetAsync(args.total, 0, counter, stream);
  if (e != cudaSuccess || count == 0) return e;
  DifferingKernel<<<DiagnosisBlocks(count), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t LaunchErrorVsReference(const DeviceErrorArgs& args, rules::ErrorSums* partials,
                                   cudaStream_t stream) {
  if (args.count <= 0) return cudaSuccess;
  if (!ValidValues(args.observed) || !ValidValues(args.reference) ||
      args.sigma_vs_reference == nullptr || partials == nullptr) {
    return cudaErrorInvalidValue;
  }
  return LaunchReduce(ErrorPass{args, args.count}, partials, stream);
}

}  // namespace tensorcheck::cuda
