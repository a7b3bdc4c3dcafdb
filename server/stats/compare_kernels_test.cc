// Compare's kernels and its split into chunks: the fused AVX2, portable
// and element-by-element kernels and every executor give bitwise the same
// statistics.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "core/executor.h"
#include "core/float_formats.h"
#include "server/stats/diff_stats.h"
#include "server/stats/internal/block_kernels.h"
#include "tests/testing/compare_testing.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::Cmp;
using ::tensorcheck::testing::F32;
using ::tensorcheck::testing::Fp32Ulps;
using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::Opts;
using ::tensorcheck::testing::Pool;

constexpr float kInfF = std::numeric_limits<float>::infinity();
constexpr float kNanF = std::numeric_limits<float>::quiet_NaN();

// Testing only (internal/block_kernels.h): 0 production, 1 without the
// fused AVX2 fp32 kernel, 2 every block element by element.
class KernelModeScope {
 public:
  explicit KernelModeScope(int mode) { internal::SetCompareKernelForTesting(mode); }
  ~KernelModeScope() { internal::SetCompareKernelForTesting(0); }
};

uint64_t Bits64(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// Every field, doubles by bit pattern.
void ExpectBitwiseSameStats(const DiffStats& x, const DiffStats& y) {
  EXPECT_EQ(x.total, y.total);
  EXPECT_EQ(x.finite, y.finite);
  EXPECT_EQ(x.mismatched, y.mismatched);
  EXPECT_EQ(Bits64(x.max_abs), Bits64(y.max_abs));
  EXPECT_EQ(x.max_abs_index, y.max_abs_index);
  EXPECT_EQ(Bits64(x.max_rel), Bits64(y.max_rel));
  EXPECT_EQ(x.max_rel_index, y.max_rel_index);
  EXPECT_EQ(Bits64(x.mean_abs), Bits64(y.mean_abs));
  EXPECT_EQ(Bits64(x.rms), Bits64(y.rms));
  EXPECT_EQ(Bits64(x.rel_l2), Bits64(y.rel_l2));
  EXPECT_EQ(Bits64(x.cosine), Bits64(y.cosine));
  EXPECT_EQ(x.max_ulp, y.max_ulp);
  EXPECT_EQ(Bits64(x.mean_ulp), Bits64(y.mean_ulp));
  ASSERT_EQ(x.ulp_histogram.size(), y.ulp_histogram.size());
  for (size_t k = 0; k < x.ulp_histogram.size(); ++k) {
    EXPECT_EQ(x.ulp_histogram[k].lo, y.ulp_histogram[k].lo);
    EXPECT_EQ(x.ulp_histogram[k].hi, y.ulp_histogram[k].hi);
    EXPECT_EQ(x.ulp_histogram[k].count, y.ulp_histogram[k].count);
  }
  EXPECT_EQ(x.bitwise_equal, y.bitwise_equal);
  EXPECT_EQ(x.bitwise_equal_count, y.bitwise_equal_count);
  EXPECT_EQ(x.nan_actual, y.nan_actual);
  EXPECT_EQ(x.nan_expected, y.nan_expected);
  EXPECT_EQ(x.inf_actual, y.inf_actual);
  EXPECT_EQ(x.inf_expected, y.inf_expected);
  EXPECT_EQ(x.nan_mismatch, y.nan_mismatch);
  ASSERT_EQ(x.worst.size(), y.worst.size());
  for (size_t k = 0; k < x.worst.size(); ++k) {
    const ElementDiff& p = x.worst[k];
    const ElementDiff& q = y.worst[k];
    EXPECT_EQ(p.flat_index, q.flat_index) << k;
    EXPECT_EQ(Bits64(p.actual), Bits64(q.actual)) << k;
    EXPECT_EQ(Bits64(p.expected), Bits64(q.expected)) << k;
    EXPECT_EQ(p.actual_bits, q.actual_bits) << k;
    EXPECT_EQ(p.expected_bits, q.expected_bits) << k;
    EXPECT_EQ(Bits64(p.abs_diff), Bits64(q.abs_diff)) << k;
    EXPECT_EQ(Bits64(p.rel_diff), Bits64(q.rel_diff)) << k;
    EXPECT_EQ(p.ulp, q.ulp) << k;
  }
  for (auto [gx, gy] :
       {std::make_pair(&x.top_columns, &y.top_columns), std::make_pair(&x.top_rows, &y.top_rows)}) {
    ASSERT_EQ(gx->size(), gy->size());
    for (size_t k = 0; k < gx->size(); ++k) {
      EXPECT_EQ((*gx)[k].index, (*gy)[k].index);
      EXPECT_EQ((*gx)[k].mismatched, (*gy)[k].mismatched);
      EXPECT_EQ(Bits64((*gx)[k].share), Bits64((*gy)[k].share));
    }
  }
  ASSERT_EQ(x.bound_ratio.has_value(), y.bound_ratio.has_value());
  if (x.bound_ratio) {
    EXPECT_EQ(Bits64(*x.bound_ratio), Bits64(*y.bound_ratio));
  }
  EXPECT_EQ(x.compared_dtype, y.compared_dtype);
  EXPECT_EQ(x.passed, y.passed);
}

TEST(CompareTest, MultithreadedResultIsIdenticalToOneThreadOn1e6Elements) {
  const int64_t n = 1000000;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ulps(-40, 40);
  std::vector<float> a(n), e(n), sigma(n);
  for (int64_t i = 0; i < n; ++i) {
    e[i] = normal(rng);
    a[i] = Fp32Ulps(e[i], ulps(rng));
    sigma[i] = 1e-6f;
  }
  a[12345] = kNanF;
  e[777777] = kInfF;
  a[999] = -kInfF;
  CompareOptions o = Opts();
  o.cols = 1000;
  o.top_k = 20;
  o.predicted_sigma = sigma.data();
  o.executor = nullptr;  // on this thread
  DiffStats one = Cmp(F32(a), F32(e), o);
  EXPECT_GT(one.mismatched, 0);
  EXPECT_EQ(one.worst.size(), 20u);
  for (int threads : {2, 3, 7}) {
    SCOPED_TRACE(threads);
    o.executor = Pool(threads);
    ExpectBitwiseSameStats(one, Cmp(F32(a), F32(e), o));
  }
}

TEST(CompareTest, ConcurrentComparesSharingOneExecutorMatchTheInlineResult) {
  // Requests share the server's one statistics pool: three callers at once,
  // each with its own data, get what each gets alone on its own thread.
  const int64_t n = 300000;
  std::vector<std::vector<float>> a(3, std::vector<float>(n)), e(3, std::vector<float>(n));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ulps(-300, 300);
  for (int c = 0; c < 3; ++c) {
    for (int64_t i = 0; i < n; ++i) {
      e[c][i] = normal(rng);
      a[c][i] = Fp32Ulps(e[c][i], ulps(rng) * (c + 1));
    }
  }
  CompareOptions o = Opts();
  o.cols = 600;
  o.top_k = 12;
  std::vector<DiffStats> alone(3), shared(3);
  for (int c = 0; c < 3; ++c) alone[c] = Cmp(F32(a[c]), F32(e[c]), o);
  o.executor = Pool(2);
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 4; ++round) shared[c] = Cmp(F32(a[c]), F32(e[c]), o);
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < 3; ++c) {
    SCOPED_TRACE(c);
    EXPECT_GT(alone[c].mismatched, 0);
    ExpectBitwiseSameStats(alone[c], shared[c]);
  }
}

// fp32 data whose 1024-element blocks take every path: close values (ULP
// distances <= 4), wider and huge distances, values across zero, ±0,
// subnormals, zero references, and blocks with a NaN or infinity; the
// length leaves a partial last block.
void MixedFp32Data(uint32_t seed, std::vector<float>& a, std::vector<float>& e) {
  const int64_t n = 1024 * 48 + 13;
  a.resize(n);
  e.resize(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> kind_of(0, 7);
  std::uniform_int_distribution<int> small(-4, 4), wide(-3000, 3000);
  std::uniform_int_distribution<uint32_t> any_bits(0, 0xffffffffu);
  std::uniform_int_distribution<int> pick(0, 1023);
  for (int64_t b = 0; b * 1024 < n; ++b) {
    const int kind = kind_of(rng);
    const int64_t end = std::min<int64_t>(n, (b + 1) * 1024);
    for (int64_t i = b * 1024; i < end; ++i) {
      float x = normal(rng);
      float y;
      switch (kind) {
        case 0:
        case 1:
          y = Fp32Ulps(x, small(rng));
          break;
        case 2:
          y = Fp32Ulps(x, wide(rng));
          break;
        case 3:  // independent values: huge distances, signs differ
          y = normal(rng);
          break;
        case 4: {  // subnormals and zeros of both signs
          const float tiny[] = {0.0f,      -0.0f,      0x1p-149f,  -0x1p-149f,
                                0x1p-140f, -0x1p-127f, 0x1.8p-126f};
          x = tiny[pick(rng) % 7];
          y = tiny[pick(rng) % 7];
          break;
        }
        case 5:  // any finite bit patterns, some zero references
          do {
            x = BitsToFloat(any_bits(rng));
          } while (!std::isfinite(x));
          do {
            y = BitsToFloat(any_bits(rng));
          } while (!std::isfinite(y));
          if (i % 5 == 0) y = 0.0f;
          break;
        default:
          y = Fp32Ulps(x, small(rng));
          if (i % 7 == 0) y = 0.0f;
          break;
      }
      a[i] = y;
      e[i] = x;
    }
    if (kind == 7) {  // a non-finite value somewhere in the block
      const int64_t i = std::min<int64_t>(end - 1, b * 1024 + pick(rng));
      const float specials[] = {kNanF, kInfF, -kInfF};
      (pick(rng) % 2 ? a : e)[i] = specials[pick(rng) % 3];
    }
  }
}

TEST(CompareTest, FusedFp32KernelIsBitwiseIdenticalToPortableAndSlowPaths) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::vector<float> a, e;
    MixedFp32Data(seed, a, e);
    const int64_t n = static_cast<int64_t>(a.size());
    std::vector<float> sigma(n), bound(n);
    for (int64_t i = 0; i < n; ++i) {
      sigma[i] = i % 97 == 0 ? kInfF : 1e-6f * static_cast<float>(1 + i % 5);
      bound[i] = 1e-6f * static_cast<float>(1 + i % 3);
    }
    const Tensor ta = F32(a), te = F32(e);
    for (TolerancePreset preset : {TolerancePreset::kTorch, TolerancePreset::kPolygraphy,
                                   TolerancePreset::kUlp, TolerancePreset::kBound}) {
      SCOPED_TRACE(::testing::Message()
                   << "seed " << seed << " preset " << TolerancePresetName(preset));
      CompareOptions o = Opts();
      o.tolerance =
          ResolveTolerance(preset, DType::kFloat32, std::nullopt, std::nullopt, /*max_ulp=*/2,
                           /*bound_factor=*/1.0,
                           /*nan_equal=*/seed == 2);
      o.cols = n;  // one row; odd columns stay meaningful
      o.top_k = 25;
      o.top_groups = 7;
      o.predicted_sigma = seed == 3 ? nullptr : sigma.data();
      o.error_bound = bound.data();
      o.executor = nullptr;  // on this thread
      DiffStats portable, slow;
      {
        KernelModeScope mode(1);
        portable = Cmp(ta, te, o);
      }
      {
        KernelModeScope mode(2);
        slow = Cmp(ta, te, o);
      }
      ASSERT_GT(portable.mismatched, 0);
      // The slow path adds each block's sums in one lane instead of four:
      // the sums may differ in the last bits, everything else is exact.
      EXPECT_NEAR(slow.mean_abs, portable.mean_abs, 1e-12 * portable.mean_abs);
      EXPECT_NEAR(slow.rms, portable.rms, 1e-12 * portable.rms);
      EXPECT_NEAR(slow.cosine, portable.cosine, 1e-12);
      slow.mean_abs = portable.mean_abs;
      slow.rms = portable.rms;
      slow.rel_l2 = portable.rel_l2;
      slow.cosine = portable.cosine;
      slow.bound_ratio = portable.bound_ratio;
      ExpectBitwiseSameStats(portable, slow);
      for (int threads : {1, 2, 3, 5}) {
        SCOPED_TRACE(threads);
        o.executor = Pool(threads);
        ExpectBitwiseSameStats(portable, Cmp(ta, te, o));
      }
    }
  }
}

TEST(CompareTest, FusedFp32KernelMatchesPortableOnCloseData) {
  // The common case: every block finite with distances <= 4, so the
  // ordered pass is mostly skipped; rows of 4096 split across chunks.
  const int64_t n = 1 << 20;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> ulps(-3, 3);
  std::vector<float> a(n), e(n);
  for (int64_t i = 0; i < n; ++i) {
    e[i] = normal(rng);
    a[i] = Fp32Ulps(e[i], ulps(rng));
  }
  a[n / 3] = Fp32Ulps(e[n / 3], 4000);  // one far element, one mismatch
  const Tensor ta = F32(a), te = F32(e);
  CompareOptions o = Opts();
  o.cols = 4096;
  o.executor = nullptr;  // on this thread
  DiffStats portable;
  {
    KernelModeScope mode(1);
    portable = Cmp(ta, te, o);
  }
  EXPECT_EQ(portable.max_abs_index, n / 3);
  for (int threads : {1, 2, 4}) {
    SCOPED_TRACE(threads);
    o.executor = Pool(threads);
    ExpectBitwiseSameStats(portable, Cmp(ta, te, o));
  }
}

}  // namespace
}  // namespace tensorcheck
