// Fuzz target: the `.npy` reader of client/cli/tensor_io.h.
//
// Every input is read three ways: from memory (ParseNpy), from memory
// expecting bfloat16 (which also admits '<u2'), and from a file
// (ReadNpyFile, over a memfd so that no disk is touched). The file reader
// must agree with the memory parser; an accepted tensor must survive
// EncodeNpy and read back bit for bit. A crash, a leak, undefined
// behaviour or a disagreement is a bug.
//
//   scripts/fuzz.sh 60     # builds build-fuzz, runs every target
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli/tensor_io.h"
#include "tests/fuzz/fuzz_support.h"

namespace tensorcheck::cli {
namespace {

[[noreturn]] void Fail(const std::string& what) { fuzz::FuzzFail("npy_fuzzer", what); }

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.bytes() == b.bytes();
}

using fuzz::MemFile;

void CheckOne(absl::string_view bytes, const TensorReadOptions& options, MemFile* file) {
  absl::StatusOr<Tensor> parsed = ParseNpy(bytes, "fuzz.npy", options);
  absl::StatusOr<Tensor> read = ReadNpyFile(file->Write(bytes), options);
  if (parsed.ok() != read.ok() ||
      (!parsed.ok() && parsed.status().code() != read.status().code())) {
    Fail(absl::StrCat("ParseNpy and ReadNpyFile disagree: ", parsed.status().ToString(), " vs ",
                      read.status().ToString()));
  }
  if (!parsed.ok()) {
    if (parsed.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail(absl::StrCat("unexpected status: ", parsed.status().ToString()));
    }
    return;
  }
  if (!SameTensor(*parsed, *read)) Fail("ParseNpy and ReadNpyFile read different tensors");
  if (parsed->nbytes() > bytes.size()) Fail("a tensor larger than its file");
  // Round trip: bf16 goes back as '<u2' bit patterns, which need the option.
  const bool bf16 = parsed->dtype() == DType::kBFloat16;
  TensorReadOptions again;
  if (bf16) again.expected_dtype = DType::kBFloat16;
  absl::StatusOr<Tensor> back =
      ParseNpy(EncodeNpy(*parsed, bf16 ? Bf16NpyEncoding::kUint16Bits : Bf16NpyEncoding::kFloat32),
               "round-trip.npy", again);
  if (!back.ok()) Fail(absl::StrCat("EncodeNpy's output is refused: ", back.status().ToString()));
  if (!SameTensor(*parsed, *back)) Fail("EncodeNpy then ParseNpy changed the tensor");
}

}  // namespace
}  // namespace tensorcheck::cli

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorcheck::cli;  // NOLINT(build/namespaces): a C entry point
  static MemFile* file = new MemFile("npy_fuzzer");
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  TensorReadOptions any;
  CheckOne(bytes, any, file);
  TensorReadOptions bf16;
  bf16.expected_dtype = tensorcheck::DType::kBFloat16;
  CheckOne(bytes, bf16, file);
  return 0;
}
