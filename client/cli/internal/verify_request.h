// The VerifyRequest of `tensorcheck verify` and `tensorcheck diagnose`,
// built from the command line. Internal to client/cli.
//
//   TC_ASSIGN_OR_RETURN(pb::VerifyRequest req, BuildRequest(cl));
//
// Errors: INVALID_ARGUMENT for a bad or missing flag (the message starts
// with the flag) or a malformed tensor file; NOT_FOUND for a missing file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/internal/command_line.h"
#include "core/tensor.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck::cli {

namespace pb = ::tensorcheck::v1;  // as in client/cli/report.h

namespace internal {

// Tensors up to this size always go inline in the request; larger ones may
// go by digest (internal/tensor_transfer.h).
inline constexpr int64_t kInlineMaxBytes = int64_t{1} << 20;

// A tensor argument above kInlineMaxBytes that BuildRequest kept out of the
// request: the field has its dtype and shape but no data yet.
struct HeldTensor {
  // The request field: "op.input", "op.weight", "op.bias", "op.input_scale",
  // "op.weight_scale" or "observed" (compare: "observed[0]", "observed[1]").
  std::string field;
  Tensor tensor;
};

// The request's options from the flags, without its tensors: configurations
// (`config_flag` names them in messages), reference, tolerance, output
// options, op options (--weight-layout, --activation, --output-dtype).
// Shared by verify, diagnose and sweep; INVALID_ARGUMENT naming the flag.
absl::StatusOr<pb::VerifyRequest> BuildRequestOptions(const CommandLine& cl,
                                                      absl::string_view config_flag);

// Builds the request from the flags; every client-side check happens here,
// before anything is sent. With `held`, tensors above kInlineMaxBytes go
// there instead of into the request (no copy of their bytes). --accept
// (repeatable, also A,B) fills `accept` and needs --observed; diagnose's
// --config and --candidates both name candidates.
absl::StatusOr<pb::VerifyRequest> BuildRequest(const CommandLine& cl,
                                               std::vector<HeldTensor>* held = nullptr);

// The name and file of a compare --observed argument: `NAME=FILE`, or the
// file alone, named by its stem (`torch_y.npy` -> "torch_y") or, for
// `FILE.safetensors:TENSOR`, by TENSOR. A name holds letters, digits, '_',
// '-', '.' (at most 64); a `sha256:` argument needs NAME=.
absl::StatusOr<std::pair<std::string, std::string>> ObservedNameAndFile(absl::string_view arg);

// The request of `tensorcheck compare`: the layer as BuildRequest reads it,
// exactly two --observed outputs with distinct names (held as
// "observed[0]" and "observed[1]" when large), --config, --reference,
// --accept, --top-k. `--dtype NAME=DTYPE` takes an output's name too, and
// `--dtype observed=DTYPE` applies to both.
absl::StatusOr<pb::CompareRequest> BuildCompareRequest(const CommandLine& cl,
                                                       std::vector<HeldTensor>* held = nullptr);

}  // namespace internal
}  // namespace tensorcheck::cli
