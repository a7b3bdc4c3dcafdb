// The per-block kernels of Compare and what they accumulate.
//
// Compare cuts the elements into blocks of kBlock and the blocks into
// chunks; RunChunk runs one chunk's blocks in order into its ChunkAcc and
// writes each block's sums to CompareContext::blocks. Per block it picks
//   FastBlock<float>   fp32 tensors compared in fp32, read in place; its
//                      first passes go to the AVX2 kernel
//                      (block_kernels_avx2.cc) when the CPU has AVX2,
//   FastBlock<double>  any other all-finite block, after Decode/ToBits,
//   SlowBlock          element by element, for blocks holding a NaN or an
//                      infinity (or whose sums overflow).
// All three give bitwise the same results (the tests hold them against
// each other through SetCompareKernelForTesting).
//
// Thread safety: a chunk's ChunkAcc is written by the one thread that runs
// it; `blocks` entries are disjoint per chunk; the rest is read-only.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "server/stats/diff_stats.h"
#include "server/stats/internal/ulp_bits.h"
#include "server/stats/internal/worst.h"

namespace tensorcheck::internal {

// Elements per summation block. Sums are taken per block in element order
// and the block sums added in block order, so the result is the same for
// every split into chunks (chunks own whole blocks).
inline constexpr int64_t kBlock = 1024;

inline constexpr int kHistBuckets = kUlpHistogramBuckets;

// Per-block sums, added in block order at the end.
struct BlockSums {
  double abs = 0;       // |a-e|
  double sq = 0;        // (a-e)^2
  double aa = 0;        // a^2
  double ee = 0;        // e^2
  double ae = 0;        // a*e
  double ulp = 0;       // finite ULP distances
  double sigma2 = 0;    // predicted sigma^2
  double sq_sigma = 0;  // (a-e)^2 where sigma is finite
};

// What every chunk of one Compare call reads.
struct CompareContext {
  const Tensor* actual;
  const Tensor* expected;
  const CompareOptions* options;
  BitLayout layout;
  int64_t total;
  int64_t cols;
  std::vector<BlockSums>* blocks;
};

// Everything one chunk accumulates over its contiguous range.
struct ChunkAcc {
  explicit ChunkAcc(int top_k) : worst(top_k) {}

  int64_t start = 0;
  int64_t end = 0;
  int64_t finite = 0;
  int64_t mismatched = 0;
  int64_t bit_equal = 0;
  int64_t nan_actual = 0;
  int64_t nan_expected = 0;
  int64_t inf_actual = 0;
  int64_t inf_expected = 0;
  int64_t nan_mismatch = 0;
  int64_t ulp_infinite = 0;
  uint64_t max_ulp = 0;
  // Four interleaved copies, so that runs of equal distances do not chain
  // every element through one counter in memory.
  std::array<std::array<int64_t, kHistBuckets>, 4> hist{};
  double max_abs = -1;
  int64_t max_abs_index = -1;
  double max_rel = -1;
  int64_t max_rel_index = -1;
  WorstHeap worst;

  // Mismatch counts, allocated at the first mismatch. Columns are indexed
  // by column when the range spans at least `cols` elements, else by
  // offset from `start` (distinct offsets are then distinct columns).
  bool col_by_offset = false;
  std::vector<int64_t> col_counts;
  int64_t first_row = 0;
  std::vector<int64_t> row_counts;  // indexed by row - first_row
};

inline void RecordMismatch(ChunkAcc& acc, const CompareContext& sh, int64_t i, int64_t col,
                           int64_t row) {
  ++acc.mismatched;
  if (sh.options->top_groups == 0) return;
  if (acc.row_counts.empty()) {
    const int64_t len = acc.end - acc.start;
    acc.col_by_offset = len < sh.cols;
    acc.col_counts.assign(static_cast<size_t>(acc.col_by_offset ? len : sh.cols), 0);
    acc.first_row = acc.start / sh.cols;
    const int64_t last_row = (acc.end - 1) / sh.cols;
    acc.row_counts.assign(static_cast<size_t>(last_row - acc.first_row + 1), 0);
  }
  ++acc.col_counts[static_cast<size_t>(acc.col_by_offset ? i - acc.start : col)];
  ++acc.row_counts[static_cast<size_t>(row - acc.first_row)];
}

// Runs blocks [first_block, last_block) into `acc` (whose range it sets)
// and sh.blocks. compare_chunk.cc.
void RunChunk(const CompareContext& sh, int64_t first_block, int64_t last_block, ChunkAcc& acc);

// One block of elements [start, start + n): the widened values and the
// compared-dtype bits of both sides.
struct BlockView {
  int64_t start;
  int64_t n;
  const double* a;
  const double* e;
  const uint64_t* ba;
  const uint64_t* be;
};

// Any block, element by element, with every special case; `col`/`row`
// are the first element's and advance past the block.
// block_kernels_scalar.cc.
void SlowBlock(ChunkAcc& acc, const CompareContext& sh, const BlockView& v, int64_t& col,
               int64_t& row, BlockSums& bs);

// A block whose values are all finite, in three simple passes (sums, ULP
// distances, then the order-dependent maxima, tolerance and worst list).
// Returns false, having changed nothing, when the block holds a non-finite
// value or its sums overflow; SlowBlock then takes it.
//
// T is the element type read: double (values widened by Decode, bits from
// ToBits) or float (fp32 tensors compared in fp32, read in place: the bits
// are the float's own). abs_buf and ulp_buf are kBlock-long scratch.
// block_kernels_portable.cc (instantiated for float and double).
template <typename T>
struct FastView {
  int64_t start;
  int64_t n;
  const T* a;
  const T* e;
  const uint64_t* ba;  // T == double only
  const uint64_t* be;
};
template <typename T>
bool FastBlock(ChunkAcc& acc, const CompareContext& sh, const FastView<T>& v, int64_t& col,
               int64_t& row, BlockSums& bs, double* abs_buf, uint64_t* ulp_buf);

// Which kernels run: 0 all (production), 1 all but the fused AVX2 fp32
// kernel (the portable vector passes run), 2 SlowBlock only.
int CompareKernelMode();
// Testing only: sets CompareKernelMode() for every later Compare.
void SetCompareKernelForTesting(int mode);

}  // namespace tensorcheck::internal
