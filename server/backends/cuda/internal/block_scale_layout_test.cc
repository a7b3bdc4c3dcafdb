// cuBLASLt's block-scale layouts and the TN forms of block-scaled operands
// (block_scale_layout.h), on the host. Expected layouts are written out by
// hand from the rules the header quotes (NVIDIA's sample sizes; the
// swizzle's (r % 32) * 16 + (r / 32) * 4 + c within a tile); expected
// quantised values from the recipes' definitions in docs/numerics.md.
#include "server/backends/cuda/internal/block_scale_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/float_formats.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cuda::internal {
namespace {

using ::tensorcheck::testing::IsOk;
using ::testing::Each;
using ::testing::ElementsAre;

LayerShape Shape(int64_t m, int64_t n, int64_t k, WeightLayout layout = WeightLayout::kOutIn) {
  return LayerShape{m, n, k, layout, Activation::kNone, DType::kBFloat16};
}

TEST(BlockScaleLayout, Vec128PutsTheOuterDimensionFastest) {
  const float plain[] = {1, 2, 3, 4, 5, 6};  // [m = 3, s = 2]
  EXPECT_THAT(Vec128Scales(plain, 3, 2), ElementsAre(1, 3, 5, 2, 4, 6));
}

TEST(BlockScaleLayout, Blk128x128PadsEachColumnOfKBlocksToFour) {
  const float out_in[] = {1, 2, 3, 4, 5, 6};  // [nb = 2, s = 3]
  EXPECT_THAT(Blk128x128Scales(out_in, 2, 3, false), ElementsAre(1, 2, 3, 0, 4, 5, 6, 0));
  const float in_out[] = {1, 4, 2, 5, 3, 6};  // the same scales as [s = 3, nb = 2]
  EXPECT_THAT(Blk128x128Scales(in_out, 2, 3, true), ElementsAre(1, 2, 3, 0, 4, 5, 6, 0));
  EXPECT_EQ(Blk128x128Stride(300), 4);  // ceil(300 / 128) = 3
  EXPECT_EQ(Blk128x128Stride(640), 8);  // 5
}

TEST(BlockScaleLayout, SwizzledScalesOfATransposedPlainScaleAreTheSame) {
  const uint8_t rows_first[] = {10, 11, 20, 21, 30, 31};  // [3, 2]
  const uint8_t cols_first[] = {10, 20, 30, 11, 21, 31};  // [2, 3]
  for (const auto& [plain, transposed] :
       {std::pair<const uint8_t*, bool>{rows_first, false}, {cols_first, true}}) {
    absl::StatusOr<std::vector<uint8_t>> s = SwizzledBlockScales(plain, 3, 2, transposed);
    ASSERT_THAT(s, IsOk());
    ASSERT_EQ(s->size(), 512u);  // one 128 x 4 tile
    std::vector<uint8_t> want(512, 0);
    want[0] = 10;
    want[1] = 11;
    want[16] = 20;
    want[17] = 21;
    want[32] = 30;
    want[33] = 31;
    EXPECT_EQ(*s, want);
  }
}

TEST(BlockScaleLayout, TransposeFp4MovesNibbles) {
  // [2, 4]: row 0 codes 1 2 3 4, row 1 codes 5 6 7 8, low nibble first.
  const uint8_t packed[] = {0x21, 0x43, 0x65, 0x87};
  // [4, 2]: 1 5 / 2 6 / 3 7 / 4 8.
  EXPECT_THAT(TransposeFp4(packed, 2, 4), ElementsAre(0x51, 0x62, 0x73, 0x84));
}

TEST(BlockScaleLayout, ScaleSpecsCountWhatEachModeReads) {
  const LayerShape s = Shape(6, 300, 300);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kTensor, false, s).count, 1);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kOuterVector, true, s).count, 300);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kBlock128, false, s).count, 3 * 6);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kBlock128, true, s).count, 3 * 4);
  const LayerShape mx = Shape(6, 300, 64);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kMxVec32, false, mx).count, 128 * 4);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kMxVec32, true, mx).count, 384 * 4);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kMxVec32, true, mx).dtype, DType::kFloat8E8M0Fnu);
  EXPECT_EQ(LtScaleSpecOf(Fp8ScaleMode::kNvVec16, false, mx).dtype, DType::kFloat8E4M3Fn);
}

TEST(BlockScaleLayout, PlainScalesOfTheWrongSizeAreInvalidArgument) {
  Tensor plain = *Tensor::Create(DType::kFloat32, {5});
  EXPECT_FALSE(LtBlockScales(plain, Fp8ScaleMode::kBlock128, false, Shape(3, 8, 256)).ok());
  Tensor codes = *Tensor::Create(DType::kFloat32, {3, 2});
  EXPECT_FALSE(LtBlockScales(codes, Fp8ScaleMode::kMxVec32, false, Shape(3, 8, 64)).ok());
}

TEST(BlockScaleLayout, WideInputUnderBlock128IsQuantisedPerSliceAndLaidOutVec128) {
  // x [2, 256] all ones: amax 1 per 1 x 128 block, s = 448, q = 448 (0x7e),
  // the dequantisation scale fl32(1 / 448).
  Tensor x = *Tensor::Create(DType::kFloat32, {2, 256});
  for (int i = 0; i < 512; ++i) x.data<float>()[i] = 1.0f;
  Fp8Gemm gemm;
  gemm.scale_mode = Fp8ScaleMode::kBlock128;
  absl::StatusOr<LtOperand> q = QuantiseForLt(x, false, Shape(2, 8, 256), Config{}, gemm);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->values.dtype(), DType::kFloat8E4M3Fn);
  ASSERT_EQ(q->values.numel(), 512);
  for (int i = 0; i < 512; ++i) ASSERT_EQ(q->values.data<uint8_t>()[i], 0x7e) << i;
  ASSERT_EQ(q->scales.numel(), 4);
  const float s = static_cast<float>(1.0 / 448.0);
  EXPECT_THAT(std::vector<float>(q->scales.data<float>(), q->scales.data<float>() + 4), Each(s));
}

TEST(BlockScaleLayout, InOutNvfp4WeightIsTransposedPackedAndSwizzled) {
  // W [k = 32, n = 2] all 6: amax 6, S_enc = 2688 / 6 = 448, global scale
  // fl32(1 / 448); each block's scale e4m3(6 * 448 / 6) = 448 (0x7e); codes
  // e2m1(6 / (448 / 448)) = 6 (0x7), packed 0x77.
  Tensor w = *Tensor::Create(DType::kFloat32, {32, 2});
  for (int i = 0; i < 64; ++i) w.data<float>()[i] = 6.0f;
  Fp8Gemm gemm;
  gemm.a = gemm.b = DType::kFloat4E2M1Fn;
  gemm.scale_mode = Fp8ScaleMode::kNvVec16;
  absl::StatusOr<LtOperand> q =
      QuantiseForLt(w, true, Shape(4, 2, 32, WeightLayout::kInOut), Config{}, gemm);
  ASSERT_THAT(q, IsOk());
  EXPECT_EQ(q->global_scale, static_cast<float>(1.0 / 448.0));
  EXPECT_EQ(q->values.dtype(), DType::kFloat4E2M1Fn);
  EXPECT_EQ(q->values.numel(), 64);
  ASSERT_EQ(q->values.nbytes(), 32u);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(q->values.data<uint8_t>()[i], 0x77) << i;
  // [n = 2, k / 16 = 2] swizzled: (0,0) 0, (0,1) 1, (1,0) 16, (1,1) 17.
  ASSERT_EQ(q->scales.numel(), 512);
  std::vector<uint8_t> want(512, 0);
  want[0] = want[1] = want[16] = want[17] = 0x7e;
  EXPECT_EQ(std::vector<uint8_t>(q->scales.data<uint8_t>(), q->scales.data<uint8_t>() + 512), want);
}

TEST(BlockScaleLayout, GivenMxfp8ScalesOfAnInOutWeightAreTransposedThenSwizzled) {
  // Plain IN_OUT [k / 32 = 2, n = 3] codes; the swizzle reads [n, k / 32].
  Tensor plain = *Tensor::Create(DType::kFloat8E8M0Fnu, {2, 3});
  const uint8_t v[] = {1, 2, 3, 4, 5, 6};  // (c, j): c * 3 + j
  for (int i = 0; i < 6; ++i) plain.data<uint8_t>()[i] = v[i];
  absl::StatusOr<Tensor> s =
      LtBlockScales(plain, Fp8ScaleMode::kMxVec32, true, Shape(4, 3, 64, WeightLayout::kInOut));
  ASSERT_THAT(s, IsOk());
  ASSERT_EQ(s->numel(), 512);
  const uint8_t* b = s->data<uint8_t>();
  // (j, c) at j * 16 + c: (0,0)=1 (0,1)=4 (1,0)=2 (1,1)=5 (2,0)=3 (2,1)=6.
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 4);
  EXPECT_EQ(b[16], 2);
  EXPECT_EQ(b[17], 5);
  EXPECT_EQ(b[32], 3);
  EXPECT_EQ(b[33], 6);
}

}  // namespace
}  // namespace tensorcheck::cuda::internal
