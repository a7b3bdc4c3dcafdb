#include "core/share_format.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace tensorcheck {
namespace {

TEST(FormatShareTest, ExactlyAllOrNoneHaveNoDecimals) {
  EXPECT_EQ(FormatShare(1.0), "100%");
  EXPECT_EQ(FormatShare(0.0), "0%");
}

TEST(FormatShareTest, OrdinarySharesHaveOneDecimal) {
  EXPECT_EQ(FormatShare(0.5), "50.0%");
  EXPECT_EQ(FormatShare(0.333), "33.3%");
  EXPECT_EQ(FormatShare(0.98), "98.0%");
  EXPECT_EQ(FormatShare(0.0006), "0.1%");  // 0.06% is not shown as 0.0
}

TEST(FormatShareTest, NearlyAllGetsDecimalsUntilItIsNotOneHundred) {
  // 99.996831%: 100.0 and 100.00 at one and two decimals, 99.997 at three.
  EXPECT_EQ(FormatShare(0.99996831), "99.997%");
  EXPECT_EQ(FormatShare(0.9996), "99.96%");
  EXPECT_EQ(FormatShare(0.99999999), "99.999999%");
}

TEST(FormatShareTest, NearlyNoneGetsDecimalsUntilItIsNotZero) {
  EXPECT_EQ(FormatShare(3e-5), "0.003%");
  EXPECT_EQ(FormatShare(0.0004), "0.04%");
  EXPECT_EQ(FormatShare(1e-8), "0.000001%");
}

TEST(FormatShareTest, BeyondSixDecimalsIsABound) {
  EXPECT_EQ(FormatShare(1e-9), "<0.000001%");
  EXPECT_EQ(FormatShare(1 - 1e-10), ">99.999999%");
  EXPECT_EQ(FormatShare(std::numeric_limits<double>::denorm_min()), "<0.000001%");
}

TEST(FormatShareTest, NanAndOutOfRangeValuesArePrintedNotHidden) {
  EXPECT_EQ(FormatShare(std::numeric_limits<double>::quiet_NaN()), "nan%");
  EXPECT_EQ(FormatShare(1.5), "150.0%");
  EXPECT_EQ(FormatShare(-0.25), "-25.0%");
}

TEST(FormatShareTest, CountsDecideAllAndNone) {
  EXPECT_EQ(FormatShare(int64_t{1024}, int64_t{1024}), "100%");
  EXPECT_EQ(FormatShare(int64_t{0}, int64_t{1024}), "0%");
  EXPECT_EQ(FormatShare(int64_t{0}, int64_t{0}), "0%");
  EXPECT_EQ(FormatShare(int64_t{3}, int64_t{1024}), "0.3%");
  EXPECT_EQ(FormatShare(int64_t{2}, int64_t{6}), "33.3%");
  // 3 of 94,674 differ: 99.99683%.
  EXPECT_EQ(FormatShare(int64_t{94671}, int64_t{94674}), "99.997%");
  EXPECT_EQ(FormatShare(int64_t{1}, int64_t{4'000'000'000}), "<0.000001%");
  EXPECT_EQ(FormatShare(int64_t{3'999'999'999}, int64_t{4'000'000'000}), ">99.999999%");
}

TEST(FormatShareTest, CountsThatDivideToOneStillReadBelowAll) {
  // (2^62 - 1) / 2^62 is 1 in double; one element still differs.
  const int64_t whole = int64_t{1} << 62;
  EXPECT_EQ(FormatShare(whole - 1, whole), ">99.999999%");
}

}  // namespace
}  // namespace tensorcheck
