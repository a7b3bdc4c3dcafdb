// The commands of the tensorcheck CLI: each makes its RPCs, prints its
// report and returns the process's exit code. Internal to client/cli.
//
//   return RunCapabilities(cl, "localhost:50051", /*timeout=*/300);
//
// gRPC errors are printed to stderr and mapped to kExitUsage (the request
// was rejected) or kExitServer.
#pragma once

#include <string>

#include "client/cli/internal/command_line.h"

namespace tensorcheck::cli::internal {

// Exit codes (`tensorcheck --help` lists them); a parity failure is 1.
inline constexpr int kExitPass = 0;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitServer = 3;

// verify or diagnose: builds the request from the flags, calls the server,
// prints the report and writes the files the flags ask for.
int RunVerifyOrDiagnose(const CommandLine& cl, const std::string& server, double timeout);

// verify and diagnose send tensors above 1 MiB by digest when the server
// has a store (internal/tensor_transfer.h), and show progress on a terminal.
//
// capabilities: what the server can run, as text or JSON.
int RunCapabilities(const CommandLine& cl, const std::string& server, double timeout);

// upload FILE[:NAME]...: puts the tensors into the server's store (those it
// lacks) and prints each one's `sha256:<hex>:<dtype>:<shape>` argument.
int RunUpload(const CommandLine& cl, const std::string& server, double timeout);

}  // namespace tensorcheck::cli::internal
