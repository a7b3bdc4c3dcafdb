// Merging Compare's chunks: their accumulators in chunk (= element) order,
// the block sums in block order (compensated), so that the result is the
// same however the blocks were split into chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "server/stats/diff_stats.h"
#include "server/stats/internal/block_kernels.h"

namespace tensorcheck::internal {

// The DiffTotals of all chunks and blocks; the chunks' worst lists, merged
// and cut to `top_k` (unordered), go to `worst`.
DiffTotals MergeChunks(std::vector<ChunkAcc>& accs, const std::vector<BlockSums>& blocks, int top_k,
                       std::vector<ElementDiff>* worst);

// s->top_columns and s->top_rows from the chunks' mismatch counts, for a
// [total / cols, cols] view; s->mismatched must be set.
void MergeGroups(const std::vector<ChunkAcc>& accs, int64_t cols, int top_groups, DiffStats* s);

}  // namespace tensorcheck::internal
