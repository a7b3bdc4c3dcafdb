// ServerOptions: what TensorCheckServer::Start and main.cc make a server
// of, and Validate, the one place that checks them, before anything
// listens (docs/operations.md, "Flags: names, units, old names").
//
//   ServerOptions options;                  // main.cc: copied from the flags
//   options.max_inflight_bytes = 0;         // 0: unlimited
//   if (absl::Status s = Validate(options); !s.ok()) {
//     std::cerr << s.message() << "\n";     // "--max-inflight: ..."
//     return 2;
//   }
//   TC_ASSIGN_OR_RETURN(auto server, TensorCheckServer::Start(options));
//
// Also here: the parser of the size flags ("4GiB", ParseByteSize) and the
// pieces main.cc turns an old flag name into its option with
// (ResolveFlag, ScaleFlagValue, SecondsFlagValue), and what Start makes of
// the options before it builds anything (PlanThreads, EffectiveLimits,
// EffectiveInlineOutputBytes).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/backends/linear_backend.h"
#include "server/engine/engine.h"
#include "server/service/tls.h"

namespace tensorcheck {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 50051;
  // Worker threads running requests; 0: hardware concurrency.
  int workers = 0;
  int max_queue = 64;
  // Host bytes all requests in flight may hold (admission by bytes,
  // service/admission.h); also the size of gRPC's ResourceQuota for
  // messages being received. 0: unlimited.
  int64_t max_inflight_bytes = int64_t{4} << 30;
  // The longest one request may run when its client set no shorter
  // deadline.
  absl::Duration max_request_time = absl::Seconds(300);
  // Connections: an idle one (no call for this long) is closed; the
  // server pings an idle connection every keepalive_time and drops it if
  // no answer comes within keepalive_timeout; clients may ping as often as
  // every min_client_ping_interval. Zero: gRPC's default.
  absl::Duration max_connection_idle = absl::Minutes(5);
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration min_client_ping_interval = absl::Seconds(10);
  // The tensor store (docs/api.md): its byte budget (0: no store; -1: a
  // quarter of the host's memory, or of the container's limit), the
  // largest tensor it takes (capped at the budget), a directory that keeps
  // it across restarts (empty: memory only), how long an interrupted
  // upload is kept, and the returned-output size above which outputs are
  // answered by digest (at most half of engine.limits.max_message_bytes:
  // EffectiveInlineOutputBytes).
  int64_t store_bytes = -1;
  int64_t max_stored_tensor_bytes = int64_t{16} << 30;
  std::string store_dir;
  absl::Duration partial_upload_ttl = absl::Minutes(10);
  int64_t inline_output_bytes = int64_t{4} << 20;
  // An upload stream silent this long is cancelled (kept for resuming).
  absl::Duration upload_idle = absl::Seconds(60);
  // backends.cpu_threads may be -1 here: one BLAS thread per GEMM when
  // several workers run, all cores with one (PlanThreads).
  BuiltinBackendOptions backends;
  // Request limits (engine.limits; max_message_bytes is gRPC's message
  // size too; max_tensor_bytes 0: kDefaultMaxInlineTensorBytes or
  // max_message_bytes when smaller, see EffectiveLimits), the reference,
  // statistics threads (engine.stats_threads: the size of the one
  // statistics pool all requests share; 0: hardware concurrency).
  // engine.executor is ignored: the server makes its own.
  EngineOptions engine;
  // Called when a request hits an error that leaves the device unusable.
  std::function<void(const absl::Status&)> on_fatal;
  // Prometheus metrics (docs/operations.md, "Metrics") at
  // http://metrics_host:metrics_port/metrics; port 0: none. An empty host
  // is `host`.
  int metrics_port = 0;
  std::string metrics_host;
  // Bearer tokens to tenants (tenants.h, docs/operations.md "Tenants and
  // tokens"); empty: no authentication, one shared store. Read again every
  // credentials_reload when its content changed, and on
  // ReloadCredentials() (SIGHUP).
  std::string tokens_file;
  absl::Duration credentials_reload = absl::Seconds(5);
  // TLS on `port` (tls.h); off when tls.cert and tls.key are empty. The
  // files are re-read every credentials_reload (at least a second).
  TlsFiles tls;
  // A second, plaintext port that serves only the health service, for
  // probes that cannot speak TLS (Kubernetes' gRPC probes); 0: none.
  int health_port = 0;

  // The process's, which main.cc applies and Start ignores: the log's
  // level (spdlog's names: trace, debug, info, warn, error, critical,
  // off) and format (text or json), and the time requests in flight get
  // to finish on SIGTERM (TensorCheckServer::Shutdown's grace).
  std::string log_level = "info";
  std::string log_format = "text";
  absl::Duration shutdown_grace = absl::Seconds(30);

  // For Validate's messages alone: the old flag names ("--max-message-mb")
  // the command line set options with (main.cc records them). A bad value
  // is then named by the flag the operator wrote, in that flag's unit
  // ("--max-message-mb: 1..2047 expected, got 0"); otherwise by the
  // option's flag ("--max-message: 1MiB..2047MiB expected, got 0").
  std::set<std::string> old_flag_names;
};

// OK, or INVALID_ARGUMENT naming the flag and the value for the first bad
// option: a number out of its range, a port that is another one's
// (--health-port equal to --port or to --metrics-port, --metrics-port
// equal to --port), TLS files given in half, an unknown log level or
// format. Reads no file and binds nothing: what the files hold is checked
// when the server is built (TensorCheckServer::Build).
absl::Status Validate(const ServerOptions& options);

// --max-inline-tensor's value when none is given: the largest tensor a
// request carries inline (at most the message size).
inline constexpr int64_t kDefaultMaxInlineTensorBytes = int64_t{256} << 20;

// ---------------------------------------------------------------------
// Sizes: a count of bytes, with an optional suffix: B (bytes); K, M, G, T
// and KiB, MiB, GiB, TiB, which are binary (2^10, 2^20, 2^30, 2^40); KB,
// MB, GB, TB, which are decimal (10^3, 10^6, 10^9, 10^12). A whole number,
// no sign, no space between the number and the suffix, suffixes spelled as
// here ("4GiB", "4G", "512MB", "1048576"); surrounding spaces are ignored.
// INVALID_ARGUMENT for anything else, a negative size, or one over 2^63-1
// bytes; the message names the text, not the flag (Abseil's flag parser
// adds the flag: "Illegal value '4XB' specified for flag 'max_inflight';
// ...").
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);
// The size in the largest binary unit it is a whole number of ("4GiB",
// "1536", "0", "-1MiB"); ParseByteSize reads it back (non-negative ones).
std::string FormatByteSize(int64_t bytes);

// Flag types (absl/flags/marshalling.h): a size, and a size or "auto"
// (std::nullopt: the option's automatic value).
struct ByteSize {
  int64_t bytes = 0;
};
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

struct ByteSizeOrAuto {
  std::optional<int64_t> bytes;
};
bool AbslParseFlag(absl::string_view text, ByteSizeOrAuto* size, std::string* error);
std::string AbslUnparseFlag(ByteSizeOrAuto size);

// ---------------------------------------------------------------------
// Old flag names. An option renamed keeps its old flag, in the old unit
// (--max-message-mb=256 is --max-message=256MiB). main.cc converts the
// old flag's value to the option's unit (ScaleFlagValue, SecondsFlagValue)
// and takes the one the command line gave (ResolveFlag).

// value × 2^shift (MiB to bytes: 20; 2^30 multiply-adds: 30), or
// INVALID_ARGUMENT naming `flag` when that is outside 64 bits.
absl::StatusOr<int64_t> ScaleFlagValue(absl::string_view flag, int64_t value, int shift);
// Seconds as a duration (infinities become infinite durations), or
// INVALID_ARGUMENT naming `flag` for NaN.
absl::StatusOr<absl::Duration> SecondsFlagValue(absl::string_view flag, double seconds);

// One option's two flags as the command line gave them: `value` in the
// option's unit, `given` whether it was on the command line.
template <typename T>
struct FlagValue {
  absl::string_view name;  // "--max-message"
  T value{};
  bool given = false;
};

// The option's value: the flag's, or the old name's when only that one
// was given (then its name goes into `old_flag_names`, for Validate's
// messages). INVALID_ARGUMENT naming both flags when both were given
// with different values.
absl::StatusOr<int64_t> ResolveFlag(const FlagValue<int64_t>& flag,
                                    const FlagValue<int64_t>& old_flag,
                                    std::set<std::string>* old_flag_names);
absl::StatusOr<absl::Duration> ResolveFlag(const FlagValue<absl::Duration>& flag,
                                           const FlagValue<absl::Duration>& old_flag,
                                           std::set<std::string>* old_flag_names);
// A size or auto (std::nullopt; --store-size's auto is --store-bytes' -1).
absl::StatusOr<std::optional<int64_t>> ResolveFlag(
    const FlagValue<std::optional<int64_t>>& flag,
    const FlagValue<std::optional<int64_t>>& old_flag, std::set<std::string>* old_flag_names);

// ---------------------------------------------------------------------
// What TensorCheckServer::Start makes of the options (its first steps).

// How many threads the process runs, decided here and nowhere else.
// Requests run on `workers` threads (--threads; 0: one per core). Their
// statistics (Compare, the error model's per-element passes, the
// diagnosis scoring) fan out on ONE pool of `stats_threads` threads shared
// by all requests (--stats-threads; 0: one per core), whose size counts
// the requesting worker: a worker works on its own statistics while the
// pool helps, so at most workers + stats - 1 threads are runnable at once,
// about 2 x cores with the defaults (3 on a 2-core host). When every
// request started its own threads, concurrent requests reached workers x
// cores (4 on that host, 64 on an 8-core one). Results do not depend on
// either size. The cpu backend's OpenBLAS threads (--cpu-threads) run the
// GEMMs and are sized apart: -1 (the default) runs each GEMM on the
// calling worker alone when several workers run requests side by side,
// since OpenBLAS's own threads would otherwise take every core for one
// request's GEMM and spin between GEMMs against the other requests'
// statistics (a pipelined whole-model check of 17 small layers took 1.5x
// as long; docs/performance.md, "Whole-model checks"); all cores (0) with
// one worker.
struct ThreadPlan {
  int workers = 1;
  int stats_threads = 1;
  int cpu_threads = 0;  // 0: all cores
};
ThreadPlan PlanThreads(const ServerOptions& options, int hardware_threads);

// The engine's limits: engine.limits with max_tensor_bytes 0 resolved
// (kDefaultMaxInlineTensorBytes) and at most max_message_bytes, since such
// a tensor travels inside one message.
RequestLimits EffectiveLimits(const ServerOptions& options);

// inline_output_bytes, at most half a message, so that a response of
// several outputs fits.
int64_t EffectiveInlineOutputBytes(const ServerOptions& options);

}  // namespace tensorcheck
