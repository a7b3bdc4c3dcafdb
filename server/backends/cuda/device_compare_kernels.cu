// Device comparison kernels: one pass for the totals (block partials,
// reduced in a fixed order by the pass's last block, so the sums are the
// same on every run), and a radix selection of the worst elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

#include <algorithm>
#include <cstdint>

#include "server/backends/cuda/internal/compare_iteration.h"
#include "server/backends/cuda/internal/compare_lean_path.h"
#include "server/backends/cuda/internal/compare_thread.h"
#include "server/backends/cuda/internal/device_compare_kernels.h"
#include "server/backends/cuda/internal/narrow_patterns.h"
#include "server/stats/element_rules.h"

namespace tensorcheck::cuda {
namespace {

using namespace cmp;  // what each thread does: internal/compare_thread.h and internal/compare_*.h

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = 1024;
constexpr int kDigits = 24;  // 3 key words of 8 bytes

int Blocks(int64_t total) {
  const int64_t per_block = int64_t{kThreads} * 4;
  return static_cast<int>(std::clamp<int64_t>((total + per_block - 1) / per_block, 1, kMaxBlocks));
}

// Radix selection state, in the scratch after the block partials. Digits
// (bytes of the 192-bit rank key) are selected from the most significant.
// Digits that every remaining candidate has as 0 are skipped (the low bytes
// of a 16-bit output's abs diff, the high bytes of small ULP distances).
// Once at most kListCapacity elements match the selected prefix, the next
// full pass also lists their keys and one block finishes on that list.
constexpr unsigned int kListCapacity = 1u << 14;

struct SelectState {
  ull prefix[3];   // the selected digits so far; the rest 0
  long long need;  // elements still to take among those matching prefix
  int done;        // every element matching prefix is taken
  int build_list;  // the next full pass lists the elements matching prefix
  int use_list;    // `list` holds the keys of every element matching prefix
  int next_digit;  // the next digit to select; passes for others do nothing
  unsigned int list_count;
  unsigned int pad;
  ull hist[256];
  ull word_or[3];  // OR of the keys matching the prefix, this pass
  ull list[kListCapacity][3];
};

size_t PartialsBytes() { return sizeof(CompareTotals) * kMaxBlocks; }

// ---- totals

// Larger value wins; equal values: the lower index (first occurrence).
__device__ __forceinline__ void TakeMax(double& v, long long& idx, double ov, long long oi) {
  if (ov > v || (ov == v && oi >= 0 && (idx < 0 || oi < idx))) {
    v = ov;
    idx = oi;
  }
}

__device__ __forceinline__ void Combine(CompareTotals& x, const CompareTotals& y) {
  x.sum_abs += y.sum_abs;
  x.sum_sq += y.sum_sq;
  x.sum_aa += y.sum_aa;
  x.sum_ee += y.sum_ee;
  x.sum_ae += y.sum_ae;
  x.sum_ulp += y.sum_ulp;
  x.sum_sigma2 += y.sum_sigma2;
  x.sum_sq_sigma += y.sum_sq_sigma;
  TakeMax(x.max_abs, x.max_abs_index, y.max_abs, y.max_abs_index);
  TakeMax(x.max_rel, x.max_rel_index, y.max_rel, y.max_rel_index);
  x.max_ulp = x.max_ulp > y.max_ulp ? x.max_ulp : y.max_ulp;
  x.finite += y.finite;
  x.mismatched += y.mismatched;
  x.bit_equal += y.bit_equal;
  x.nan_actual += y.nan_actual;
  x.nan_expected += y.nan_expected;
  x.inf_actual += y.inf_actual;
  x.inf_expected += y.inf_expected;
  x.nan_mismatch += y.nan_mismatch;
  x.ulp_infinite += y.ulp_infinite;
}

// Warp reductions one field at a time (a whole-struct shuffle would hold
// two copies of the struct in registers).
template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ void WarpMax(double& v, long long& idx) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const double ov = __shfl_down_sync(0xffffffffu, v, offset);
    const long long oi = __shfl_down_sync(0xffffffffu, idx, offset);
    TakeMax(v, idx, ov, oi);
  }
}

// Reduces every thread's `t` into the block's thread 0 (fixed order).
__device__ CompareTotals BlockReduce(CompareTotals t) {
  __shared__ CompareTotals warp_totals[kWarps];
  t.sum_abs = WarpSum(t.sum_abs);
  t.sum_sq = WarpSum(t.sum_sq);
  t.sum_aa = WarpSum(t.sum_aa);
  t.sum_ee = WarpSum(t.sum_ee);
  t.sum_ae = WarpSum(t.sum_ae);
  t.sum_ulp = WarpSum(t.sum_ulp);
  t.sum_sigma2 = WarpSum(t.sum_sigma2);
  t.sum_sq_sigma = WarpSum(t.sum_sq_sigma);
  WarpMax(t.max_abs, t.max_abs_index);
  WarpMax(t.max_rel, t.max_rel_index);
  for (int offset = 16; offset > 0; offset /= 2) {
    const ull o = __shfl_down_sync(0xffffffffu, t.max_ulp, offset);
    t.max_ulp = t.max_ulp > o ? t.max_ulp : o;
  }
  t.finite = WarpSum(t.finite);
  t.mismatched = WarpSum(t.mismatched);
  t.bit_equal = WarpSum(t.bit_equal);
  t.nan_actual = WarpSum(t.nan_actual);
  t.nan_expected = WarpSum(t.nan_expected);
  t.inf_actual = WarpSum(t.inf_actual);
  t.inf_expected = WarpSum(t.inf_expected);
  t.nan_mismatch = WarpSum(t.nan_mismatch);
  t.ulp_infinite = WarpSum(t.ulp_infinite);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_totals[warp] = t;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) Combine(t, warp_totals[w]);
  }
  return t;
}

// This thread's first element (or vector) and the grid's stride.
__device__ __forceinline__ int64_t ThreadFirst() {
  return int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() { return int64_t{gridDim.x} * blockDim.x; }

template <int kType, typename F>
__device__ __forceinline__ void ForEachElement(const CompareArgs& args, F&& f) {
  const int64_t stride = GridStride();
  const int64_t first = ThreadFirst();
  ForEachVector<kType, false>(
      args, first, stride, [](int64_t, const Vec16&, const Vec16&) { return false; }, f);
}

// A partial written by another block: read past this multiprocessor's L1.
__device__ __forceinline__ CompareTotals LoadPartial(const CompareTotals* p) {
  static_assert(sizeof(CompareTotals) % sizeof(ull) == 0, "8-byte fields");
  CompareTotals t;
  const ull* from = reinterpret_cast<const ull*>(p);
  ull* to = reinterpret_cast<ull*>(&t);
  for (size_t k = 0; k < sizeof(CompareTotals) / sizeof(ull); ++k) to[k] = __ldcg(from + k);
  return t;
}

// The totals pass. Each block writes its partial; the last block to finish
// reduces them in block order (the same sums on every run) into
// result->totals, which saves the launch of a kernel for it. Blocks of 256
// threads, three per multiprocessor (at most 85 registers), two for the
// lean kernels, whose common path needs about 110 registers and would
// otherwise spill to local memory.
template <int kType>
__global__ void __launch_bounds__(kThreads, kLean<kType> ? 2 : 3)
    TotalsKernel(CompareArgs args, CompareTotals* partials, CompareResult* result, ull* col_counts,
                 ull* row_counts) {
  __shared__ unsigned int block_hist[kCompareHistBuckets];
  __shared__ RareCounts rare;
  __shared__ bool last_block;
  for (int b = threadIdx.x; b < kCompareHistBuckets; b += blockDim.x) block_hist[b] = 0;
  if (threadIdx.x == 0) rare = RareCounts{0, 0, 0, 0, 0, 0};
  __syncthreads();
  const rules::BitLayout layout = rules::LayoutOf(args.compared);
  ThreadTotals mine;
  LocalHistogram hist;
  hist.shared = block_hist;
  const int64_t stride = GridStride();
  const int64_t first = ThreadFirst();
  ForEachVector<kType, kLean<kType>>(
      args, first, stride,
      [&](int64_t first, const Vec16& ra, const Vec16& re) {
        if constexpr (kLean<kType>) {
          return TryLeanVector<static_cast<ElemType>(kType)>(args, first, ra, re, mine, hist,
                                                             col_counts, row_counts);
        } else {
          return false;
        }
      },
      [&](int64_t i, const Element& x) {
        Accumulate(args, layout, i, x, mine, &rare, hist, col_counts, row_counts,
                   &result->nonfinite_count);
      });
  hist.Flush();                                   // every thread of the block reaches it
  CompareTotals t = BlockReduce(ToTotals(mine));  // its __syncthreads orders `rare`
  if (threadIdx.x == 0) {
    t.nan_actual += rare.nan_actual;
    t.nan_expected += rare.nan_expected;
    t.inf_actual += rare.inf_actual;
    t.inf_expected += rare.inf_expected;
    t.nan_mismatch += rare.nan_mismatch;
    t.ulp_infinite += rare.ulp_infinite;
    partials[blockIdx.x] = t;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kCompareHistBuckets; b += blockDim.x) {
    if (block_hist[b] != 0) atomicAdd(&result->ulp_histogram[b], ull{block_hist[b]});
  }
  if (threadIdx.x == 0) {
    __threadfence();  // the partial before the ticket
    last_block = atomicAdd(&result->blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  CompareTotals total = EmptyTotals();
  for (int j = threadIdx.x; j < static_cast<int>(gridDim.x); j += blockDim.x) {
    Combine(total, LoadPartial(&partials[j]));
  }
  total = BlockReduce(total);
  if (threadIdx.x == 0) result->totals = total;
}

// ---- worst elements

struct Key {
  ull w[3];
};

// Compare's ranking as one 192-bit unsigned key, higher ranks first:
// (NaN against a number ? all ones : bits of the abs diff, which order
// like the values for r >= 0), then the ULP distance, then ~index.
__device__ __forceinline__ Key RankKey(const CompareArgs& args, const rules::BitLayout& layout,
                                       int64_t i, const Element& x) {
  const bool nan_a = isnan(x.a), nan_e = isnan(x.e);
  double r;
  if (nan_a || nan_e) {
    r = (nan_a && nan_e && args.nan_equal) ? 0.0 : CUDART_INF;
  } else if (!isfinite(x.a) || !isfinite(x.e)) {
    r = x.a == x.e ? 0.0 : CUDART_INF;
  } else {
    r = fabs(x.a - x.e);
  }
  Key k;
  k.w[0] = nan_a != nan_e ? ~0ull : static_cast<ull>(__double_as_longlong(r));
  k.w[1] = rules::DistanceFromBits(x.ba, x.be, layout);
  k.w[2] = ~static_cast<ull>(i);
  return k;
}

__device__ __forceinline__ int Digit(const Key& k, int p) {
  return static_cast<int>((k.w[p / 8] >> (56 - 8 * (p % 8))) & 0xff);
}

// Whether the first p digits of k are those of prefix.
__device__ __forceinline__ bool MatchesPrefix(const Key& k, const ull* prefix, int p) {
  const int full = p / 8;
  for (int j = 0; j < full; ++j) {
    if (k.w[j] != prefix[j]) return false;
  }
  const int rest = p % 8;
  if (rest == 0) return true;
  const ull mask = ~0ull << (64 - 8 * rest);
  return (k.w[full] & mask) == (prefix[full] & mask);
}

// Digits of ~index above the bytes that can differ are constant and skipped.
__device__ __forceinline__ int NextDigit(int p, int first_index_digit) {
  ++p;
  return (p >= 16 && p < first_index_digit) ? first_index_digit : p;
}

// Selects digit p from its histogram (thread 0 of one block): the bin
// holding the need-th highest element among those matching prefix. Then
// skips the digits that `word_or` shows to be 0 for every such element.
template <typename Count>
__device__ void PickDigit(SelectState* s, int p, const Count* hist, const ull* word_or,
                          int first_index_digit) {
  long long above = 0;
  int d = 255;
  for (; d > 0; --d) {
    const long long h = static_cast<long long>(hist[d]);
    if (above + h >= s->need) break;
    above += h;
  }
  s->need -= above;
  const int word = p / 8, shift = 56 - 8 * (p % 8);
  s->prefix[word] = (s->prefix[word] & ~(0xffull << shift)) | (ull(d) << shift);
  const long long in_bin = static_cast<long long>(hist[d]);
  if (in_bin == s->need) s->done = 1;
  if (!s->use_list && in_bin <= static_cast<long long>(kListCapacity)) s->build_list = 1;
  int q = NextDigit(p, first_index_digit);
  while (q < kDigits && ((word_or[q / 8] >> (56 - 8 * (q % 8))) & 0xff) == 0) {
    q = NextDigit(q, first_index_digit);
  }
  s->next_digit = q;
}

__global__ void SelectInitKernel(SelectState* s, long long need, ull index_prefix,
                                 CompareResult* result) {
  s->prefix[0] = s->prefix[1] = 0;
  s->prefix[2] = index_prefix;
  s->need = need;
  s->done = s->build_list = s->use_list = 0;
  s->next_digit = 0;
  s->list_count = 0;
  for (int b = 0; b < 256; ++b) s->hist[b] = 0;
  s->word_or[0] = s->word_or[1] = s->word_or[2] = 0;
  result->worst_count = 0;
}

// Histogram of digit p over every element matching the prefix, the OR of
// their keys and, when asked, the list of their keys.
template <int kType>
__global__ void __launch_bounds__(kThreads)
    SelectHistogramKernel(CompareArgs args, SelectState* s, int p) {
  if (s->done || s->use_list || s->next_digit != p) return;  // the same for every thread
  __shared__ unsigned int block_hist[256];
  block_hist[threadIdx.x] = 0;  // blockDim.x == 256
  __syncthreads();
  const rules::BitLayout layout = rules::LayoutOf(args.compared);
  const ull prefix[3] = {s->prefix[0], s->prefix[1], s->prefix[2]};
  const bool build = s->build_list != 0;
  ull word_or[3] = {0, 0, 0};
  ForEachElement<kType>(args, [&](int64_t i, const Element& x) {
    const Key k = RankKey(args, layout, i, x);
    if (!MatchesPrefix(k, prefix, p)) return;
    // One atomic per distinct digit in the warp: the first digits of close
    // outputs are mostly the same.
    const int digit = Digit(k, p);
    const unsigned int peers = __match_any_sync(__activemask(), digit);
    if ((threadIdx.x % 32) == static_cast<unsigned int>(__ffs(peers) - 1)) {
      atomicAdd(&block_hist[digit], static_cast<unsigned int>(__popc(peers)));
    }
    word_or[0] |= k.w[0];
    word_or[1] |= k.w[1];
    word_or[2] |= k.w[2];
    if (build) {
      const unsigned int slot = atomicAdd(&s->list_count, 1u);
      if (slot < kListCapacity) {
        s->list[slot][0] = k.w[0];
        s->list[slot][1] = k.w[1];
        s->list[slot][2] = k.w[2];
      }
    }
  });
  __syncthreads();
  if (block_hist[threadIdx.x] != 0) atomicAdd(&s->hist[threadIdx.x], ull{block_hist[threadIdx.x]});
  for (int w = 0; w < 3; ++w) {
    // OR across the warp, as two 32-bit halves; then one atomic per warp.
    const unsigned int hi =
        __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(word_or[w] >> 32));
    const unsigned int lo = __reduce_or_sync(0xffffffffu, static_cast<unsigned int>(word_or[w]));
    const ull v = (ull{hi} << 32) | lo;
    if (threadIdx.x % 32 == 0 && v != 0) atomicOr(&s->word_or[w], v);
  }
}

__global__ void SelectPickKernel(SelectState* s, int p, int first_index_digit) {
  if (s->done || s->use_list || s->next_digit != p) return;
  if (s->build_list) {  // the pass just run listed the matching elements
    s->use_list = 1;
    s->build_list = 0;
  }
  PickDigit(s, p, s->hist, s->word_or, first_index_digit);
  for (int b = 0; b < 256; ++b) s->hist[b] = 0;
  s->word_or[0] = s->word_or[1] = s->word_or[2] = 0;
}

// Once the list holds the keys of every element matching the prefix: the
// remaining digits, in one block, over the list alone.
__global__ void __launch_bounds__(kThreads)
    SelectListKernel(SelectState* s, int first_index_digit) {
  if (s->done || !s->use_list) return;
  __shared__ unsigned int block_hist[256];
  __shared__ ull block_or[3];
  __shared__ int finished;
  const unsigned int count = min(s->list_count, kListCapacity);
  for (int p = s->next_digit; p < kDigits; p = s->next_digit) {
    block_hist[threadIdx.x] = 0;
    if (threadIdx.x < 3) block_or[threadIdx.x] = 0;
    __syncthreads();
    const ull prefix[3] = {s->prefix[0], s->prefix[1], s->prefix[2]};
    for (unsigned int j = threadIdx.x; j < count; j += blockDim.x) {
      const Key k{{s->list[j][0], s->list[j][1], s->list[j][2]}};
      if (!MatchesPrefix(k, prefix, p)) continue;
      atomicAdd(&block_hist[Digit(k, p)], 1u);
      atomicOr(&block_or[0], k.w[0]);
      atomicOr(&block_or[1], k.w[1]);
      atomicOr(&block_or[2], k.w[2]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      PickDigit(s, p, block_hist, block_or, first_index_digit);
      finished = s->done;
    }
    __syncthreads();
    if (finished) break;
  }
}

template <int kType>
__global__ void __launch_bounds__(kThreads)
    SelectGatherKernel(CompareArgs args, const SelectState* s, int k, WorstEntry* out,
                       CompareResult* result) {
  const rules::BitLayout layout = rules::LayoutOf(args.compared);
  const ull t0 = s->prefix[0], t1 = s->prefix[1], t2 = s->prefix[2];
  ForEachElement<kType>(args, [&](int64_t i, const Element& x) {
    const Key key = RankKey(args, layout, i, x);
    const bool at_least = key.w[0] != t0   ? key.w[0] > t0
                          : key.w[1] != t1 ? key.w[1] > t1
                                           : key.w[2] >= t2;
    if (!at_least) return;
    const unsigned int pos = atomicAdd(&result->worst_count, 1u);
    if (pos < static_cast<unsigned int>(k)) {
      out[pos] = WorstEntry{static_cast<long long>(i), x.a, x.e, x.ba, x.be};
    }
  });
}

// Blocks of TotalsKernel<kType> the device holds at once: its
// multiprocessors times the kernel's occupancy (kMaxBlocks when the device
// cannot say). The totals pass runs as at most one wave of these, each
// thread taking many vectors, so that the per-block epilogue (reductions,
// histogram, partial) is paid by few blocks: with 1024 blocks a thread of
// the 1921x3072 bf16 case takes under 3 vectors, and the epilogue's
// instructions (warp and block reductions of 20 fields) are of the order
// of theirs.
template <int kType>
int ResidentTotalsBlocks() {
  static const int resident = [] {
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, TotalsKernel<kType>, kThreads, 0) !=
            cudaSuccess ||
        sms <= 0 || per_sm <= 0) {
      cudaGetLastError();  // leave no error behind for the launch to report
      return static_cast<int>(kMaxBlocks);
    }
    return static_cast<int>(std::min<int64_t>(int64_t{sms} * per_sm, kMaxBlocks));
  }();
  return resident;
}

template <int kType>
struct TotalsLaunch {
  static cudaError_t Run(cudaStream_t stream, const CompareArgs& args, CompareTotals* partials,
                         CompareResult* result, ull* cols, ull* rows) {
    const int blocks = std::min(Blocks(args.total), ResidentTotalsBlocks<kType>());
    TotalsKernel<kType><<<blocks, kThreads, 0, stream>>>(args, partials, result, cols, rows);
    return cudaGetLastError();
  }
};

template <int kType>
struct HistogramLaunch {
  static cudaError_t Run(int blocks, cudaStream_t stream, const CompareArgs& args, SelectState* s,
                         int p) {
    SelectHistogramKernel<kType><<<blocks, kThreads, 0, stream>>>(args, s, p);
    return cudaGetLastError();
  }
};

template <int kType>
struct GatherLaunch {
  static cudaError_t Run(int blocks, cudaStream_t stream, const CompareArgs& args,
                         const SelectState* s, int k, WorstEntry* out, CompareResult* result) {
    SelectGatherKernel<kType><<<blocks, kThreads, 0, stream>>>(args, s, k, out, result);
    return cudaGetLastError();
  }
};

}  // namespace

size_t CompareScratchBytes(int64_t /*total*/) { return PartialsBytes() + sizeof(SelectState); }

cudaError_t LaunchCompareTotals(const CompareArgs& args, void* scratch, CompareResult* result,
                                ull* col_counts, ull* row_counts, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(result, 0, sizeof(*result), stream);
  if (e != cudaSuccess) return e;
  if (col_counts != nullptr) {
    e = cudaMemsetAsync(col_counts, 0, sizeof(ull) * static_cast<size_t>(args.cols), stream);
    if (e != cudaSuccess) return e;
    e = cudaMemsetAsync(row_counts, 0, sizeof(ull) * static_cast<size_t>(args.total / args.cols),
                        stream);
    if (e != cudaSuccess) return e;
  }
  auto* partials = static_cast<CompareTotals*>(scratch);
  return Dispatch<TotalsLaunch>(KernelType(args), stream, args, partials, result, col_counts,
                                row_counts);
}

cudaError_t LaunchSelectWorst(const CompareArgs& args, int k, void* scratch, WorstEntry* out,
                              CompareResult* result, cudaStream_t stream) {
  auto* state = reinterpret_cast<SelectState*>(static_cast<char*>(scratch) + PartialsBytes());
  const long long need = std::min<long long>(k, args.total);
  // ~index: above the bytes that hold total-1, every key has all ones, so
  // those digits are set here and not selected.
  int index_bytes = 1;
  while (index_bytes < 8 && (static_cast<ull>(args.total - 1) >> (8 * index_bytes)) != 0) {
    ++index_bytes;
  }
  const ull index_prefix = index_bytes == 8 ? 0 : ~0ull << (8 * index_bytes);
  const int first_index_digit = 16 + (8 - index_bytes);
  SelectInitKernel<<<1, 1, 0, stream>>>(state, need, index_prefix, result);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int blocks = Blocks(args.total);
  const int type = KernelType(args);
  // Full passes until the list takes over (usually two or three); after
  // every third, ask the device whether it is done before launching more.
  int passes = 0;
  for (int p = 0; p < kDigits; p = p + 1 == 16 ? first_index_digit : p + 1) {
    if ((e = Dispatch<HistogramLaunch>(type, blocks, stream, args, state, p)) != cudaSuccess) {
      return e;
    }
    SelectPickKernel<<<1, 1, 0, stream>>>(state, p, first_index_digit);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    SelectListKernel<<<1, kThreads, 0, stream>>>(state, first_index_digit);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    if (++passes % 3 == 0) {
      int done = 0;
      if ((e = cudaMemcpyAsync(&done, &state->done, sizeof(done), cudaMemcpyDeviceToHost,
                               stream)) != cudaSuccess ||
          (e = cudaStreamSynchronize(stream)) != cudaSuccess) {
        return e;
      }
      if (done) break;
    }
  }
  return Dispatch<GatherLaunch>(type, blocks, stream, args, state, k, out, result);
}

}  // namespace tensorcheck::cuda
