// Validate (one case per rule, with the flag it names), the size parser,
// durations, old flag names, and the steps of TensorCheckServer::Start that
// bind no port (docs/operations.md, "Flags: names, units, old names").
// Every expected number is worked out by hand in its comment.
#include "server/service/server_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>

#include "absl/flags/marshalling.h"
#include "absl/time/time.h"
#include "grpc/impl/codegen/grpc_types.h"
#include "server/service/server.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;
namespace fs = std::filesystem;

// An absl::StatusOr that is OK and holds `expected`.
MATCHER_P(HoldsValue, expected, "is OK and holds " + ::testing::PrintToString(expected)) {
  if (!arg.ok()) {
    *result_listener << "status: " << arg.status();
    return false;
  }
  *result_listener << "holds " << ::testing::PrintToString(*arg);
  return *arg == expected;
}

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// ---------------------------------------------------------------------
// Validate

TEST(ValidateTest, TheDefaultsPass) { EXPECT_THAT(Validate(ServerOptions{}), IsOk()); }

TEST(ValidateTest, TheBoundsOfEachRangePass) {
  ServerOptions o;
  o.port = 65535;
  o.metrics_port = 1;
  o.health_port = 0;
  o.engine.limits.max_message_bytes = 2047 * kMiB;
  o.engine.limits.max_tensor_bytes = 2047 * kMiB;  // equal to the message
  o.max_inflight_bytes = 0;
  o.max_request_time = absl::Hours(24);
  o.engine.limits.max_work_macs = int64_t{1} << 62;  // 2^32 x 2^30
  o.max_queue = 1;
  o.max_connection_idle = absl::ZeroDuration();
  o.keepalive_time = absl::Hours(24);
  o.workers = 0;
  o.backends.cpu_threads = -1;
  o.store_bytes = -1;
  o.max_stored_tensor_bytes = 1;
  o.partial_upload_ttl = absl::Hours(7 * 24);
  o.upload_idle = absl::Nanoseconds(1);
  o.inline_output_bytes = 0;
  o.backends.gpu_lanes = 1;
  o.backends.gpu_memory_budget_bytes = 0;
  o.backends.cublaslt_workspace_bytes = 0;
  o.credentials_reload = absl::ZeroDuration();
  o.log_level = "off";
  o.log_format = "json";
  o.shutdown_grace = absl::ZeroDuration();
  EXPECT_THAT(Validate(o), IsOk());
  o.engine.limits.max_message_bytes = kMiB;
  o.engine.limits.max_tensor_bytes = 1;
  o.engine.limits.max_work_macs = int64_t{1} << 30;  // 1 GMAC
  EXPECT_THAT(Validate(o), IsOk());
}

TEST(ValidateTest, TlsWithItsClientCaPasses) {
  ServerOptions o;
  o.tls = {"cert.pem", "key.pem", "ca.pem"};
  EXPECT_THAT(Validate(o), IsOk());  // the files are Build's to read
}

TEST(ValidateTest, TheMetricsPortMayEqualThePortOnAnotherAddress) {
  ServerOptions o;
  o.port = 9000;
  o.metrics_port = 9000;
  o.metrics_host = "10.0.0.1";
  o.health_port = 9000;  // the health port is on `host`, beside --port
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "--health-port: 9000 is --port too; the health service "
                                    "needs a port of its own"));
  o.health_port = 0;
  EXPECT_THAT(Validate(o), IsOk());
}

struct BadValue {
  std::string name;
  std::function<void(ServerOptions&)> set;
  std::string message;
};

// The case's name and message, not the struct's bytes, in test logs.
void PrintTo(const BadValue& v, std::ostream* os) { *os << v.name << ": " << v.message; }

class BadValueTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(BadValueTest, IsRefusedNamingTheFlag) {
  ServerOptions o;
  GetParam().set(o);
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kInvalidArgument, GetParam().message));
}

// By the options' flags, in their units: sizes in the largest binary unit
// they are a whole number of, durations as Abseil writes them.
INSTANTIATE_TEST_SUITE_P(
    Rules, BadValueTest,
    ::testing::Values(
        BadValue{"EmptyHost", [](ServerOptions& o) { o.host = ""; },
                 "--host: an address (0.0.0.0: every address) expected, got ''"},
        BadValue{"PortOverRange", [](ServerOptions& o) { o.port = 65536; },
                 "--port: 0 (a free port) or 1..65535 expected, got 65536"},
        BadValue{"PortNegative", [](ServerOptions& o) { o.port = -1; },
                 "--port: 0 (a free port) or 1..65535 expected, got -1"},
        BadValue{"MetricsPortOverRange", [](ServerOptions& o) { o.metrics_port = 70000; },
                 "--metrics-port: 0 (no endpoint) or 1..65535 expected, got 70000"},
        BadValue{"HealthPortOverRange", [](ServerOptions& o) { o.health_port = 65536; },
                 "--health-port: 0 (none) or 1..65535 expected, got 65536"},
        BadValue{"MetricsPortIsThePort",
                 [](ServerOptions& o) {
                   o.port = 50051;
                   o.metrics_port = 50051;
                 },
                 "--metrics-port: 50051 is --port too; the metrics endpoint needs a port of its "
                 "own"},
        BadValue{"HealthPortIsThePort",
                 [](ServerOptions& o) {
                   o.port = 8081;
                   o.health_port = 8081;
                 },
                 "--health-port: 8081 is --port too; the health service needs a port of its "
                 "own"},
        BadValue{"HealthPortIsTheMetricsPort",
                 [](ServerOptions& o) {
                   o.metrics_port = 9090;
                   o.health_port = 9090;
                 },
                 "--health-port: 9090 is --metrics-port too; the health service needs a port "
                 "of its own"},
        BadValue{"MaxMessageZero", [](ServerOptions& o) { o.engine.limits.max_message_bytes = 0; },
                 "--max-message: 1MiB..2047MiB expected, got 0"},
        BadValue{"MaxMessageOver2047MiB",
                 // 2048 MiB = 2 GiB, one MiB over gRPC's int sizes' range.
                 [](ServerOptions& o) { o.engine.limits.max_message_bytes = 2048 * kMiB; },
                 "--max-message: 1MiB..2047MiB expected, got 2GiB"},
        BadValue{"MaxInlineTensorOverTheMessage",
                 [](ServerOptions& o) {
                   o.engine.limits.max_message_bytes = 256 * kMiB;
                   o.engine.limits.max_tensor_bytes = 300 * kMiB;
                 },
                 "--max-inline-tensor: 0 (the smaller of 256MiB and --max-message) or "
                 "1..256MiB (--max-message) expected, got 300MiB"},
        BadValue{"MaxInlineTensorNegative",
                 [](ServerOptions& o) { o.engine.limits.max_tensor_bytes = -1; },
                 "--max-inline-tensor: 0 (the smaller of 256MiB and --max-message) or "
                 "1..256MiB (--max-message) expected, got -1"},
        BadValue{"MaxInflightNegative", [](ServerOptions& o) { o.max_inflight_bytes = -1024; },
                 "--max-inflight: 0 (unlimited) or a positive size expected, got -1KiB"},
        BadValue{"MaxRequestTimeZero",
                 [](ServerOptions& o) { o.max_request_time = absl::ZeroDuration(); },
                 "--max-request-time: a value in (0, 24h] expected, got 0"},
        BadValue{"MaxRequestTimeOverADay",
                 [](ServerOptions& o) { o.max_request_time = absl::Hours(25); },
                 "--max-request-time: a value in (0, 24h] expected, got 25h"},
        BadValue{"MaxWorkUnderOneGmac", [](ServerOptions& o) { o.engine.limits.max_work_macs = 0; },
                 "--max-work-gmacs: 1..2^32 expected, got 0"},
        BadValue{"MaxWorkOver2To32Gmacs",
                 // 2^63 - 1 multiply-adds: not whole GMACs.
                 [](ServerOptions& o) { o.engine.limits.max_work_macs = kInt64Max; },
                 "--max-work-gmacs: 1..2^32 expected, got 9223372036854775807 multiply-adds"},
        BadValue{"MaxQueueZero", [](ServerOptions& o) { o.max_queue = 0; },
                 "--max-queue: a positive count expected, got 0"},
        BadValue{"MaxConnectionIdleNegative",
                 [](ServerOptions& o) { o.max_connection_idle = absl::Seconds(-1); },
                 "--max-connection-idle: 0..24h expected, got -1s"},
        BadValue{"KeepaliveTimeOverADay",
                 [](ServerOptions& o) { o.keepalive_time = absl::Hours(48); },
                 "--keepalive-time: 0..24h expected, got 48h"},
        BadValue{"KeepaliveTimeoutNegative",
                 [](ServerOptions& o) { o.keepalive_timeout = absl::Milliseconds(-5); },
                 "keepalive_timeout: 0..24h expected, got -5ms"},
        BadValue{"MinClientPingIntervalInfinite",
                 [](ServerOptions& o) { o.min_client_ping_interval = absl::InfiniteDuration(); },
                 "min_client_ping_interval: 0..24h expected, got inf"},
        BadValue{"ThreadsNegative", [](ServerOptions& o) { o.workers = -2; },
                 "--threads: 0 (one per core) or a positive count expected, got -2"},
        BadValue{"StatsThreadsNegative", [](ServerOptions& o) { o.engine.stats_threads = -1; },
                 "--stats-threads: 0 (one per core) or a positive count expected, got -1"},
        BadValue{"CpuThreadsUnderMinusOne", [](ServerOptions& o) { o.backends.cpu_threads = -2; },
                 "--cpu-threads: -1 (one per GEMM beside other workers), 0 (all cores) or a "
                 "positive count expected, got -2"},
        BadValue{"StoreSizeUnderMinusOne", [](ServerOptions& o) { o.store_bytes = -2; },
                 "--store-size: auto (a quarter of memory), 0 (no store) or a positive size "
                 "expected, got -2"},
        BadValue{"MaxStoredTensorZero", [](ServerOptions& o) { o.max_stored_tensor_bytes = 0; },
                 "--max-stored-tensor: a positive size expected, got 0"},
        BadValue{"PartialUploadTtlZero",
                 [](ServerOptions& o) { o.partial_upload_ttl = absl::ZeroDuration(); },
                 "--partial-upload-ttl: a value in (0, 168h] expected, got 0"},
        BadValue{
            "PartialUploadTtlOverAWeek",
            // 7 x 24 h = 168 h; one second more.
            [](ServerOptions& o) { o.partial_upload_ttl = absl::Hours(168) + absl::Seconds(1); },
            "--partial-upload-ttl: a value in (0, 168h] expected, got 168h1s"},
        BadValue{"UploadIdleNegative", [](ServerOptions& o) { o.upload_idle = absl::Seconds(-60); },
                 "--upload-idle: a value in (0, 24h] expected, got -1m"},
        BadValue{"MaxInlineOutputNegative", [](ServerOptions& o) { o.inline_output_bytes = -1; },
                 "--max-inline-output: 0 or a positive size expected, got -1"},
        BadValue{"GpuLanesZero", [](ServerOptions& o) { o.backends.gpu_lanes = 0; },
                 "--gpu-lanes: a positive count expected, got 0"},
        BadValue{"GpuMemoryBudgetNegative",
                 [](ServerOptions& o) { o.backends.gpu_memory_budget_bytes = -kMiB; },
                 "--gpu-memory-budget: 0 (90% of the free memory) or a positive size "
                 "expected, got -1MiB"},
        BadValue{"CublasltWorkspaceNegative",
                 [](ServerOptions& o) { o.backends.cublaslt_workspace_bytes = -4096; },
                 "--cublaslt-workspace: 0 or a positive size expected, got -4KiB"},
        BadValue{"CredentialsReloadNegative",
                 [](ServerOptions& o) { o.credentials_reload = absl::Seconds(-5); },
                 "--credentials-reload: 0..24h expected, got -5s"},
        BadValue{"TlsCertWithoutKey", [](ServerOptions& o) { o.tls.cert = "cert.pem"; },
                 "--tls-cert and --tls-key: both or neither expected (TLS needs the "
                 "certificate and its key), got --tls-cert alone"},
        BadValue{"TlsKeyWithoutCert", [](ServerOptions& o) { o.tls.key = "key.pem"; },
                 "--tls-cert and --tls-key: both or neither expected (TLS needs the "
                 "certificate and its key), got --tls-key alone"},
        BadValue{"TlsClientCaWithoutTls", [](ServerOptions& o) { o.tls.client_ca = "ca.pem"; },
                 "--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is TLS)"},
        BadValue{"LogFormat", [](ServerOptions& o) { o.log_format = "xml"; },
                 "--log-format: text or json expected, got 'xml'"},
        BadValue{"LogLevel", [](ServerOptions& o) { o.log_level = "loud"; },
                 "--log-level: trace, debug, info, warn, error, critical or off expected, got "
                 "'loud'"},
        BadValue{"ShutdownGraceNegative",
                 [](ServerOptions& o) { o.shutdown_grace = absl::Seconds(-1); },
                 "--shutdown-grace: 0..24h expected, got -1s"}),
    [](const ::testing::TestParamInfo<BadValue>& info) { return info.param.name; });

// By the old flag the command line used (ServerOptions::old_flag_names),
// in that flag's unit: MiB, bytes or seconds.
class OldNameTest : public ::testing::TestWithParam<BadValue> {};

TEST_P(OldNameTest, IsRefusedNamingTheOldFlagInItsUnit) {
  ServerOptions o;
  GetParam().set(o);
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kInvalidArgument, GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, OldNameTest,
    ::testing::Values(
        BadValue{"MaxMessageMb",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-message-mb"};
                   o.engine.limits.max_message_bytes = 0;
                 },
                 "--max-message-mb: 1..2047 expected, got 0"},
        BadValue{"MaxTensorMb",
                 // --max-message-mb=256 --max-tensor-mb=300.
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-message-mb", "--max-tensor-mb"};
                   o.engine.limits.max_tensor_bytes = 300 * kMiB;
                 },
                 "--max-tensor-mb: 0 (the smaller of 256 and --max-message-mb) or 1..256 "
                 "(--max-message-mb) expected, got 300"},
        BadValue{"MaxTensorMbBesideMaxMessage",
                 // --max-message=1GiB with --max-tensor-mb=1025: the bound in
                 // MiB, 1 GiB = 1024 MiB, the message named as given.
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-tensor-mb"};
                   o.engine.limits.max_message_bytes = 1024 * kMiB;
                   o.engine.limits.max_tensor_bytes = 1025 * kMiB;
                 },
                 "--max-tensor-mb: 0 (the smaller of 256 and --max-message) or 1..1024 "
                 "(--max-message) expected, got 1025"},
        BadValue{"MaxTensorMbSetInBytes",
                 // 1.5 MiB is no whole number of MiB: shown in bytes.
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-tensor-mb"};
                   o.engine.limits.max_message_bytes = kMiB;
                   o.engine.limits.max_tensor_bytes = 3 * kMiB / 2;
                 },
                 "--max-tensor-mb: 0 (the smaller of 256 and --max-message) or 1..1 "
                 "(--max-message) expected, got 1572864 bytes"},
        BadValue{"MaxInflightBytes",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-inflight-bytes"};
                   o.max_inflight_bytes = -1024;
                 },
                 "--max-inflight-bytes: 0 (unlimited) or a positive size expected, got -1024"},
        BadValue{"MaxRequestSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-request-seconds"};
                   o.max_request_time = absl::Seconds(100000);
                 },
                 // %g's six digits, as the old message printed them.
                 "--max-request-seconds: a value in (0, 86400] expected, got 100000"},
        BadValue{"MaxConnectionIdleSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-connection-idle-seconds"};
                   o.max_connection_idle = absl::Milliseconds(-500);
                 },
                 "--max-connection-idle-seconds: 0..86400 expected, got -0.5"},
        BadValue{"KeepaliveSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--keepalive-seconds"};
                   o.keepalive_time = absl::InfiniteDuration();
                 },
                 "--keepalive-seconds: 0..86400 expected, got inf"},
        BadValue{"StoreBytes",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--store-bytes"};
                   o.store_bytes = -2;
                 },
                 "--store-bytes: -1 (a quarter of memory), 0 (no store) or a positive size "
                 "expected, got -2"},
        BadValue{"MaxTensorBytes",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--max-tensor-bytes"};
                   o.max_stored_tensor_bytes = 0;
                 },
                 "--max-tensor-bytes: a positive size expected, got 0"},
        BadValue{"PartialUploadSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--partial-upload-seconds"};
                   o.partial_upload_ttl = absl::ZeroDuration();
                 },
                 // 7 x 86400 = 604800.
                 "--partial-upload-seconds: a value in (0, 604800] expected, got 0"},
        BadValue{"UploadIdleSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--upload-idle-seconds"};
                   o.upload_idle = absl::Seconds(-3);
                 },
                 "--upload-idle-seconds: a value in (0, 86400] expected, got -3"},
        BadValue{"InlineOutputBytes",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--inline-output-bytes"};
                   o.inline_output_bytes = -7;
                 },
                 "--inline-output-bytes: 0 or a positive size expected, got -7"},
        BadValue{"GpuMemoryBudgetMb",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--gpu-memory-budget-mb"};
                   o.backends.gpu_memory_budget_bytes = -3 * kMiB;
                 },
                 "--gpu-memory-budget-mb: 0 (90% of the free memory) or a positive size "
                 "expected, got -3"},
        BadValue{"CublasltWorkspaceMb",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--cublaslt-workspace-mb"};
                   o.backends.cublaslt_workspace_bytes = -kMiB;
                 },
                 "--cublaslt-workspace-mb: 0 or a positive size expected, got -1"},
        BadValue{"CredentialsReloadSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--credentials-reload-seconds"};
                   o.credentials_reload = absl::Seconds(-0.25);
                 },
                 "--credentials-reload-seconds: 0..86400 expected, got -0.25"},
        BadValue{"ShutdownGraceSeconds",
                 [](ServerOptions& o) {
                   o.old_flag_names = {"--shutdown-grace-seconds"};
                   o.shutdown_grace = absl::Hours(25);
                 },
                 // 25 x 3600 = 90000.
                 "--shutdown-grace-seconds: 0..86400 expected, got 90000"}),
    [](const ::testing::TestParamInfo<BadValue>& info) { return info.param.name; });

TEST(ValidateTest, AnOldNameOfAnotherOptionDoesNotRenameThisOne) {
  ServerOptions o;
  o.old_flag_names = {"--store-bytes"};
  o.engine.limits.max_message_bytes = 0;
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "--max-message: 1MiB..2047MiB expected, got 0"));
}

// ---------------------------------------------------------------------
// Sizes

TEST(ParseByteSizeTest, PlainBytes) {
  EXPECT_THAT(ParseByteSize("0"), HoldsValue(0));
  EXPECT_THAT(ParseByteSize("1048576"), HoldsValue(1048576));
  EXPECT_THAT(ParseByteSize("512B"), HoldsValue(512));
  EXPECT_THAT(ParseByteSize("007"), HoldsValue(7));
  EXPECT_THAT(ParseByteSize(" 2MiB\t"), HoldsValue(2 * 1048576));
}

TEST(ParseByteSizeTest, BinarySuffixes) {
  EXPECT_THAT(ParseByteSize("1K"), HoldsValue(1024));
  EXPECT_THAT(ParseByteSize("1KiB"), HoldsValue(1024));
  EXPECT_THAT(ParseByteSize("3M"), HoldsValue(3 * 1048576));
  EXPECT_THAT(ParseByteSize("256MiB"), HoldsValue(268435456));        // 2^28
  EXPECT_THAT(ParseByteSize("4G"), HoldsValue(int64_t{4294967296}));  // 2^32
  EXPECT_THAT(ParseByteSize("4GiB"), HoldsValue(int64_t{4294967296}));
  EXPECT_THAT(ParseByteSize("1T"), HoldsValue(int64_t{1099511627776}));  // 2^40
  EXPECT_THAT(ParseByteSize("2TiB"), HoldsValue(int64_t{2199023255552}));
}

TEST(ParseByteSizeTest, DecimalSuffixes) {
  EXPECT_THAT(ParseByteSize("1KB"), HoldsValue(1000));
  EXPECT_THAT(ParseByteSize("512MB"), HoldsValue(512000000));
  EXPECT_THAT(ParseByteSize("4GB"), HoldsValue(int64_t{4000000000}));
  EXPECT_THAT(ParseByteSize("3TB"), HoldsValue(int64_t{3000000000000}));
}

TEST(ParseByteSizeTest, TheLargestSizesAndOverflow) {
  // 2^63 - 1 bytes, and 2^23 - 1 TiB = 2^63 - 2^40.
  EXPECT_THAT(ParseByteSize("9223372036854775807"), HoldsValue(kInt64Max));
  EXPECT_THAT(ParseByteSize("8388607TiB"), HoldsValue(int64_t{9223370937343148032}));
  // 2^63, 2^23 TiB = 2^63, and 9223372036854776 KB = 2^63 + 192.
  for (const char* over :
       {"9223372036854775808", "8388608TiB", "9223372036854776KB", "99999999999999999999999"}) {
    EXPECT_THAT(ParseByteSize(over),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("over the largest size")))
        << over;
  }
}

TEST(ParseByteSizeTest, NegativeSizes) {
  EXPECT_THAT(ParseByteSize("-1"),
              StatusIs(absl::StatusCode::kInvalidArgument, "a size is not negative, got '-1'"));
  EXPECT_THAT(ParseByteSize("-4GiB"),
              StatusIs(absl::StatusCode::kInvalidArgument, "a size is not negative, got '-4GiB'"));
}

TEST(ParseByteSizeTest, Garbage) {
  for (const char* bad : {"", "   ", "GiB", "+5", "abc", "0x10"}) {
    EXPECT_THAT(ParseByteSize(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
  EXPECT_THAT(ParseByteSize("lots"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "a size expected (a whole number of bytes, or with a suffix: 4GiB, "
                       "512MB), got 'lots'"));
  EXPECT_THAT(ParseByteSize("4XB"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'4XB': unknown suffix 'XB' (B; K, M, G, T or KiB, MiB, GiB, TiB "
                       "(binary); KB, MB, GB, TB (decimal))"));
  // Suffixes are spelled as documented: no lower case, no space, no PiB.
  for (const char* bad : {"4gib", "4GIB", "4 GiB", "4kb", "1PiB", "1iB", "4GiBs"}) {
    EXPECT_THAT(ParseByteSize(bad),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown suffix")))
        << bad;
  }
  EXPECT_THAT(ParseByteSize("1.5GiB"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'1.5GiB': a whole number expected (1536MiB, not 1.5GiB)"));
}

TEST(FormatByteSizeTest, TheLargestBinaryUnitThatDividesIt) {
  EXPECT_EQ(FormatByteSize(0), "0");
  EXPECT_EQ(FormatByteSize(1), "1");
  EXPECT_EQ(FormatByteSize(1000), "1000");  // not a multiple of 1024
  EXPECT_EQ(FormatByteSize(1024), "1KiB");
  EXPECT_EQ(FormatByteSize(1536), "1536");  // 1.5 KiB
  EXPECT_EQ(FormatByteSize(3 * 1024 * 1024), "3MiB");
  EXPECT_EQ(FormatByteSize(1025 * 1024), "1025KiB");
  EXPECT_EQ(FormatByteSize(int64_t{4} << 30), "4GiB");
  EXPECT_EQ(FormatByteSize(int64_t{3} << 40), "3TiB");
  EXPECT_EQ(FormatByteSize(int64_t{2048} << 40), "2048TiB");
  EXPECT_EQ(FormatByteSize(-1024), "-1KiB");
  EXPECT_EQ(FormatByteSize(kInt64Max), "9223372036854775807");
  // -2^63 = -(2^23 TiB).
  EXPECT_EQ(FormatByteSize(std::numeric_limits<int64_t>::min()), "-8388608TiB");
}

TEST(FormatByteSizeTest, ParseReadsItBack) {
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{1536}, int64_t{1} << 20,
                        int64_t{5} << 30, (int64_t{1} << 40) + 1024, kInt64Max}) {
    EXPECT_THAT(ParseByteSize(FormatByteSize(bytes)), HoldsValue(bytes)) << bytes;
  }
}

TEST(ByteSizeFlagTest, ParsesAndUnparsesAsAFlag) {
  ByteSize size;
  std::string error;
  ASSERT_TRUE(absl::ParseFlag("4GiB", &size, &error)) << error;
  EXPECT_EQ(size.bytes, int64_t{4294967296});
  EXPECT_EQ(absl::UnparseFlag(size), "4GiB");
  EXPECT_FALSE(absl::ParseFlag("-1", &size, &error));
  EXPECT_EQ(error, "a size is not negative, got '-1'");
  EXPECT_FALSE(absl::ParseFlag("auto", &size, &error));  // only where auto is a value
}

TEST(ByteSizeFlagTest, AutoOrASize) {
  ByteSizeOrAuto size;
  std::string error;
  ASSERT_TRUE(absl::ParseFlag("8GiB", &size, &error)) << error;
  EXPECT_EQ(size.bytes, int64_t{8589934592});  // 2^33
  EXPECT_EQ(absl::UnparseFlag(size), "8GiB");
  ASSERT_TRUE(absl::ParseFlag("auto", &size, &error)) << error;
  EXPECT_EQ(size.bytes, std::nullopt);
  EXPECT_EQ(absl::UnparseFlag(size), "auto");
  ASSERT_TRUE(absl::ParseFlag("0", &size, &error)) << error;  // no store
  EXPECT_EQ(size.bytes, 0);
  EXPECT_FALSE(absl::ParseFlag("-1", &size, &error));
  EXPECT_EQ(error, "auto or a size expected; a size is not negative, got '-1'");
}

// ---------------------------------------------------------------------
// Durations: Abseil's flag syntax for the new flags, seconds for the old.

TEST(DurationFlagTest, AbseilsSyntax) {
  absl::Duration d;
  std::string error;
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("300s", &d, &error)) << error;
  EXPECT_EQ(d, absl::Seconds(300));
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("5m", &d, &error)) << error;
  EXPECT_EQ(d, absl::Seconds(300));
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("1.5s", &d, &error)) << error;
  EXPECT_EQ(d, absl::Milliseconds(1500));
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("1h30m", &d, &error)) << error;
  EXPECT_EQ(d, absl::Seconds(5400));
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("0", &d, &error)) << error;
  EXPECT_EQ(d, absl::ZeroDuration());
  // A number needs its unit, and garbage does not parse.
  for (const char* bad : {"300", "5 m", "five minutes", "", "1d"}) {
    EXPECT_FALSE(absl::ParseFlag<absl::Duration>(bad, &d, &error)) << bad;
  }
  // 2^63 seconds does not fit the parser's integer.
  EXPECT_FALSE(absl::ParseFlag<absl::Duration>("9223372036854775808s", &d, &error));
}

TEST(DurationFlagTest, NegativeAndHugeDurationsParseAndValidateRefusesThem) {
  absl::Duration d;
  std::string error;
  ServerOptions o;
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("-1s", &d, &error)) << error;
  o.max_request_time = d;
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "--max-request-time: a value in (0, 24h] expected, got -1s"));
  // 2^63 - 1 hours saturates to an infinite duration.
  ASSERT_TRUE(absl::ParseFlag<absl::Duration>("9223372036854775807h", &d, &error)) << error;
  EXPECT_EQ(d, absl::InfiniteDuration());
  o.max_request_time = d;
  EXPECT_THAT(Validate(o), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "--max-request-time: a value in (0, 24h] expected, got inf"));
}

TEST(SecondsFlagValueTest, SecondsToDurations) {
  EXPECT_THAT(SecondsFlagValue("--upload-idle-seconds", 0.5), HoldsValue(absl::Milliseconds(500)));
  EXPECT_THAT(SecondsFlagValue("--upload-idle-seconds", -2), HoldsValue(absl::Seconds(-2)));
  EXPECT_THAT(SecondsFlagValue("--upload-idle-seconds", std::numeric_limits<double>::infinity()),
              HoldsValue(absl::InfiniteDuration()));
  EXPECT_THAT(SecondsFlagValue("--upload-idle-seconds", -std::numeric_limits<double>::infinity()),
              HoldsValue(-absl::InfiniteDuration()));
  EXPECT_THAT(SecondsFlagValue("--upload-idle-seconds", std::numeric_limits<double>::quiet_NaN()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--upload-idle-seconds: a number of seconds expected, got nan"));
}

TEST(ScaleFlagValueTest, MultipliesOrNamesTheFlag) {
  EXPECT_THAT(ScaleFlagValue("--max-message-mb", 256, 20), HoldsValue(268435456));
  EXPECT_THAT(ScaleFlagValue("--max-message-mb", -5, 20), HoldsValue(-5242880));
  EXPECT_THAT(ScaleFlagValue("--max-work-gmacs", 1024, 30),
              HoldsValue(int64_t{1099511627776}));  // 2^40
  // (2^63 - 1) >> 20 = 2^43 - 1 = 8796093022207 MiB fits: 2^63 - 2^20.
  EXPECT_THAT(ScaleFlagValue("--gpu-memory-budget-mb", 8796093022207, 20),
              HoldsValue(int64_t{9223372036853727232}));
  // -2^43 MiB = -2^63 fits; one more either way does not.
  EXPECT_THAT(ScaleFlagValue("--gpu-memory-budget-mb", -8796093022208, 20),
              HoldsValue(std::numeric_limits<int64_t>::min()));
  EXPECT_THAT(ScaleFlagValue("--gpu-memory-budget-mb", 8796093022208, 20),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--gpu-memory-budget-mb: 8796093022208 is out of range (times 2^20, over "
                       "64 bits)"));
  EXPECT_THAT(ScaleFlagValue("--cublaslt-workspace-mb", -8796093022209, 20),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--cublaslt-workspace-mb")));
  // 2^33 GMACs = 2^63 multiply-adds.
  EXPECT_THAT(ScaleFlagValue("--max-work-gmacs", int64_t{1} << 33, 30),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--max-work-gmacs")));
}

// ---------------------------------------------------------------------
// A flag and its old name

using SizeFlag = FlagValue<int64_t>;
using TimeFlag = FlagValue<absl::Duration>;
using AutoSizeFlag = FlagValue<std::optional<int64_t>>;

TEST(ResolveFlagTest, NeitherGivenIsTheFlagsDefault) {
  std::set<std::string> old;
  EXPECT_THAT(ResolveFlag(SizeFlag{"--max-message", 256 * kMiB, false},
                          SizeFlag{"--max-message-mb", 256 * kMiB, false}, &old),
              HoldsValue(256 * kMiB));
  EXPECT_THAT(old, IsEmpty());
}

TEST(ResolveFlagTest, TheNewNameAlone) {
  std::set<std::string> old;
  EXPECT_THAT(ResolveFlag(SizeFlag{"--max-message", 64 * kMiB, true},
                          SizeFlag{"--max-message-mb", 256 * kMiB, false}, &old),
              HoldsValue(64 * kMiB));
  EXPECT_THAT(old, IsEmpty());
}

TEST(ResolveFlagTest, TheOldNameAloneIsRecordedForMessages) {
  std::set<std::string> old;
  EXPECT_THAT(ResolveFlag(SizeFlag{"--max-message", 256 * kMiB, false},
                          SizeFlag{"--max-message-mb", 8 * kMiB, true}, &old),
              HoldsValue(8 * kMiB));
  EXPECT_THAT(old, UnorderedElementsAre("--max-message-mb"));
}

TEST(ResolveFlagTest, BothWithOneValueAgree) {
  std::set<std::string> old;
  EXPECT_THAT(ResolveFlag(TimeFlag{"--max-request-time", absl::Minutes(5), true},
                          TimeFlag{"--max-request-seconds", absl::Seconds(300), true}, &old),
              HoldsValue(absl::Seconds(300)));
  EXPECT_THAT(old, IsEmpty());
}

TEST(ResolveFlagTest, BothWithDifferentValuesNameBoth) {
  std::set<std::string> old;
  EXPECT_THAT(ResolveFlag(SizeFlag{"--max-message", 512 * kMiB, true},
                          SizeFlag{"--max-message-mb", 256 * kMiB, true}, &old),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--max-message and --max-message-mb: two names of one option, given "
                       "different values (512MiB and 256MiB); give one of them"));
  EXPECT_THAT(ResolveFlag(TimeFlag{"--upload-idle", absl::Seconds(10), true},
                          TimeFlag{"--upload-idle-seconds", absl::Seconds(5), true}, &old),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--upload-idle and --upload-idle-seconds: two names of one option, given "
                       "different values (10s and 5s); give one of them"));
  EXPECT_THAT(old, IsEmpty());
}

TEST(ResolveFlagTest, AutoOrASize) {
  std::set<std::string> old;
  EXPECT_THAT(ResolveFlag(AutoSizeFlag{"--store-size", std::nullopt, true},
                          AutoSizeFlag{"--store-bytes", int64_t{5}, true}, &old),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "--store-size and --store-bytes: two names of one option, given "
                       "different values (auto and 5); give one of them"));
  EXPECT_THAT(ResolveFlag(AutoSizeFlag{"--store-size", std::nullopt, false},
                          AutoSizeFlag{"--store-bytes", int64_t{8} << 30, true}, &old),
              HoldsValue(std::optional<int64_t>(int64_t{8} << 30)));
  EXPECT_THAT(old, UnorderedElementsAre("--store-bytes"));
}

// ---------------------------------------------------------------------
// What Start makes of the options

TEST(PlanThreadsTest, ZeroIsOnePerCoreAndMinusOneBlasThreadsFollowTheWorkers) {
  ServerOptions o;              // threads 0, stats threads 0
  o.backends.cpu_threads = -1;  // --cpu-threads' default
  ThreadPlan p = PlanThreads(o, 8);
  EXPECT_EQ(p.workers, 8);
  EXPECT_EQ(p.stats_threads, 8);
  EXPECT_EQ(p.cpu_threads, 1);  // 8 workers side by side: one BLAS thread per GEMM
  p = PlanThreads(o, 1);
  EXPECT_EQ(p.workers, 1);
  EXPECT_EQ(p.stats_threads, 1);
  EXPECT_EQ(p.cpu_threads, 0);  // one worker: every core
  p = PlanThreads(o, 0);        // hardware_concurrency unknown: one
  EXPECT_EQ(p.workers, 1);
  o.workers = 1;
  o.engine.stats_threads = 3;
  p = PlanThreads(o, 16);
  EXPECT_EQ(p.workers, 1);
  EXPECT_EQ(p.stats_threads, 3);
  EXPECT_EQ(p.cpu_threads, 0);
  o.workers = 2;
  o.backends.cpu_threads = 4;  // given: kept
  p = PlanThreads(o, 16);
  EXPECT_EQ(p.workers, 2);
  EXPECT_EQ(p.cpu_threads, 4);
}

TEST(EffectiveLimitsTest, TheInlineTensorLimitDefaultsAndStaysWithinAMessage) {
  ServerOptions o;
  o.engine.limits.max_message_bytes = 512 * kMiB;
  o.engine.limits.max_tensor_bytes = 0;
  EXPECT_EQ(EffectiveLimits(o).max_tensor_bytes, 256 * kMiB);  // the default
  o.engine.limits.max_message_bytes = 8 * kMiB;
  EXPECT_EQ(EffectiveLimits(o).max_tensor_bytes, 8 * kMiB);  // the message, smaller
  o.engine.limits.max_tensor_bytes = 300 * kMiB;             // a caller's, over the message
  EXPECT_EQ(EffectiveLimits(o).max_tensor_bytes, 8 * kMiB);
  o.engine.limits.max_tensor_bytes = kMiB;
  EXPECT_EQ(EffectiveLimits(o).max_tensor_bytes, kMiB);
  EXPECT_EQ(EffectiveLimits(o).max_message_bytes, 8 * kMiB);
}

TEST(EffectiveInlineOutputBytesTest, AtMostHalfAMessage) {
  ServerOptions o;
  o.engine.limits.max_message_bytes = kMiB;
  o.inline_output_bytes = 4 * kMiB;
  EXPECT_EQ(EffectiveInlineOutputBytes(o), 512 * 1024);
  o.inline_output_bytes = 1024;
  EXPECT_EQ(EffectiveInlineOutputBytes(o), 1024);
}

std::map<std::string, int> Arguments(const TensorCheckServer::ChannelSettings& settings) {
  std::map<std::string, int> args;
  for (const auto& [name, value] : settings.arguments) {
    EXPECT_TRUE(args.emplace(name, value).second) << name << " set twice";
  }
  return args;
}

TEST(ChannelTest, TheApiPortsSettings) {
  ServerOptions o;
  o.engine.limits.max_message_bytes = 256 * kMiB;
  o.max_inflight_bytes = int64_t{1} << 30;
  TensorCheckServer::ChannelSettings s = TensorCheckServer::ApiChannel(o);
  EXPECT_EQ(s.max_receive_message_bytes, 268435456);
  EXPECT_EQ(s.max_send_message_bytes, 268435456);
  EXPECT_EQ(s.resource_quota_bytes, int64_t{2} << 30);  // 2 x 1 GiB > 3 x 256 MiB
  EXPECT_THAT(
      Arguments(s),
      UnorderedElementsAre(Pair(GRPC_ARG_ALLOW_REUSEPORT, 0), Pair(GRPC_ARG_HTTP2_BDP_PROBE, 0),
                           Pair(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 300000),  // 5 min
                           Pair(GRPC_ARG_KEEPALIVE_TIME_MS, 60000),
                           Pair(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000),
                           Pair(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000),
                           Pair(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1)));
  // A small budget: the quota is 3 messages; zero durations set nothing.
  o.max_inflight_bytes = 100 * kMiB;
  o.max_connection_idle = absl::ZeroDuration();
  o.keepalive_time = absl::ZeroDuration();
  o.min_client_ping_interval = absl::ZeroDuration();
  s = TensorCheckServer::ApiChannel(o);
  EXPECT_EQ(s.resource_quota_bytes, 768 * kMiB);
  EXPECT_THAT(Arguments(s), UnorderedElementsAre(Pair(GRPC_ARG_ALLOW_REUSEPORT, 0),
                                                 Pair(GRPC_ARG_HTTP2_BDP_PROBE, 0)));
  // Unlimited: no quota; the largest budget does not overflow it.
  o.max_inflight_bytes = 0;
  EXPECT_EQ(TensorCheckServer::ApiChannel(o).resource_quota_bytes, 0);
  o.max_inflight_bytes = kInt64Max;
  EXPECT_EQ(TensorCheckServer::ApiChannel(o).resource_quota_bytes, kInt64Max);
}

TEST(ChannelTest, TheHealthPortKeepsConnectionsShort) {
  ServerOptions o;  // idle 5 min: the port's 30 s is shorter
  TensorCheckServer::ChannelSettings s = TensorCheckServer::HealthChannel(o);
  EXPECT_EQ(s.max_receive_message_bytes, 4096);
  EXPECT_EQ(s.max_send_message_bytes, std::nullopt);
  EXPECT_EQ(s.resource_quota_bytes, 0);
  EXPECT_THAT(Arguments(s),
              UnorderedElementsAre(
                  Pair(GRPC_ARG_ALLOW_REUSEPORT, 0), Pair(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 30000),
                  Pair(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000),
                  Pair(GRPC_ARG_MAX_CONNECTION_AGE_MS, 300000),
                  Pair(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 10000),
                  Pair(GRPC_ARG_MAX_CONCURRENT_STREAMS, 4), Pair(GRPC_ARG_KEEPALIVE_TIME_MS, 60000),
                  Pair(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000),
                  Pair(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000),
                  Pair(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1)));
  // --max-connection-idle 4s: idle and handshake both 4 s.
  o.max_connection_idle = absl::Seconds(4);
  std::map<std::string, int> args = Arguments(TensorCheckServer::HealthChannel(o));
  EXPECT_EQ(args[GRPC_ARG_MAX_CONNECTION_IDLE_MS], 4000);
  EXPECT_EQ(args[GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS], 4000);
  // 0 (never on the API port): the health port's own 30 s and 10 s.
  o.max_connection_idle = absl::ZeroDuration();
  args = Arguments(TensorCheckServer::HealthChannel(o));
  EXPECT_EQ(args[GRPC_ARG_MAX_CONNECTION_IDLE_MS], 30000);
  EXPECT_EQ(args[GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS], 10000);
}

// ---------------------------------------------------------------------
// TensorCheckServer::Build: everything but the ports.

class BuildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("server_options_test_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    options_.host = "127.0.0.1";
    options_.port = 0;
    options_.workers = 2;
    options_.engine.stats_threads = 2;
    options_.store_bytes = 0;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  ServerOptions options_;
};

TEST_F(BuildTest, BuildsWithoutListening) {
  options_.engine.limits.max_message_bytes = 8 * kMiB;
  options_.engine.limits.max_tensor_bytes = 0;
  options_.metrics_port = 9464;  // not bound by Build
  options_.backends.cpu_threads = -1;
  absl::StatusOr<std::unique_ptr<TensorCheckServer>> server = TensorCheckServer::Build(options_);
  ASSERT_THAT(server, IsOk());
  TensorCheckServer& s = **server;
  EXPECT_EQ(s.port(), 0);
  EXPECT_EQ(s.health_port(), 0);
  EXPECT_EQ(s.metrics_port(), 0);
  EXPECT_EQ(s.metrics_address(), "");
  EXPECT_NE(s.metrics(), nullptr);  // made, served once Listen binds it
  EXPECT_FALSE(s.tls());
  EXPECT_EQ(s.store(), nullptr);
  EXPECT_EQ(s.workers(), 2);
  EXPECT_EQ(s.options().backends.cpu_threads, 1);  // -1 with 2 workers
  // 0: 256 MiB or the message's 8 MiB, the smaller.
  EXPECT_EQ(s.engine().options().limits.max_tensor_bytes, 8 * kMiB);
  EXPECT_EQ(s.engine().options().limits.max_message_bytes, 8 * kMiB);
}

TEST_F(BuildTest, TheStoreTakesItsBudgetAndCapsTheLargestTensor) {
  options_.store_bytes = 8 * kMiB;
  options_.max_stored_tensor_bytes = int64_t{16} << 30;
  options_.partial_upload_ttl = absl::Seconds(42);
  absl::StatusOr<std::unique_ptr<TensorCheckServer>> server = TensorCheckServer::Build(options_);
  ASSERT_THAT(server, IsOk());
  TensorStore* store = (*server)->store();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->options().budget_bytes, 8 * kMiB);
  EXPECT_EQ(store->max_tensor_bytes(), 8 * kMiB);  // 16 GiB capped at the budget
  EXPECT_EQ(store->options().partial_upload_ttl, absl::Seconds(42));
}

TEST_F(BuildTest, AutoStoreIsAQuarterOfMemory) {
  options_.store_bytes = -1;
  absl::StatusOr<std::unique_ptr<TensorCheckServer>> server = TensorCheckServer::Build(options_);
  ASSERT_THAT(server, IsOk());
  ASSERT_NE((*server)->store(), nullptr);
  EXPECT_EQ((*server)->store()->options().budget_bytes, TensorCheckServer::DefaultStoreBytes());
}

TEST_F(BuildTest, AStoreDirectoryItCannotUseFailsTheBuild) {
  const fs::path file = dir_ / "a_file";
  std::ofstream(file) << "not a directory";
  options_.store_bytes = 8 * kMiB;
  options_.store_dir = file.string();
  EXPECT_THAT(TensorCheckServer::Build(options_),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(file.string())));
}

TEST_F(BuildTest, AMissingTokensFileFailsTheBuild) {
  options_.tokens_file = (dir_ / "absent.json").string();
  absl::StatusOr<std::unique_ptr<TensorCheckServer>> server = TensorCheckServer::Build(options_);
  EXPECT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("absent.json"));
}

TEST_F(BuildTest, TlsFilesThatDoNotLoadFailTheBuildNamingTheFlag) {
  options_.tls = {(dir_ / "absent.crt").string(), (dir_ / "absent.key").string(), ""};
  EXPECT_THAT(TensorCheckServer::Build(options_),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("--tls-cert " + (dir_ / "absent.crt").string())));
  std::ofstream(dir_ / "garbage.crt") << "not PEM";
  std::ofstream(dir_ / "garbage.key") << "not PEM";
  options_.tls = {(dir_ / "garbage.crt").string(), (dir_ / "garbage.key").string(), ""};
  EXPECT_THAT(TensorCheckServer::Build(options_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no PEM certificate")));
}

TEST_F(BuildTest, AnUnknownDefaultReferenceFailsTheBuild) {
  options_.engine.default_reference = "nosuch:fp64";
  absl::StatusOr<std::unique_ptr<TensorCheckServer>> server = TensorCheckServer::Build(options_);
  EXPECT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("nosuch"));
}

}  // namespace
}  // namespace tensorcheck
