// The progress line's text (internal/progress.h): the phase in words and
// how long it has lasted, for bars, counts and waits alike.
#include "client/cli/internal/progress.h"

#include <gtest/gtest.h>

namespace tensorcheck::cli::internal {
namespace {

TEST(ProgressLineTest, AWaitSaysWhatItWaitsForAndForHowLong) {
  EXPECT_EQ(ProgressLine("waiting for the server's diagnosis", 0, 0, /*count=*/false, 12.4),
            "waiting for the server's diagnosis 12 s");
}

TEST(ProgressLineTest, ABarHasItsShareBytesRateAndElapsedTime) {
  // A quarter of 4 MB in 2 s: 6 of 24 marks, 500 kB/s.
  EXPECT_EQ(ProgressLine("uploading 2 tensors", 1'000'000, 4'000'000, /*count=*/false, 2.0),
            "uploading 2 tensors [######..................]  25% 1.0 MB / 4.0 MB  500.0 kB/s, 2 s");
  EXPECT_EQ(ProgressLine("hashing", 5, 4, /*count=*/false, 0),
            "hashing [########################] 100% 4 B / 4 B, 0 s");
}

TEST(ProgressLineTest, ACountHasItsItemsAndElapsedTime) {
  EXPECT_EQ(ProgressLine("layers", 12, 24, /*count=*/true, 30.2), "layers 12/24, 30 s");
}

}  // namespace
}  // namespace tensorcheck::cli::internal
