// The device comparison's bit patterns (narrow_patterns.h), checked on the
// host, where they compile as plain C++: against the rank of every finite
// value of a 16-bit type in the sorted list of all of them (exhaustive), and
// for fp32 against counting std::nextafter steps; and against the shared
// rule they restate in 32-bit arithmetic (element_rules.h's
// DistanceFromBits), which the rank checks hold as well.
#include "server/backends/cuda/internal/narrow_patterns.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "server/stats/element_rules.h"

namespace tensorcheck::cuda::narrow {
namespace {

// The value of a 16-bit pattern, decoded from its fields (NaN for NaN).
double Value16(ElemType t, uint16_t bits) {
  if (t == ElemType::kBF16) {
    const uint32_t wide = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &wide, sizeof f);
    return f;
  }
  const int sign = bits >> 15, exponent = (bits >> 10) & 0x1f, mantissa = bits & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = mantissa == 0 ? std::numeric_limits<double>::infinity()
                      : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}

// Rank of each finite pattern among all finite values in increasing
// order, +0 and -0 sharing one: the ULP distance is the difference of ranks.
std::map<uint16_t, int64_t> Ranks(ElemType t) {
  std::vector<double> values;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const double v = Value16(t, static_cast<uint16_t>(b));
    if (std::isfinite(v)) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());  // -0 == +0
  std::map<uint16_t, int64_t> rank;
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const double v = Value16(t, static_cast<uint16_t>(b));
    if (!std::isfinite(v)) continue;
    rank[static_cast<uint16_t>(b)] =
        std::lower_bound(values.begin(), values.end(), v) - values.begin();
  }
  return rank;
}

template <ElemType kType>
void CheckDistances16() {
  const auto rank = Ranks(kType);
  const rules::BitLayout layout = rules::LayoutOf(kType);
  std::vector<uint16_t> finite;
  for (const auto& [bits, r] : rank) finite.push_back(bits);
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> any(0, finite.size() - 1);
  int64_t checked = 0;
  for (uint16_t a : finite) {
    // Near pairs (where close outputs are), the mirror, zeros, the extremes
    // and random partners.
    std::vector<uint16_t> partners = {
        a, static_cast<uint16_t>(a ^ 0x8000u), 0x0000, 0x8000, finite.front(), finite.back()};
    for (int k = 1; k <= 4; ++k) {
      partners.push_back(static_cast<uint16_t>(a + k));
      partners.push_back(static_cast<uint16_t>(a - k));
    }
    for (int k = 0; k < 8; ++k) partners.push_back(finite[any(rng)]);
    for (uint16_t b : partners) {
      const auto rb = rank.find(b);
      if (rb == rank.end()) continue;  // not finite
      const int64_t expected = std::llabs(rank.at(a) - rb->second);
      ASSERT_EQ(Distance<kType>(uint32_t{a} << 16, uint32_t{b} << 16), expected)
          << std::hex << a << " " << b;
      ASSERT_EQ(rules::DistanceFromBits(a, b, layout), static_cast<uint64_t>(expected))
          << std::hex << a << " " << b;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000000);
}

TEST(NarrowPatternsTest, Bf16DistanceIsTheRankDifference) { CheckDistances16<ElemType::kBF16>(); }

TEST(NarrowPatternsTest, Fp16DistanceIsTheRankDifference) { CheckDistances16<ElemType::kF16>(); }

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST(NarrowPatternsTest, Fp32DistanceCountsNextafterSteps) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  const float starts[] = {0.0f, -0.0f, tiny, -tiny, 1.0f, -1.0f, 1e-38f, -3.3e38f, 3.3e38f};
  for (float a : starts) {
    float b = a;
    for (uint32_t steps = 0; steps <= 300; ++steps) {
      ASSERT_EQ(Distance<ElemType::kF32>(Bits(a), Bits(b)), steps) << a << " " << b;
      ASSERT_EQ(Distance<ElemType::kF32>(Bits(b), Bits(a)), steps) << a << " " << b;
      const float next = std::nextafter(b, std::numeric_limits<float>::infinity());
      if (!std::isfinite(next)) break;
      b = next == 0.0f ? 0.0f : next;  // from -tiny, the next value is 0 (either sign)
    }
  }
}

TEST(NarrowPatternsTest, Fp32DistanceIsTheSharedRuleFarApart) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  const float max = std::numeric_limits<float>::max();
  std::vector<std::pair<float, float>> pairs = {{max, -max}, {-max, max}, {max, 0.0f}};
  for (int k = 0; k < 200000; ++k) {
    float a, b;
    const uint32_t ba = bits(rng), bb = bits(rng);
    std::memcpy(&a, &ba, sizeof a);
    std::memcpy(&b, &bb, sizeof b);
    if (std::isfinite(a) && std::isfinite(b)) pairs.emplace_back(a, b);
  }
  const rules::BitLayout layout = rules::LayoutOf(ElemType::kF32);
  for (const auto& [a, b] : pairs) {
    ASSERT_EQ(uint64_t{Distance<ElemType::kF32>(Bits(a), Bits(b))},
              rules::DistanceFromBits(Bits(a), Bits(b), layout))
        << a << " " << b;
  }
}

// The masks built from the shared layouts are the per-lane constants the
// kernels were tuned with.
TEST(NarrowPatternsTest, MasksAreTheSharedLayoutInEachLane) {
  static_assert(Layout<ElemType::kF32>::kMagnitudes == 0x7fffffffu);
  static_assert(Layout<ElemType::kF32>::kToTop == 0x00800000u);
  static_assert(Layout<ElemType::kF32>::kTops == 0x80000000u);
  static_assert(Layout<ElemType::kBF16>::kMagnitudes == 0x7fff7fffu);
  static_assert(Layout<ElemType::kBF16>::kToTop == 0x00800080u);
  static_assert(Layout<ElemType::kBF16>::kTops == 0x80008000u);
  static_assert(Layout<ElemType::kF16>::kMagnitudes == 0x7fff7fffu);
  static_assert(Layout<ElemType::kF16>::kToTop == 0x04000400u);
  static_assert(Layout<ElemType::kF16>::kTops == 0x80008000u);
  SUCCEED();
}

// A 16-byte vector holding these eight 16-bit patterns in memory order.
Vec16 Vector16(const uint16_t (&h)[8]) {
  Vec16 v;
  std::memcpy(&v, h, sizeof v);
  return v;
}

TEST(NarrowPatternsTest, WidenedTakesElementsInMemoryOrder) {
  const uint16_t h[8] = {0x0001, 0x8002, 0x7f80, 0xffff, 0x1234, 0x0000, 0x8000, 0x4321};
  const Vec16 v = Vector16(h);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(Widened<ElemType::kBF16>(v, j), uint32_t{h[j]} << 16) << j;
  }
  const float f[4] = {1.5f, -0.0f, 3e38f, -2e-45f};
  Vec16 w;
  std::memcpy(&w, f, sizeof w);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(Widened<ElemType::kF32>(w, j), Bits(f[j])) << j;
}

// Every 16-bit pattern, in every lane of either vector, among finite ones.
template <ElemType kType>
void CheckAllFinite16() {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const bool finite = std::isfinite(Value16(kType, static_cast<uint16_t>(p)));
    for (int lane = 0; lane < 16; ++lane) {
      uint16_t a[8] = {0x3c00, 0x8001, 0x0000, 0x7bff, 0xfbff, 0x8000, 0x0400, 0x1234};
      uint16_t e[8] = {0x0001, 0x3f80, 0x8000, 0x7b00, 0x4000, 0xc000, 0x0000, 0x7aff};
      (lane < 8 ? a[lane] : e[lane - 8]) = static_cast<uint16_t>(p);
      ASSERT_EQ(AllFinite<kType>(Vector16(a), Vector16(e)), finite)
          << std::hex << p << " in lane " << std::dec << lane;
    }
  }
}

TEST(NarrowPatternsTest, Bf16AllFiniteFindsEveryInfinityAndNaN) {
  CheckAllFinite16<ElemType::kBF16>();
}

TEST(NarrowPatternsTest, Fp16AllFiniteFindsEveryInfinityAndNaN) {
  CheckAllFinite16<ElemType::kF16>();
}

TEST(NarrowPatternsTest, Fp32AllFiniteFindsEveryInfinityAndNaN) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7fffff);
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (int k = 0; k < 64; ++k) {
        const uint32_t m = k == 0 ? 0 : k == 1 ? 0x7fffff : mantissa(rng);
        const uint32_t p = (sign << 31) | (exponent << 23) | m;
        float f;
        std::memcpy(&f, &p, sizeof f);
        for (int lane = 0; lane < 8; ++lane) {
          float a[4] = {1.0f, -2.0f, 0.0f, 3e38f}, e[4] = {-0.0f, 1e-45f, -1e-38f, 7.0f};
          (lane < 4 ? a[lane] : e[lane - 4]) = f;
          Vec16 va, ve;
          std::memcpy(&va, a, sizeof va);
          std::memcpy(&ve, e, sizeof ve);
          ASSERT_EQ(AllFinite<ElemType::kF32>(va, ve), std::isfinite(f)) << std::hex << p;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tensorcheck::cuda::narrow
