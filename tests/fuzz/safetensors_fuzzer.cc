// Fuzz target: the `.safetensors` reader of client/cli/tensor_io.h.
//
// Every input is written to a memfd and listed (ListSafetensors); each
// listed tensor, and a few fixed names, is then read from the file
// (ReadSafetensorsFile) and from memory (ParseSafetensors), which must
// agree. A crash, a leak, undefined behaviour or a disagreement is a bug.
//
//   scripts/fuzz.sh 60     # builds build-fuzz, runs every target
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/tensor_io.h"
#include "tests/fuzz/fuzz_support.h"

namespace tensorcheck::cli {
namespace {

[[noreturn]] void Fail(const std::string& what) { fuzz::FuzzFail("safetensors_fuzzer", what); }

using fuzz::MemFile;

void CheckInvalidArgument(const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument) {
    Fail(absl::StrCat("unexpected status: ", s.ToString()));
  }
}

void CheckName(absl::string_view bytes, const std::string& path, const std::string& name,
               const TensorReadOptions& options) {
  absl::StatusOr<Tensor> parsed = ParseSafetensors(bytes, name, "fuzz.safetensors", options);
  absl::StatusOr<Tensor> read = ReadSafetensorsFile(path, name, options);
  if (parsed.ok() != read.ok()) {
    Fail(absl::StrCat("ParseSafetensors and ReadSafetensorsFile disagree on '", name,
                      "': ", parsed.status().ToString(), " vs ", read.status().ToString()));
  }
  if (!parsed.ok()) {
    CheckInvalidArgument(parsed.status());
    CheckInvalidArgument(read.status());
    return;
  }
  if (parsed->dtype() != read->dtype() || parsed->shape() != read->shape() ||
      parsed->bytes() != read->bytes()) {
    Fail(absl::StrCat("ParseSafetensors and ReadSafetensorsFile read '", name, "' differently"));
  }
  if (parsed->nbytes() > bytes.size()) Fail("a tensor larger than its file");
}

}  // namespace
}  // namespace tensorcheck::cli

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorcheck::cli;  // NOLINT(build/namespaces): a C entry point
  static MemFile* file = new MemFile("safetensors_fuzzer");
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string& path = file->Write(bytes);

  std::vector<std::string> names = {"x", "fc.weight", "fc.bias", ""};
  absl::StatusOr<std::vector<std::string>> listed = ListSafetensors(path);
  if (listed.ok()) {
    constexpr size_t kMaxNames = 8;  // bounded work per input
    for (size_t i = 0; i < listed->size() && i < kMaxNames; ++i) names.push_back((*listed)[i]);
  } else {
    CheckInvalidArgument(listed.status());
  }
  TensorReadOptions any;
  TensorReadOptions bf16;
  bf16.expected_dtype = tensorcheck::DType::kBFloat16;
  for (const std::string& name : names) {
    CheckName(bytes, path, name, any);
    CheckName(bytes, path, name, bf16);
  }
  return 0;
}
