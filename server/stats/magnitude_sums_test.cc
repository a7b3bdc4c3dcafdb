#include "server/stats/magnitude_sums.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "server/stats/blas_gemm.h"
#include "tests/testing/blas_probe.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;

// [rows, cols] normal values, stored as fp32, and as doubles for the loops.
struct Values {
  std::vector<double> v;
  Tensor t;
};
Values Normal(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Values out;
  for (int64_t i = 0; i < rows * cols; ++i) {
    out.v.push_back(static_cast<float>(normal(rng)));
  }
  out.t = *FromDoubles(DType::kFloat32, {rows, cols}, out.v);
  return out;
}

TEST(ComputeMagnitudeSumsTest, MatchesNaiveLoopInBothLayouts) {
  const int64_t m = 4, n = 6, k = 50;
  const Values x = Normal(m, k, 9), w = Normal(n, k, 10);
  // The same weight stored [k, n] for IN_OUT.
  std::vector<double> wt(static_cast<size_t>(k * n));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t kk = 0; kk < k; ++kk) wt[kk * n + j] = w.v[j * k + kk];
  }
  const Tensor w_in_out = *FromDoubles(DType::kFloat32, {k, n}, wt);
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    SCOPED_TRACE(WeightLayoutName(layout));
    const MagnitudeOperands op{
        {m, n, k, layout}, &x.t, layout == WeightLayout::kOutIn ? &w.t : &w_in_out};
    std::vector<float> abs_dot(static_cast<size_t>(m * n));
    std::vector<float> sq_dot(abs_dot.size()), dot(abs_dot.size());
    ASSERT_THAT(ComputeMagnitudeSums(op, abs_dot.data(), sq_dot.data(), dot.data()), IsOk());
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double a = 0.0, s = 0.0, d = 0.0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double p = x.v[i * k + kk] * w.v[j * k + kk];
          a += std::fabs(p);
          s += p * p;
          d += p;
        }
        EXPECT_NEAR(abs_dot[i * n + j], a, 1e-5 * a);
        EXPECT_NEAR(sq_dot[i * n + j], std::sqrt(s), 1e-5 * std::sqrt(s));
        EXPECT_NEAR(dot[i * n + j], d, 1e-5 * a);
      }
    }
  }
}

// FP8 operands: the sums of the dequantised values x_q s_x[i] and
// w_q s_w[j], from fp64 loops over the decoded FP8 values.
TEST(ComputeMagnitudeSumsTest, Fp8OperandsAreSummedDequantised) {
  const int64_t m = 3, n = 2, k = 40;
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> pattern(0, 0xfe);
  auto fp8 = [&](int64_t count) {
    std::string bytes(static_cast<size_t>(count), '\0');
    for (char& b : bytes) b = static_cast<char>(pattern(rng) & 0xf7);  // no NaN (0x7f, 0xff)
    return *Tensor::FromBytes(DType::kFloat8E4M3Fn, {count / k, k}, bytes);
  };
  const Tensor x = fp8(m * k), w = fp8(n * k);
  const Tensor sx = *FromDoubles(DType::kFloat32, {m}, std::vector<double>{0.5, -0.25, 2.0});
  const Tensor sw = *FromDoubles(DType::kFloat32, {1}, std::vector<double>{0.125});
  MagnitudeOperands op{{m, n, k, WeightLayout::kOutIn}, &x, &w};
  op.input_scale = &sx;
  op.weight_scale = &sw;
  std::vector<float> abs_dot(static_cast<size_t>(m * n)), sq_dot(abs_dot.size()),
      dot(abs_dot.size());
  ASSERT_THAT(ComputeMagnitudeSums(op, abs_dot.data(), sq_dot.data(), dot.data()), IsOk());
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double a = 0.0, s = 0.0, d = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p =
            x.GetDouble(i * k + kk) * sx.GetDouble(i) * w.GetDouble(j * k + kk) * 0.125;
        a += std::fabs(p);
        s += p * p;
        d += p;
      }
      const size_t e = static_cast<size_t>(i * n + j);
      EXPECT_NEAR(abs_dot[e], a, a * 1e-5);
      EXPECT_NEAR(sq_dot[e], std::sqrt(s), std::sqrt(s) * 1e-5);
      EXPECT_NEAR(dot[e], d, a * 1e-5);
    }
  }
}

TEST(ComputeMagnitudeSumsTest, NullOutputIsInvalidArgument) {
  const Values x = Normal(1, 1, 1), w = Normal(1, 1, 2);
  float one = 0.0f;
  EXPECT_THAT(ComputeMagnitudeSums(MagnitudeOperands{{1, 1, 1, WeightLayout::kOutIn}, &x.t, &w.t},
                                   nullptr, &one),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ComputeMagnitudeSumsTest, OnlyTheAskedSumsAreWritten) {
  const Values x = Normal(2, 3, 3), w = Normal(2, 3, 4);
  std::vector<float> sq(4, -1.0f);
  ASSERT_THAT(ComputeMagnitudeSums(MagnitudeOperands{{2, 2, 3, WeightLayout::kOutIn}, &x.t, &w.t},
                                   MagnitudeSums{nullptr, sq.data(), nullptr}),
              IsOk());
  for (float v : sq) EXPECT_GT(v, 0.0f);
}

TEST(ComputeMagnitudeSumsTest, MismatchedShapesAreInvalidArgument) {
  const Values x = Normal(2, 3, 5), w = Normal(2, 4, 6);
  std::vector<float> a(4), s(4);
  EXPECT_THAT(ComputeMagnitudeSums(MagnitudeOperands{{2, 2, 3, WeightLayout::kOutIn}, &x.t, &w.t},
                                   a.data(), s.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Large weights: blocks along N (stats/blas_gemm.h).

// values [rows, cols] stored [cols, rows]: the same weight for IN_OUT.
Tensor TransposedTensor(const Values& w, int64_t rows, int64_t cols, DType dtype) {
  std::vector<double> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = w.v[r * cols + c];
  }
  return *FromDoubles(dtype, {cols, rows}, t);
}

struct Sums {
  std::vector<float> abs_dot, sq_dot, dot;
};

Sums MustSum(const MagnitudeOperands& op) {
  Sums s;
  const size_t mn = static_cast<size_t>(op.m * op.n);
  s.abs_dot.assign(mn, -1.0f);
  s.sq_dot.assign(mn, -1.0f);
  s.dot.assign(mn, -1.0f);
  EXPECT_THAT(ComputeMagnitudeSums(op, s.abs_dot.data(), s.sq_dot.data(), s.dot.data()), IsOk());
  return s;
}

double MaxAbs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, std::fabs(double(v)));
  return m;
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// Largest |a - b| / |b| (elements with b = 0 compare by |a|).
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - b[i]);
    m = std::max(m, b[i] != 0 ? d / std::fabs(double(b[i])) : d);
  }
  return m;
}

int64_t BitsDiffer(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t differ = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  }
  return differ;
}

TEST(WeightBlocksTest, LlamaLmHeadBlocksAsComputedByHand) {
  // [128256, 8192] at m = 4. fp32: 32 MiB / (8192 * 4 B) = 1024 columns,
  // 128256 / 1024 = 125.25: 125 blocks, the last 128256 - 124 * 1024 = 1280
  // columns. fp64: 512 columns, 250 blocks, the last 128256 - 249 * 512 = 768.
  const WeightBlocks f = PlanWeightBlocks(4, 128256, 8192, 4);
  EXPECT_EQ(f.columns, 1024);
  EXPECT_EQ(f.count, 125);
  EXPECT_EQ(f.columns_of(124), 1280);
  EXPECT_EQ(f.padded_columns, 1280);
  const WeightBlocks d = PlanWeightBlocks(4, 128256, 8192, 8);
  EXPECT_EQ(d.columns, 512);
  EXPECT_EQ(d.count, 250);
  EXPECT_EQ(d.columns_of(249), 768);
  EXPECT_EQ(d.padded_columns, 768);
}

TEST(WeightBlocksTest, BlocksCoverEveryColumnOnceWithinTheBounds) {
  for (const int64_t m : {1, 4, 33, 5000}) {
    for (const int64_t n : {1, 63, 64, 1000, 128256}) {
      for (const int64_t k : {1, 64, 8192, 1 << 20}) {
        for (const int64_t bytes : {4, 8}) {
          for (const bool blas : {true, false}) {
            SCOPED_TRACE(::testing::Message()
                         << m << " " << n << " " << k << " " << bytes << " " << blas);
            const WeightBlocks b = PlanWeightBlocks(m, n, k, bytes, 0, blas);
            ASSERT_GE(b.count, 1);
            int64_t next = 0, widest = 0;
            for (int64_t i = 0; i < b.count; ++i) {
              EXPECT_EQ(b.begin(i), next);
              EXPECT_GE(b.columns_of(i), 1);
              if (i + 1 < b.count) {
                EXPECT_EQ(b.columns_of(i), b.columns);
              }
              next += b.columns_of(i);
              widest = std::max(widest, b.columns_of(i));
            }
            EXPECT_EQ(next, n);
            EXPECT_LT(widest, 2 * b.columns);
            if (b.count > 1) {
              if (blas) {
                // Aligned, and never small enough for OpenBLAS's other kernels.
                EXPECT_EQ(b.columns % kWeightBlockAlign, 0);
                EXPECT_GE(m * b.columns * k, kWeightBlockMinMacs);
              }
              // A regular block and its product within 64 MiB (32 MiB, or
              // 2^23 multiply-adds' worth: at most 2^23 * 8 B / min(m, k)),
              // but for the alignment; the last within twice that.
              const int64_t align = blas ? kWeightBlockAlign : 1;
              EXPECT_LE((b.columns - align) * std::max(k, m) * bytes, int64_t{64} << 20);
            }
          }
        }
      }
    }
  }
}

TEST(ComputeMagnitudeSumsTest, TinyBlocksGiveTheUnblockedSumsBitForBit) {
  // Blocks of the least width the plan allows (64 columns at m = 16, k =
  // 8192: 3 blocks, the last 101 columns), in both layouts, from fp32 and
  // bf16 storage, against a single block of the whole weight.
  const int64_t m = 16, n = 229, k = 8192;
  ASSERT_EQ(PlanWeightBlocks(m, n, k, sizeof(float), /*columns=*/5).count, 3);
  ASSERT_EQ(PlanWeightBlocks(m, n, k, sizeof(float), /*columns=*/int64_t{1} << 40).count, 1);
  const Values x = Normal(m, k, 21), w32 = Normal(n, k, 22);
  // Bit for bit where this machine's OpenBLAS allows (tests/testing/blas_probe.h).
  const bool invariant = ::tensorcheck::testing::BlasIsBlockInvariant(m, n, k);
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor xt = *FromDoubles(dtype, {m, k}, x.v);
    const Tensor out_in = *FromDoubles(dtype, {n, k}, w32.v);
    const Tensor in_out = TransposedTensor(w32, n, k, dtype);
    for (const WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " " << WeightLayoutName(layout));
      MagnitudeOperands op{
          {m, n, k, layout}, &xt, layout == WeightLayout::kOutIn ? &out_in : &in_out};
      op.block_columns = int64_t{1} << 40;
      const Sums want = MustSum(op);
      op.block_columns = 5;
      const Sums got = MustSum(op);
      if (invariant) {
        EXPECT_EQ(BitsDiffer(got.abs_dot, want.abs_dot), 0);
        EXPECT_EQ(BitsDiffer(got.sq_dot, want.sq_dot), 0);
        EXPECT_EQ(BitsDiffer(got.dot, want.dot), 0);
      } else {
        // This OpenBLAS sums by call width: summation-order noise only.
        EXPECT_LE(MaxRelDiff(got.abs_dot, want.abs_dot), 1e-4);
        EXPECT_LE(MaxRelDiff(got.sq_dot, want.sq_dot), 1e-4);
        EXPECT_LE(MaxAbsDiff(got.dot, want.dot), 1e-4 * MaxAbs(want.abs_dot));
      }
    }
  }
}

TEST(ComputeMagnitudeSumsTest, BlockedSumsMatchNaiveLoop) {
  // Three blocks by default's rules at a width of 64 columns, IN_OUT (the
  // layout whose blocks are gathered row by row), against fp64 loops.
  const int64_t m = 16, n = 229, k = 8192;
  const Values x = Normal(m, k, 23), w = Normal(n, k, 24);
  const Tensor in_out = TransposedTensor(w, n, k, DType::kFloat32);
  MagnitudeOperands op{{m, n, k, WeightLayout::kInOut}, &x.t, &in_out};
  op.block_columns = 64;
  const Sums got = MustSum(op);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double a = 0.0, s = 0.0, d = 0.0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = x.v[i * k + kk] * w.v[j * k + kk];
        a += std::fabs(p);
        s += p * p;
        d += p;
      }
      ASSERT_NEAR(got.abs_dot[i * n + j], a, 1e-5 * a) << i << " " << j;
      ASSERT_NEAR(got.sq_dot[i * n + j], std::sqrt(s), 1e-5 * std::sqrt(s)) << i << " " << j;
      ASSERT_NEAR(got.dot[i * n + j], d, 1e-5 * a) << i << " " << j;
    }
  }
}

TEST(ComputeMagnitudeSumsTest, StopBeforeABlockIsReturned) {
  const Values x = Normal(16, 8192, 25), w = Normal(229, 8192, 26);
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kClientCancelled);
  MagnitudeOperands op{{16, 229, 8192, WeightLayout::kOutIn}, &x.t, &w.t, &stop};
  op.block_columns = 5;
  std::vector<float> a(16 * 229), s(16 * 229);
  EXPECT_THAT(ComputeMagnitudeSums(op, a.data(), s.data()), StatusIs(absl::StatusCode::kCancelled));
}

}  // namespace
}  // namespace tensorcheck
