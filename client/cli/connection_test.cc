// Where the CLI connects (internal/connection.h): --server, and the
// deprecated --target and TENSORCHECK_TARGET, read with a warning.
#include "client/cli/internal/connection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "client/cli/internal/command_line.h"

namespace tensorcheck::cli::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class ConnectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv(kServerEnv);
    unsetenv(kDeprecatedServerEnv);
    unsetenv(kTokenEnv);
  }
  void TearDown() override { SetUp(); }
  static absl::StatusOr<Connection> From(std::vector<std::string> args) {
    args.insert(args.begin(), "tensorcheck");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    auto cl = ParseCommandLine(static_cast<int>(argv.size()), argv.data());
    if (!cl.ok()) return cl.status();
    return ConnectionFromFlags(*cl);
  }
};

TEST_F(ConnectionTest, ServerFlagThenEnvironmentThenDefault) {
  auto c = From({"capabilities"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->target, "localhost:50051");
  EXPECT_THAT(c->warnings, IsEmpty());
  setenv(kServerEnv, "env:1", 1);
  EXPECT_EQ(From({"capabilities"})->target, "env:1");
  c = From({"--server", "flag:2", "capabilities"});
  EXPECT_EQ(c->target, "flag:2");
  EXPECT_THAT(c->warnings, IsEmpty());
}

TEST_F(ConnectionTest, TargetFlagIsADeprecatedServerWithAWarning) {
  auto c = From({"capabilities", "--target", "old:3"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->target, "old:3");
  EXPECT_THAT(c->warnings, ElementsAre("--target is deprecated: use --server"));
  // --server wins.
  c = From({"--server", "new:4", "capabilities", "--target", "old:3"});
  EXPECT_EQ(c->target, "new:4");
  EXPECT_EQ(c->warnings.size(), 1u);
}

TEST_F(ConnectionTest, TargetEnvironmentIsADeprecatedServerEnvironmentWithAWarning) {
  setenv(kDeprecatedServerEnv, "oldenv:5", 1);
  auto c = From({"capabilities"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->target, "oldenv:5");
  EXPECT_THAT(c->warnings, ElementsAre("TENSORCHECK_TARGET is deprecated: set TENSORCHECK_SERVER"));
  // TENSORCHECK_SERVER wins, silently.
  setenv(kServerEnv, "env:1", 1);
  c = From({"capabilities"});
  EXPECT_EQ(c->target, "env:1");
  EXPECT_THAT(c->warnings, IsEmpty());
}

}  // namespace
}  // namespace tensorcheck::cli::internal
