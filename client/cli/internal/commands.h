// The commands of the tensorcheck CLI: each makes its RPCs, prints its
// report and returns the process's exit code. Internal to client/cli.
//
//   TC_ASSIGN_OR_RETURN(Connection conn, ConnectionFromFlags(cl));
//   return RunCapabilities(cl, conn, /*timeout=*/300);
//
// gRPC errors are printed to stderr and mapped to kExitUsage (the request
// was rejected) or kExitServer.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/command_line.h"
#include "client/cli/internal/connection.h"
#include "core/executor.h"
#include "grpcpp/grpcpp.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck::cli::internal {

namespace pb = ::tensorcheck::v1;

// Exit codes (`tensorcheck --help` lists them); a parity failure is 1.
inline constexpr int kExitPass = 0;
inline constexpr int kExitFail = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitServer = 3;

// The exit-code mapping documented in kExitCodes (main.cc): kExitUsage for
// a rejected request, kExitServer otherwise.
int ExitCodeForGrpc(grpc::StatusCode c);

// Prints a failed RPC (or a failure on the way to one) to stderr and returns
// the exit code of kExitCodes. UNAVAILABLE names the server;
// UNAUTHENTICATED and PERMISSION_DENIED say which token was sent, if any.
int ReportError(grpc::StatusCode c, absl::string_view message, const Connection& server);
int ReportGrpcError(const grpc::Status& s, const Connection& server);
// absl and gRPC number their codes alike.
int ReportStatus(const absl::Status& s, const Connection& server);

// A stub for `server` whose message limits leave the server's to govern.
std::unique_ptr<pb::TensorCheck::Stub> MakeStub(const Connection& server);

// One deadline for every RPC of a command: --timeout bounds the whole of
// it, uploads included.
std::chrono::system_clock::time_point DeadlineAfter(double seconds);

// Whether to draw the progress line: stderr is a terminal, no --no-progress.
bool ProgressWanted(const CommandLine& cl);

// The pool that hashes and uploads tensors, several at once; null (inline)
// when the system refuses threads.
std::unique_ptr<Executor> TransferExecutor();

// verify or diagnose: builds the request from the flags, calls the server,
// prints the report and writes the files the flags ask for.
int RunVerifyOrDiagnose(const CommandLine& cl, const Connection& server, double timeout);

// compare: two outputs of one layer (--observed twice) diagnosed against
// the same candidates and against each other (the Compare RPC); the text
// or JSON report; kExitPass when their difference is rounding
// (ExitCodeForCompare).
int RunCompare(const CommandLine& cl, const Connection& server, double timeout);

// verify and diagnose send tensors above 1 MiB by digest when the server
// has a store (internal/tensor_transfer.h), and show progress on a terminal.
//
// capabilities: what the server can run, as text or JSON.
int RunCapabilities(const CommandLine& cl, const Connection& server, double timeout);

// upload FILE[:NAME]...: puts the tensors into the server's store (those it
// lacks) and prints each one's `sha256:<hex>:<dtype>:<shape>` argument.
int RunUpload(const CommandLine& cl, const Connection& server, double timeout);

// health: the server's status from the standard gRPC health service
// (grpc.health.v1.Health/Check) for `--service` (empty: the whole
// server): prints it; kExitPass when SERVING, kExitFail otherwise (a
// draining server is NOT_SERVING), gRPC errors as the other commands
// (an unknown service is NOT_FOUND). What a container's health check runs.
int RunHealth(const CommandLine& cl, const Connection& server, double timeout);

// sweep: checks every layer call of a captures file against its weights
// (client/cli/sweep.cc, docs/model-checks.md).
int RunSweep(const CommandLine& cl, const Connection& server, double timeout);

// render REPORT.json: the text table, JSON, JUnit, GitHub summary and HTML
// page of a sweep's JSON report, rendered by the code `sweep` renders its
// own with (internal/sweep_render.h); no server. Its exit code is the one
// the sweep gave for those results (SweepExitCode); kExitUsage for a bad
// report file, naming the JSON path of what is wrong.
int RunRender(const CommandLine& cl);

}  // namespace tensorcheck::cli::internal
