#include "core/request_progress.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace tensorcheck {
namespace {

TEST(RequestProgressTest, PhasesStartAtZeroAndCountUpToTheirTotal) {
  RequestProgress p;
  EXPECT_EQ(p.Get().phase, "");
  p.Begin("running candidates", 3);
  p.Advance();
  p.Advance(5);  // never past the total
  RequestProgress::Snapshot s = p.Get();
  EXPECT_EQ(s.phase, "running candidates");
  EXPECT_EQ(s.done, 3);
  EXPECT_EQ(s.total, 3);
  p.Begin("ranking", 0);
  s = p.Get();
  EXPECT_EQ(s.phase, "ranking");
  EXPECT_EQ(s.done, 0);
  EXPECT_EQ(s.total, 0);
  // Null: nobody asks, nothing happens.
  BeginProgress(nullptr, "x", 1);
  AdvanceProgress(nullptr);
}

TEST(RequestProgressTest, AdvancesFromManyThreadsAreEachCounted) {
  RequestProgress p;
  p.Begin("steps", 0);  // uncounted total: no cap
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&p] {
      for (int i = 0; i < 1000; ++i) p.Advance();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(p.Get().done, 4000);
}

}  // namespace
}  // namespace tensorcheck
