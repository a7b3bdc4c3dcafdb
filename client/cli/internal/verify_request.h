// The VerifyRequest of `tensorcheck verify` and `tensorcheck diagnose`,
// built from the command line. Internal to client/cli.
//
//   TC_ASSIGN_OR_RETURN(pb::VerifyRequest req, BuildRequest(cl));
//
// Errors: INVALID_ARGUMENT for a bad or missing flag (the message starts
// with the flag) or a malformed tensor file; NOT_FOUND for a missing file.
#pragma once

#include "absl/status/statusor.h"
#include "client/cli/internal/command_line.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli {

namespace pb = ::tensorcheck::v1;  // as in client/cli/report.h

namespace internal {

// Builds the request from the flags; every client-side check happens here,
// before anything is sent.
absl::StatusOr<pb::VerifyRequest> BuildRequest(const CommandLine& cl);

}  // namespace internal
}  // namespace tensorcheck::cli
