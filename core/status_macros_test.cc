#include "core/status_macros.h"

#include <gtest/gtest.h>

namespace tensorcheck {
namespace {

TEST(StatusMacrosTest, InvalidFieldErrorNamesTheFieldAndBothSides) {
  const absl::Status s = InvalidFieldError("tolerance.atol", "a finite value >= 0", "-1");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "tolerance.atol: a finite value >= 0 expected, got -1");
}

TEST(StatusMacrosTest, FatalDeviceMarkSurvivesContextPrefixes) {
  const absl::Status marked = MarkFatalDeviceError(absl::InternalError("illegal address"));
  const absl::Status wrapped =
      WithContext(WithContext(marked, "backend cublas"), "configuration cublas:fp32:none");
  EXPECT_TRUE(IsFatalDeviceError(wrapped));
  EXPECT_EQ(wrapped.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(wrapped.message(), "configuration cublas:fp32:none: backend cublas: illegal address");
}

TEST(StatusMacrosTest, TheMarkIsNeverInferredFromWords) {
  EXPECT_FALSE(IsFatalDeviceError(absl::InternalError("sticky CUDA error: fatal")));
  EXPECT_FALSE(IsFatalDeviceError(absl::OkStatus()));
  EXPECT_TRUE(WithContext(absl::OkStatus(), "x").ok());
}

}  // namespace
}  // namespace tensorcheck
