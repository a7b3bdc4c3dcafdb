// The host equivalents of the device intrinsics (device_intrinsics.h), on
// values whose 16-bit patterns are derived by hand: ties to even, one
// rounding from double (where rounding through float first would differ),
// subnormals, overflow, and NaN as CUDA's host code writes it. On the
// device the intrinsics themselves run; DeviceStatsTest compares the two
// paths' statistics on a GPU.
#include "server/backends/cuda/internal/device_intrinsics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tensorcheck::cuda::cmp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

TEST(DeviceIntrinsicsTest, HalfBitsRoundsOnceToNearestEven) {
  // 0.1 = 1.6 2^-4: exponent 11, mantissa 0.6 * 1024 = 614.4 -> 614.
  EXPECT_EQ(dev::HalfBits(0.1), 0x2e66);
  EXPECT_EQ(dev::HalfBits(1.0), 0x3c00);
  EXPECT_EQ(dev::HalfBits(-2.0), 0xc000);
  // Halfway between 1 and 1 + 2^-10: to 1 (even); between 1 + 2^-10 and
  // 1 + 2^-9: to 1 + 2^-9 (even).
  EXPECT_EQ(dev::HalfBits(1 + 0x1p-11), 0x3c00);
  EXPECT_EQ(dev::HalfBits(1 + 3 * 0x1p-11), 0x3c02);
  // Just above the tie: up. Through float first, 1 + 2^-11 + 2^-40 would
  // become the tie and then 1.
  EXPECT_EQ(dev::HalfBits(1 + 0x1p-11 + 0x1p-40), 0x3c01);
}

TEST(DeviceIntrinsicsTest, HalfBitsSubnormalsOverflowAndSpecials) {
  EXPECT_EQ(dev::HalfBits(0x1p-24), 0x0001);           // the least subnormal
  EXPECT_EQ(dev::HalfBits(0x1p-25), 0x0000);           // half of it: to 0 (even)
  EXPECT_EQ(dev::HalfBits(1.5 * 0x1p-25), 0x0001);     // above half: up
  EXPECT_EQ(dev::HalfBits(-0x1p-26), 0x8000);          // -0
  EXPECT_EQ(dev::HalfBits(1023 * 0x1p-24), 0x03ff);    // the largest subnormal
  EXPECT_EQ(dev::HalfBits(1023.5 * 0x1p-24), 0x0400);  // tie: to the least normal
  EXPECT_EQ(dev::HalfBits(65504.0), 0x7bff);           // the largest finite
  EXPECT_EQ(dev::HalfBits(65519.99), 0x7bff);          // below the tie with 65536
  EXPECT_EQ(dev::HalfBits(65520.0), 0x7c00);           // the tie: to even, infinity
  EXPECT_EQ(dev::HalfBits(1e300), 0x7c00);
  EXPECT_EQ(dev::HalfBits(-kInf), 0xfc00);
  EXPECT_EQ(dev::HalfBits(1e-300), 0x0000);
  EXPECT_EQ(dev::HalfBits(std::numeric_limits<double>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(dev::HalfBits(-std::numeric_limits<double>::quiet_NaN()), 0x7fff);
}

TEST(DeviceIntrinsicsTest, BFloat16BitsRoundsOnceToNearestEven) {
  EXPECT_EQ(dev::BFloat16Bits(1.0), 0x3f80);
  EXPECT_EQ(dev::BFloat16Bits(1 + 0x1p-8), 0x3f80);            // tie: to even
  EXPECT_EQ(dev::BFloat16Bits(1 + 3 * 0x1p-8), 0x3f82);        // tie: to even
  EXPECT_EQ(dev::BFloat16Bits(1 + 0x1p-8 + 0x1p-30), 0x3f81);  // float would make it the tie
  EXPECT_EQ(dev::BFloat16Bits(-0.1), 0xbdcd);      // 1.6 2^-4: mantissa 0.6 * 128 = 76.8 -> 77
  EXPECT_EQ(dev::BFloat16Bits(0x1p-133), 0x0001);  // the least subnormal
  EXPECT_EQ(dev::BFloat16Bits(0x1p-134), 0x0000);  // half of it: to 0 (even)
  // The largest finite is (2 - 2^-7) 2^127; the tie with 2^128 goes to
  // infinity.
  EXPECT_EQ(dev::BFloat16Bits((2 - 0x1p-7) * 0x1p127), 0x7f7f);
  EXPECT_EQ(dev::BFloat16Bits((2 - 0x1p-8) * 0x1p127), 0x7f80);
  EXPECT_EQ(dev::BFloat16Bits(1e39), 0x7f80);
  EXPECT_EQ(dev::BFloat16Bits(-kInf), 0xff80);
  EXPECT_EQ(dev::BFloat16Bits(std::numeric_limits<double>::quiet_NaN()), 0x7fff);
}

TEST(DeviceIntrinsicsTest, SixteenBitPatternsWidenExactly) {
  // 0x3555: exponent 13, mantissa 341: (1 + 341/1024) 2^-2.
  EXPECT_EQ(dev::HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(dev::HalfToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(dev::HalfToFloat(0x83ff), -1023 * 0x1p-24f);
  EXPECT_EQ(Bits(dev::HalfToFloat(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(dev::HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Bits(dev::HalfToFloat(0xfe01)), 0x7fffffffu);  // NaN: canonical
  EXPECT_EQ(host::BFloat16ToFloat(0x3f81), 1.0078125f);
  EXPECT_EQ(Bits(host::BFloat16ToFloat(0xffc1)), 0xffc10000u);  // the top half
  const uint16_t halves[] = {0x3555, 0x0001};
  EXPECT_EQ(dev::LoadHalf(halves, 1), 0x1p-24f);
  const uint16_t bf16s[] = {0x3f81, 0xc000};
  EXPECT_EQ(dev::LoadBFloat16(bf16s, 1), -2.0f);
}

TEST(DeviceIntrinsicsTest, HostAtomicsAreAddsThatReturnTheOldValue) {
  unsigned int count = 5;
  EXPECT_EQ(dev::AtomicAdd(&count, 3u), 5u);
  EXPECT_EQ(count, 8u);
}

}  // namespace
}  // namespace tensorcheck::cuda::cmp
