#include "server/service/idle_trim.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "absl/time/clock.h"

namespace tensorcheck {
namespace {

// Waits (up to a minute, to end a hang) until `trim` has done `n` trims.
bool WaitForTrims(const IdleTrim& trim, int64_t n) {
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (trim.trims() < n) {
    if (absl::Now() > give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(IdleTrimTest, OneTrimAfterEachQuietPeriodThatFollowsACall) {
  std::atomic<int> done{0};
  IdleTrim trim({absl::Milliseconds(20), [&] { ++done; }});
  trim.CallStarted();
  trim.CallEnded();
  ASSERT_TRUE(WaitForTrims(trim, 1));
  EXPECT_EQ(done.load(), 1);
  // Quiet, with no call in between: no second trim (50 quiet periods).
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(trim.trims(), 1);
  trim.CallStarted();
  trim.CallEnded();
  ASSERT_TRUE(WaitForTrims(trim, 2));
  EXPECT_EQ(done.load(), 2);
}

TEST(IdleTrimTest, NoTrimWhileACallRuns) {
  IdleTrim trim({absl::Milliseconds(10), [] {}});
  trim.CallStarted();
  trim.CallStarted();
  trim.CallEnded();  // one still runs
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(trim.trims(), 0);
  trim.CallEnded();
  EXPECT_TRUE(WaitForTrims(trim, 1));
}

TEST(IdleTrimTest, TheDefaultTrimIsGlibcsAndTheDestructorStopsTheThread) {
  auto trim = std::make_unique<IdleTrim>(IdleTrim::Options{absl::Milliseconds(1), nullptr});
  trim->CallStarted();
  trim->CallEnded();
  EXPECT_TRUE(WaitForTrims(*trim, 1));
  trim.reset();  // joins; a pending period does not hold it
}

}  // namespace
}  // namespace tensorcheck
