#include "core/stop_signal.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "core/gemm_tiles.h"
#include "core/status_macros.h"

namespace tensorcheck {
namespace {

TEST(StopSignalTest, NeverStopsUntilCancelled) {
  StopSignal stop;
  EXPECT_TRUE(stop.Check().ok());
  EXPECT_TRUE(CheckStop(nullptr).ok());
  stop.Cancel(StopSignal::Reason::kClientCancelled);
  EXPECT_EQ(stop.Check().code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(IsStopStatus(stop.Check()));
}

TEST(StopSignalTest, ACancelAtTheDeadlineIsDeadlineExceeded) {
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kDeadline);
  EXPECT_EQ(stop.Check().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(stop.Check().message().find("deadline passed"), absl::string_view::npos);
  EXPECT_TRUE(IsStopStatus(stop.Check()));
}

TEST(StopSignalTest, FirstReasonIsKept) {
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kShutdown);
  stop.Cancel(StopSignal::Reason::kClientCancelled);
  EXPECT_NE(stop.Check().message().find("shutting down"), absl::string_view::npos);
}

TEST(StopSignalTest, PassedDeadlineIsDeadlineExceeded) {
  StopSignal stop(absl::Now() - absl::Milliseconds(1));
  EXPECT_EQ(stop.Check().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(IsStopStatus(stop.Check()));
  StopSignal later(absl::Now() + absl::Hours(1));
  EXPECT_TRUE(later.Check().ok());
}

TEST(StopSignalTest, MarkSurvivesContextButOtherStatusesAreNotStops) {
  StopSignal stop;
  stop.Cancel(StopSignal::Reason::kClientCancelled);
  EXPECT_TRUE(IsStopStatus(WithContext(stop.Check(), "configuration cpu:fp32")));
  EXPECT_FALSE(IsStopStatus(absl::CancelledError("a backend's own")));
  EXPECT_FALSE(IsStopStatus(absl::DeadlineExceededError("a backend's own")));
}

TEST(StopSignalTest, CancelFromAnotherThreadIsSeen) {
  StopSignal stop;
  std::thread t([&] { stop.Cancel(StopSignal::Reason::kClientCancelled); });
  t.join();
  EXPECT_TRUE(stop.stop_requested());
}

// Every output element in exactly one tile, each tile within the budget
// (one element when a single one exceeds it).
TEST(GemmTilesTest, TilesCoverTheOutputOnceWithinTheBudget) {
  for (auto [m, n, k, budget] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{{1, 1, 1, 1},
                                                                   {7, 5, 3, 1000},
                                                                   {7, 5, 3, 10},
                                                                   {100, 3, 50, 600},
                                                                   {3, 100, 50, 600},
                                                                   {1921, 307, 409, 1 << 20},
                                                                   {1, 1000, 4096, 1 << 16},
                                                                   {64, 64, 1 << 20, 1 << 10}}) {
    std::vector<int> hits(static_cast<size_t>(m * n), 0);
    int tiles = 0;
    ASSERT_TRUE(ForEachGemmTile(
                    m, n, k, nullptr,
                    [&](const GemmTile& t) {
                      ++tiles;
                      EXPECT_GE(t.rows, 1);
                      EXPECT_GE(t.cols, 1);
                      EXPECT_LE(t.rows * t.cols, std::max<int64_t>(1, budget / k))
                          << m << "x" << n << "x" << k;
                      for (int64_t i = t.row; i < t.row + t.rows; ++i)
                        for (int64_t j = t.col; j < t.col + t.cols; ++j) ++hits[i * n + j];
                    },
                    budget)
                    .ok());
    for (int h : hits) ASSERT_EQ(h, 1) << m << "x" << n << "x" << k;
    if (m * n * k <= budget) {
      EXPECT_EQ(tiles, 1);
    }
  }
}

TEST(GemmTilesTest, StopsBeforeTheNextTile) {
  StopSignal stop;
  int tiles = 0;
  absl::Status s = ForEachGemmTile(
      100, 100, 100, &stop,
      [&](const GemmTile&) {
        if (++tiles == 3) stop.Cancel(StopSignal::Reason::kClientCancelled);
      },
      /*max_macs=*/10000);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(tiles, 3);
}

}  // namespace
}  // namespace tensorcheck
