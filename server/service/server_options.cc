#include "server/service/server_options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/common.h"

namespace tensorcheck {

namespace {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kTiB = int64_t{1} << 40;
constexpr int64_t kMaxMessageBytes = 2047 * kMiB;  // gRPC's sizes are ints
constexpr absl::Duration kDay = absl::Hours(24);

struct Suffix {
  absl::string_view text;
  int64_t multiplier;
};
constexpr Suffix kSuffixes[] = {
    {"", 1},
    {"B", 1},
    {"K", kKiB},
    {"KiB", kKiB},
    {"KB", 1000},
    {"M", kMiB},
    {"MiB", kMiB},
    {"MB", 1000 * 1000},
    {"G", kGiB},
    {"GiB", kGiB},
    {"GB", 1000 * 1000 * 1000},
    {"T", kTiB},
    {"TiB", kTiB},
    {"TB", int64_t{1000} * 1000 * 1000 * 1000},
};
constexpr char kSuffixHelp[] =
    "B; K, M, G, T or KiB, MiB, GiB, TiB (binary); KB, MB, GB, TB (decimal)";

// An option whose flag was renamed: its flag, its old flag and the old
// flag's unit (docs/operations.md, "Flags: names, units, old names").
enum class OldUnit { kBytes, kMiB, kSeconds };
struct Renamed {
  absl::string_view flag;
  absl::string_view old_flag;
  OldUnit old_unit;
};
constexpr Renamed kMaxMessage{"--max-message", "--max-message-mb", OldUnit::kMiB};
constexpr Renamed kMaxInlineTensor{"--max-inline-tensor", "--max-tensor-mb", OldUnit::kMiB};
constexpr Renamed kMaxInflight{"--max-inflight", "--max-inflight-bytes", OldUnit::kBytes};
constexpr Renamed kMaxRequestTime{"--max-request-time", "--max-request-seconds", OldUnit::kSeconds};
constexpr Renamed kMaxConnectionIdle{"--max-connection-idle", "--max-connection-idle-seconds",
                                     OldUnit::kSeconds};
constexpr Renamed kKeepaliveTime{"--keepalive-time", "--keepalive-seconds", OldUnit::kSeconds};
constexpr Renamed kStoreSize{"--store-size", "--store-bytes", OldUnit::kBytes};
constexpr Renamed kMaxStoredTensor{"--max-stored-tensor", "--max-tensor-bytes", OldUnit::kBytes};
constexpr Renamed kPartialUploadTtl{"--partial-upload-ttl", "--partial-upload-seconds",
                                    OldUnit::kSeconds};
constexpr Renamed kUploadIdle{"--upload-idle", "--upload-idle-seconds", OldUnit::kSeconds};
constexpr Renamed kMaxInlineOutput{"--max-inline-output", "--inline-output-bytes", OldUnit::kBytes};
constexpr Renamed kGpuMemoryBudget{"--gpu-memory-budget", "--gpu-memory-budget-mb", OldUnit::kMiB};
constexpr Renamed kCublasltWorkspace{"--cublaslt-workspace", "--cublaslt-workspace-mb",
                                     OldUnit::kMiB};
constexpr Renamed kShutdownGrace{"--shutdown-grace", "--shutdown-grace-seconds", OldUnit::kSeconds};
constexpr Renamed kCredentialsReload{"--credentials-reload", "--credentials-reload-seconds",
                                     OldUnit::kSeconds};

// A renamed option as the command line named it: by its old flag when
// main.cc recorded that one, else by its flag; values in that flag's unit.
class Named {
 public:
  Named(const ServerOptions& options, const Renamed& renamed)
      : renamed_(renamed), old_(options.old_flag_names.count(std::string(renamed.old_flag)) > 0) {}

  bool old() const { return old_; }
  absl::string_view flag() const { return old_ ? renamed_.old_flag : renamed_.flag; }
  std::string Size(int64_t bytes) const {
    if (!old_) return FormatByteSize(bytes);
    if (renamed_.old_unit != OldUnit::kMiB) return absl::StrCat(bytes);
    if (bytes % kMiB == 0) return absl::StrCat(bytes / kMiB);
    return absl::StrCat(bytes, " bytes");  // set in bytes by a caller, not by the flag
  }
  std::string Time(absl::Duration d) const {
    return old_ ? absl::StrCat(absl::ToDoubleSeconds(d)) : absl::FormatDuration(d);
  }

 private:
  const Renamed& renamed_;
  const bool old_;
};

absl::Status Bad(absl::string_view flag, absl::string_view expected, absl::string_view got) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", expected, " expected, got ", got));
}

absl::Status CheckPort(absl::string_view flag, int port, absl::string_view zero) {
  if (port >= 0 && port <= 65535) return absl::OkStatus();
  return Bad(flag, absl::StrCat(zero, " or 1..65535"), absl::StrCat(port));
}

// A duration in (0, max].
absl::Status CheckPositive(const Named& n, absl::Duration d, absl::Duration max) {
  if (d > absl::ZeroDuration() && d <= max) return absl::OkStatus();
  return Bad(n.flag(), absl::StrCat("a value in (0, ", n.Time(max), "]"), n.Time(d));
}

// A duration in [0, max].
absl::Status CheckNonNegative(const Named& n, absl::Duration d, absl::Duration max) {
  if (d >= absl::ZeroDuration() && d <= max) return absl::OkStatus();
  return Bad(n.flag(), absl::StrCat(n.Time(absl::ZeroDuration()), "..", n.Time(max)), n.Time(d));
}

// The same for an option without a flag (ServerOptions' field name).
absl::Status CheckNonNegative(absl::string_view field, absl::Duration d, absl::Duration max) {
  if (d >= absl::ZeroDuration() && d <= max) return absl::OkStatus();
  return Bad(field, absl::StrCat("0..", absl::FormatDuration(max)), absl::FormatDuration(d));
}

// Two ports, the second named by `other`, on one address: the same
// number is one port, which cannot serve both.
absl::Status CheckDistinct(absl::string_view flag, int port, absl::string_view other,
                           int other_port, absl::string_view what) {
  if (port == 0 || port != other_port) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", port, " is ", other, " too; ", what, " needs a port of its own"));
}

std::string ShowGmacs(int64_t macs) {
  if (macs % kGiB == 0) return absl::StrCat(macs / kGiB);
  return absl::StrCat(macs, " multiply-adds");
}

template <typename T, typename Show>
absl::StatusOr<T> Resolve(const FlagValue<T>& flag, const FlagValue<T>& old_flag,
                          std::set<std::string>* old_flag_names, Show show) {
  if (flag.given && old_flag.given && flag.value != old_flag.value) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag.name, " and ", old_flag.name, ": two names of one option, given different values (",
        show(flag.value), " and ", show(old_flag.value), "); give one of them"));
  }
  if (old_flag.given && !flag.given) {
    old_flag_names->insert(std::string(old_flag.name));
    return old_flag.value;
  }
  return flag.value;
}

}  // namespace

absl::Status Validate(const ServerOptions& o) {
  // Where it listens.
  if (o.host.empty()) return Bad("--host", "an address (0.0.0.0: every address)", "''");
  if (absl::Status s = CheckPort("--port", o.port, "0 (a free port)"); !s.ok()) return s;
  if (absl::Status s = CheckPort("--metrics-port", o.metrics_port, "0 (no endpoint)"); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPort("--health-port", o.health_port, "0 (none)"); !s.ok()) return s;
  // The metrics endpoint may listen on another address (metrics_host);
  // the API and the health port share `host`.
  const bool metrics_beside = o.metrics_host.empty() || o.metrics_host == o.host;
  if (metrics_beside) {
    if (absl::Status s = CheckDistinct("--metrics-port", o.metrics_port, "--port", o.port,
                                       "the metrics endpoint");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s =
          CheckDistinct("--health-port", o.health_port, "--port", o.port, "the health service");
      !s.ok()) {
    return s;
  }
  if (metrics_beside) {
    if (absl::Status s = CheckDistinct("--health-port", o.health_port, "--metrics-port",
                                       o.metrics_port, "the health service");
        !s.ok()) {
      return s;
    }
  }

  // Requests.
  const RequestLimits& limits = o.engine.limits;
  const Named message(o, kMaxMessage);
  if (limits.max_message_bytes < kMiB || limits.max_message_bytes > kMaxMessageBytes) {
    return Bad(message.flag(),
               absl::StrCat(message.Size(kMiB), "..", message.Size(kMaxMessageBytes)),
               message.Size(limits.max_message_bytes));
  }
  const Named tensor(o, kMaxInlineTensor);
  if (limits.max_tensor_bytes < 0 || limits.max_tensor_bytes > limits.max_message_bytes) {
    return Bad(tensor.flag(),
               absl::StrCat("0 (the smaller of ", tensor.Size(kDefaultMaxInlineTensorBytes),
                            " and ", message.flag(), ") or 1..",
                            tensor.Size(limits.max_message_bytes), " (", message.flag(), ")"),
               tensor.Size(limits.max_tensor_bytes));
  }
  const Named inflight(o, kMaxInflight);
  if (o.max_inflight_bytes < 0) {
    return Bad(inflight.flag(), "0 (unlimited) or a positive size",
               inflight.Size(o.max_inflight_bytes));
  }
  if (absl::Status s = CheckPositive(Named(o, kMaxRequestTime), o.max_request_time, kDay);
      !s.ok()) {
    return s;
  }
  if (limits.max_work_macs < kGiB || limits.max_work_macs > (int64_t{1} << 62)) {
    return Bad("--max-work-gmacs", "1..2^32", ShowGmacs(limits.max_work_macs));
  }
  if (o.max_queue < 1) return Bad("--max-queue", "a positive count", absl::StrCat(o.max_queue));

  // Connections.
  if (absl::Status s = CheckNonNegative(Named(o, kMaxConnectionIdle), o.max_connection_idle, kDay);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckNonNegative(Named(o, kKeepaliveTime), o.keepalive_time, kDay);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckNonNegative("keepalive_timeout", o.keepalive_timeout, kDay); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckNonNegative("min_client_ping_interval", o.min_client_ping_interval, kDay);
      !s.ok()) {
    return s;
  }

  // Threads.
  if (o.workers < 0) {
    return Bad("--threads", "0 (one per core) or a positive count", absl::StrCat(o.workers));
  }
  if (o.engine.stats_threads < 0) {
    return Bad("--stats-threads", "0 (one per core) or a positive count",
               absl::StrCat(o.engine.stats_threads));
  }
  if (o.backends.cpu_threads < -1) {
    return Bad("--cpu-threads",
               "-1 (one per GEMM beside other workers), 0 (all cores) or a positive count",
               absl::StrCat(o.backends.cpu_threads));
  }

  // The tensor store.
  const Named store(o, kStoreSize);
  if (o.store_bytes < -1) {
    return Bad(store.flag(),
               absl::StrCat(store.old() ? "-1" : "auto",
                            " (a quarter of memory), 0 (no store) or a positive size"),
               store.Size(o.store_bytes));
  }
  const Named stored(o, kMaxStoredTensor);
  if (o.max_stored_tensor_bytes < 1) {
    return Bad(stored.flag(), "a positive size", stored.Size(o.max_stored_tensor_bytes));
  }
  if (absl::Status s = CheckPositive(Named(o, kPartialUploadTtl), o.partial_upload_ttl, 7 * kDay);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckPositive(Named(o, kUploadIdle), o.upload_idle, kDay); !s.ok()) {
    return s;
  }
  const Named output(o, kMaxInlineOutput);
  if (o.inline_output_bytes < 0) {
    return Bad(output.flag(), "0 or a positive size", output.Size(o.inline_output_bytes));
  }

  // The GPU.
  if (o.backends.gpu_lanes < 1) {
    return Bad("--gpu-lanes", "a positive count", absl::StrCat(o.backends.gpu_lanes));
  }
  const Named budget(o, kGpuMemoryBudget);
  if (o.backends.gpu_memory_budget_bytes < 0) {
    return Bad(budget.flag(), "0 (90% of the free memory) or a positive size",
               budget.Size(o.backends.gpu_memory_budget_bytes));
  }
  const Named workspace(o, kCublasltWorkspace);
  if (o.backends.cublaslt_workspace_bytes < 0) {
    return Bad(workspace.flag(), "0 or a positive size",
               workspace.Size(o.backends.cublaslt_workspace_bytes));
  }

  // Credentials.
  if (absl::Status s = CheckNonNegative(Named(o, kCredentialsReload), o.credentials_reload, kDay);
      !s.ok()) {
    return s;
  }
  if (o.tls.cert.empty() != o.tls.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-cert and --tls-key: both or neither expected (TLS needs the certificate and its "
        "key), got ",
        o.tls.cert.empty() ? "--tls-key" : "--tls-cert", " alone"));
  }
  if (!o.tls.enabled() && !o.tls.client_ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca: needs --tls-cert and --tls-key (mutual TLS is TLS)");
  }

  // The process.
  if (o.log_format != "text" && o.log_format != "json") {
    return Bad("--log-format", "text or json", absl::StrCat("'", o.log_format, "'"));
  }
  if (spdlog::level::from_str(o.log_level) == spdlog::level::off && o.log_level != "off") {
    return Bad("--log-level", "trace, debug, info, warn, error, critical or off",
               absl::StrCat("'", o.log_level, "'"));
  }
  if (absl::Status s = CheckNonNegative(Named(o, kShutdownGrace), o.shutdown_grace, kDay);
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[digits]))) {
    ++digits;
  }
  if (digits == 0) {
    if (!s.empty() && s[0] == '-') {
      return absl::InvalidArgumentError(absl::StrCat("a size is not negative, got '", text, "'"));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "a size expected (a whole number of bytes, or with a suffix: 4GiB, 512MB), got '", text,
        "'"));
  }
  const absl::string_view suffix = s.substr(digits);
  const Suffix* found = nullptr;
  for (const Suffix& candidate : kSuffixes) {
    if (candidate.text == suffix) found = &candidate;
  }
  if (found == nullptr && !suffix.empty() && suffix[0] == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': a whole number expected (1536MiB, not 1.5GiB)"));
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': unknown suffix '", suffix, "' (", kSuffixHelp, ")"));
  }
  int64_t number = 0;
  if (!absl::SimpleAtoi(s.substr(0, digits), &number) ||
      number > std::numeric_limits<int64_t>::max() / found->multiplier) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "': over the largest size, 2^63-1 bytes"));
  }
  return number * found->multiplier;
}

std::string FormatByteSize(int64_t bytes) {
  if (bytes == 0) return "0";
  const char* sign = bytes < 0 ? "-" : "";
  // The magnitude, also of the most negative value.
  const uint64_t magnitude =
      bytes < 0 ? uint64_t{0} - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  struct Unit {
    uint64_t size;
    const char* name;
  };
  for (const Unit& unit : {Unit{uint64_t{1} << 40, "TiB"}, Unit{uint64_t{1} << 30, "GiB"},
                           Unit{uint64_t{1} << 20, "MiB"}, Unit{uint64_t{1} << 10, "KiB"}}) {
    if (magnitude % unit.size == 0) return absl::StrCat(sign, magnitude / unit.size, unit.name);
  }
  return absl::StrCat(sign, magnitude);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<int64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return FormatByteSize(size.bytes); }

bool AbslParseFlag(absl::string_view text, ByteSizeOrAuto* size, std::string* error) {
  if (absl::StripAsciiWhitespace(text) == "auto") {
    size->bytes = std::nullopt;
    return true;
  }
  ByteSize parsed;
  if (!AbslParseFlag(text, &parsed, error)) {
    *error = absl::StrCat("auto or a size expected; ", *error);
    return false;
  }
  size->bytes = parsed.bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSizeOrAuto size) {
  return size.bytes.has_value() ? FormatByteSize(*size.bytes) : "auto";
}

absl::StatusOr<int64_t> ScaleFlagValue(absl::string_view flag, int64_t value, int shift) {
  const int64_t factor = int64_t{1} << shift;
  if (value > std::numeric_limits<int64_t>::max() / factor ||
      value < std::numeric_limits<int64_t>::min() / factor) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": ", value, " is out of range (times 2^", shift, ", over 64 bits)"));
  }
  return value * factor;
}

absl::StatusOr<absl::Duration> SecondsFlagValue(absl::string_view flag, double seconds) {
  if (std::isnan(seconds)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": a number of seconds expected, got nan"));
  }
  if (std::isinf(seconds))
    return seconds > 0 ? absl::InfiniteDuration() : -absl::InfiniteDuration();
  return absl::Seconds(seconds);
}

absl::StatusOr<int64_t> ResolveFlag(const FlagValue<int64_t>& flag,
                                    const FlagValue<int64_t>& old_flag,
                                    std::set<std::string>* old_flag_names) {
  return Resolve(flag, old_flag, old_flag_names, FormatByteSize);
}

absl::StatusOr<absl::Duration> ResolveFlag(const FlagValue<absl::Duration>& flag,
                                           const FlagValue<absl::Duration>& old_flag,
                                           std::set<std::string>* old_flag_names) {
  return Resolve(flag, old_flag, old_flag_names,
                 [](absl::Duration d) { return absl::FormatDuration(d); });
}

absl::StatusOr<std::optional<int64_t>> ResolveFlag(
    const FlagValue<std::optional<int64_t>>& flag,
    const FlagValue<std::optional<int64_t>>& old_flag, std::set<std::string>* old_flag_names) {
  return Resolve(flag, old_flag, old_flag_names, [](std::optional<int64_t> bytes) {
    return bytes.has_value() ? FormatByteSize(*bytes) : std::string("auto");
  });
}

ThreadPlan PlanThreads(const ServerOptions& options, int hardware_threads) {
  const int hw = std::max(1, hardware_threads);
  ThreadPlan plan;
  plan.workers = options.workers > 0 ? options.workers : hw;
  plan.stats_threads = options.engine.stats_threads > 0 ? options.engine.stats_threads : hw;
  plan.cpu_threads = options.backends.cpu_threads;
  if (plan.cpu_threads == -1) plan.cpu_threads = plan.workers > 1 ? 1 : 0;
  return plan;
}

RequestLimits EffectiveLimits(const ServerOptions& options) {
  RequestLimits limits = options.engine.limits;
  if (limits.max_tensor_bytes == 0) limits.max_tensor_bytes = kDefaultMaxInlineTensorBytes;
  limits.max_tensor_bytes = std::min(limits.max_tensor_bytes, limits.max_message_bytes);
  return limits;
}

int64_t EffectiveInlineOutputBytes(const ServerOptions& options) {
  return std::min(options.inline_output_bytes, options.engine.limits.max_message_bytes / 2);
}

}  // namespace tensorcheck
