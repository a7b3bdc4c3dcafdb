// The fused AVX2 kernel for fp32 blocks (block_kernels_avx2.cc), which is
// compiled with -mavx2 while its callers are not.
//
// Keep this header free of anything inline or templated (no standard
// library headers beyond <cstdint>): an inline function compiled in the
// AVX2 file could be the copy the linker keeps for every file, and then
// run on a CPU without AVX2. Call FusedF32Avx2 only where
// CpuHasAvx2() (block_kernels_portable.cc) is true.
#pragma once

#include <cstdint>

namespace tensorcheck::internal {

// What the fused fp32 kernel reports for one block.
struct FusedF32Summary {
  double abs, sq, aa, ee, ae;  // the block sums, as pass 1 adds them
  double bmax;                 // largest |a-e|
  // Some element fails an atol/rtol rule or may raise max_rel.
  bool may_fail_or_raise_rel;
  int64_t bit_equal;
  uint32_t max_ulp;
  uint64_t ulp_sum;    // exact when max_ulp < 2^24
  int64_t c0, c1, c2;  // distances 0, 1 and 2
};

// Passes 1 and 2 of FastBlock for fp32 tensors compared in fp32, fused so
// each block is read from memory once; n a multiple of 8. `rel0_shrunk` is
// the chunk's max_rel so far times kShrink.
void FusedF32Avx2(const float* a, const float* e, int64_t n, double atol, double rtol,
                  double rel0_shrunk, FusedF32Summary* out);

}  // namespace tensorcheck::internal
