// The CLI's tensor argument (declared in tensor_io.h): FILE.npy or
// FILE.safetensors:TENSOR, read by npy_reader.cc or safetensors_reader.cc.
// Writing is npy_writer.cc.
#include "client/cli/tensor_io.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tensorcheck::cli {

absl::StatusOr<Tensor> ReadTensorArg(absl::string_view arg, const TensorReadOptions& options) {
  constexpr absl::string_view kSt = ".safetensors";
  if (absl::EndsWith(arg, ".npy")) return ReadNpyFile(std::string(arg), options);
  const size_t pos = arg.rfind(absl::StrCat(kSt, ":"));
  if (pos != absl::string_view::npos) {
    const std::string path(arg.substr(0, pos + kSt.size()));
    const absl::string_view name = arg.substr(pos + kSt.size() + 1);
    if (name.empty()) {
      auto names = ListSafetensors(path, options);
      if (!names.ok()) return names.status();
      return absl::InvalidArgumentError(
          absl::StrCat("'", arg, "': a tensor name expected after ':'; available: ",
                       names->empty() ? "(none)" : absl::StrJoin(*names, ", ")));
    }
    return ReadSafetensorsFile(path, name, options);
  }
  if (absl::EndsWith(arg, kSt)) {
    auto names = ListSafetensors(std::string(arg), options);
    if (!names.ok()) return names.status();
    return absl::InvalidArgumentError(
        absl::StrCat("'", arg, "': name the tensor as FILE.safetensors:TENSOR; available: ",
                     names->empty() ? "(none)" : absl::StrJoin(*names, ", ")));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", arg,
                   "': a tensor argument FILE.npy or FILE.safetensors:TENSOR "
                   "expected"));
}

}  // namespace tensorcheck::cli
