#include "core/executor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "core/parallel.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<Executor> MustCreate(int threads) {
  auto e = Executor::Create({threads});
  EXPECT_THAT(e, IsOk());
  return e.ok() ? std::move(e).value() : nullptr;
}

uint64_t Bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

// Errors travel as a Status and ParallelFor cannot throw: nothing here
// needs exceptions.
struct NoOp {
  void operator()(int64_t) const {}
};
static_assert(noexcept(std::declval<Executor&>().ParallelFor(1, NoOp())));
static_assert(noexcept(ParallelFor(nullptr, 1, NoOp())));

TEST(ExecutorTest, SizeCountsTheCallersThread) {
  EXPECT_EQ(MustCreate(1)->size(), 1);
  EXPECT_EQ(MustCreate(4)->size(), 4);
  EXPECT_GE(MustCreate(0)->size(), 1);  // one per hardware thread
}

TEST(ExecutorTest, NegativeThreadsIsInvalidArgument) {
  EXPECT_THAT(Executor::Create({-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("threads")));
}

TEST(ExecutorTest, EveryTaskRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    auto executor = MustCreate(threads);
    for (int64_t count : {0, 1, 2, 7, 1000}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, " << count << " tasks");
      std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
      executor->ParallelFor(count, [&](int64_t i) { runs[static_cast<size_t>(i)]++; });
      for (int64_t i = 0; i < count; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << i;
    }
  }
}

TEST(ExecutorTest, SizeOneAndNullRunInOrderOnTheCallersThread) {
  auto one = MustCreate(1);
  for (Executor* e : {one.get(), static_cast<Executor*>(nullptr)}) {
    std::vector<int64_t> order;
    std::set<std::thread::id> ids;
    ParallelFor(e, 5, [&](int64_t i) {
      order.push_back(i);  // no lock: only this thread runs tasks
      ids.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
    EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
  }
}

TEST(ExecutorTest, ChunksAndSumsAreTheSameForEverySize) {
  // 1000 items, chunks of at least 300: three chunks [0,333), [333,666),
  // [666,1000) whatever runs them. Each chunk sums 0.1 * i in item order;
  // the chunk sums are added in chunk order.
  auto sum_with = [](Executor* executor, std::vector<std::pair<int64_t, int64_t>>* chunks) {
    std::vector<double> partial(3, 0.0);
    std::mutex mu;
    ParallelChunks(
        1000, executor,
        [&](int64_t begin, int64_t end) {
          double s = 0;
          for (int64_t i = begin; i < end; ++i) s += 0.1 * static_cast<double>(i);
          partial[static_cast<size_t>(begin / 333)] = s;
          std::lock_guard<std::mutex> lock(mu);
          chunks->push_back({begin, end});
        },
        /*min_chunk=*/300);
    return (partial[0] + partial[1]) + partial[2];
  };
  std::vector<std::pair<int64_t, int64_t>> inline_chunks;
  const double inline_sum = sum_with(nullptr, &inline_chunks);
  EXPECT_EQ(inline_chunks,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 333}, {333, 666}, {666, 1000}}));
  EXPECT_NEAR(inline_sum, 0.1 * 999 * 1000 / 2, 1e-9);
  for (int threads : {1, 2, 3, 8}) {
    SCOPED_TRACE(threads);
    auto executor = MustCreate(threads);
    std::vector<std::pair<int64_t, int64_t>> chunks;
    EXPECT_EQ(Bits(sum_with(executor.get(), &chunks)), Bits(inline_sum));
    std::sort(chunks.begin(), chunks.end());
    EXPECT_EQ(chunks, inline_chunks);
  }
}

TEST(ExecutorTest, TinyMinChunkIsCappedAtTheMostChunks) {
  std::atomic<int64_t> calls{0}, items{0};
  auto executor = MustCreate(3);
  ParallelChunks(
      100000, executor.get(),
      [&](int64_t begin, int64_t end) {
        ++calls;
        items += end - begin;
      },
      /*min_chunk=*/1);
  EXPECT_EQ(calls.load(), kMaxParallelChunks);
  EXPECT_EQ(items.load(), 100000);
}

TEST(ExecutorTest, ConcurrentCallersShareThePoolAndGetTheirOwnResults) {
  auto executor = MustCreate(3);
  constexpr int kCallers = 6;
  constexpr int kRounds = 200;
  std::mutex mu;
  std::set<std::thread::id> callers, runners;
  std::vector<int> failures(kCallers, 0);
  std::vector<std::thread> threads;
  for (int c = 0; c < kCallers; ++c) {
    threads.emplace_back([&, c] {
      {
        std::lock_guard<std::mutex> lock(mu);
        callers.insert(std::this_thread::get_id());
      }
      for (int round = 0; round < kRounds; ++round) {
        const int64_t count = 1 + (c * 7 + round) % 37;
        std::vector<int64_t> out(static_cast<size_t>(count), -1);
        executor->ParallelFor(count, [&](int64_t i) {
          out[static_cast<size_t>(i)] = i * i + c;
          std::lock_guard<std::mutex> lock(mu);
          runners.insert(std::this_thread::get_id());
        });
        for (int64_t i = 0; i < count; ++i) {
          if (out[static_cast<size_t>(i)] != i * i + c) ++failures[static_cast<size_t>(c)];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures, std::vector<int>(kCallers, 0));
  // Tasks ran on the callers and the pool's two threads, nothing else: no
  // thread was started per call.
  std::set<std::thread::id> others;
  for (const std::thread::id& id : runners) {
    if (callers.count(id) == 0) others.insert(id);
  }
  EXPECT_LE(others.size(), 2u);
}

TEST(ExecutorTest, NestedCallsOnTheSamePoolFinish) {
  auto executor = MustCreate(2);
  std::vector<int64_t> sums(4, 0);
  executor->ParallelFor(4, [&](int64_t outer) {
    std::vector<int64_t> inner(100, 0);
    executor->ParallelFor(100, [&](int64_t i) { inner[static_cast<size_t>(i)] = outer * i; });
    for (int64_t v : inner) sums[static_cast<size_t>(outer)] += v;
  });
  // sum_{i<100} outer * i = 4950 outer.
  EXPECT_EQ(sums, (std::vector<int64_t>{0, 4950, 9900, 14850}));
}

}  // namespace
}  // namespace tensorcheck
