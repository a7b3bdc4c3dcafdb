// Tensor files for the CLI: `.npy` (format v1, v2, v3) and `.safetensors`.
//
// Reading is strict and bounded: every header field is validated, and the
// data size is checked against the file size before anything is allocated,
// so a truncated or hostile file is an INVALID_ARGUMENT naming the file
// (and tensor) with what was expected and what was found, never a crash or
// a huge allocation.
//
//   TensorReadOptions opts;
//   opts.expected_dtype = DType::kBFloat16;  // from `--dtype input=bf16`
//   TC_ASSIGN_OR_RETURN(Tensor x, ReadTensorArg("x.npy", opts));
//   TC_ASSIGN_OR_RETURN(Tensor w, ReadTensorArg("m.safetensors:fc.weight"));
//   TC_RETURN_IF_ERROR(WriteNpyFile("out/cpu_fp32_none.npy", y));
//
// Accepted `.npy` dtypes: `<f8`, `<f4`, `<f2`; `<u2` as bfloat16 bit
// patterns only when the caller expects bfloat16, and so `<V2` (raw 2-byte
// values: what `np.save` writes for an ml_dtypes bfloat16 array, whose
// descr numpy cannot name); `|u1` (or `<u1`) as
// FP8 bit patterns only when the caller expects float8_e4m3fn,
// float8_e5m2 or float8_e8m0fnu (numpy has none, so such arrays are
// commonly saved as `x.view(np.uint16)` / `x.view(np.uint8)`; the bits
// alone do not say which format they are), and as float4_e2m1fn when the
// caller expects it: the packed bytes of torch.float4_e2m1fn_x2 (element 2i
// in the low nibble), so the tensor's last dimension is twice the file's.
// Accepted safetensors dtypes: F64, F32, F16, BF16, F8_E4M3
// (float8_e4m3fn), F8_E5M2, F4 (float4_e2m1fn, two to a byte; its shape
// counts elements) and F8_E8M0 (float8_e8m0fnu; E8M0 read too).
//
// This library has no gRPC dependency.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace tensorcheck::cli {

// Files larger than this are rejected before they are read.
inline constexpr int64_t kDefaultMaxFileBytes = int64_t{8} << 30;  // 8 GiB
// A safetensors JSON header larger than this is rejected (the reference
// implementation's own limit is 100 MB).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorReadOptions {
  // Files (and in-memory buffers) over this size are INVALID_ARGUMENT.
  int64_t max_file_bytes = kDefaultMaxFileBytes;
  // The dtype the caller requires (`--dtype NAME=DTYPE`). When set, a
  // tensor of another dtype is an error. bfloat16 additionally allows a
  // `.npy` of dtype `<u2`, read as bf16 bit patterns; float8_e4m3fn and
  // float8_e5m2 one of dtype `|u1`, read as bit patterns of that format.
  std::optional<DType> expected_dtype;
  // Other dtypes accepted in place of expected_dtype from a source that
  // names its own dtype (a safetensors entry, a digest argument), never
  // from bit patterns whose dtype only the flag says: the block scales'
  // float8_e8m0fnu and float8_e4m3fn where float32 scales are expected.
  std::vector<DType> also_named;
  // What requires expected_dtype, for messages: "dtype float32 expected
  // (<expected_by>), found ...".
  std::string expected_by = "--dtype";
  // How a message tells the user to name a dtype, followed by the dtype:
  // "--dtype NAME=" (verify, diagnose, compare: "--dtype NAME=bf16") or
  // "--dtype " (upload, which takes one dtype for every tensor).
  std::string dtype_flag = "--dtype NAME=";
};

// Reads a CLI tensor argument: `path.npy` or `path.safetensors:TENSOR`.
// `path.safetensors` without a tensor name is an error that lists the
// tensors the file holds.
absl::StatusOr<Tensor> ReadTensorArg(absl::string_view arg, const TensorReadOptions& options = {});

// Reads a `.npy` file.
absl::StatusOr<Tensor> ReadNpyFile(const std::string& path, const TensorReadOptions& options = {});

// Reads one tensor of a `.safetensors` file. Only the header and that
// tensor's bytes are read; every entry of the header is still validated
// (offsets in range, no overlaps, sizes that match dtype and shape).
absl::StatusOr<Tensor> ReadSafetensorsFile(const std::string& path, absl::string_view tensor_name,
                                           const TensorReadOptions& options = {});

// The same parsers over bytes in memory. `file_name` only labels messages.
absl::StatusOr<Tensor> ParseNpy(absl::string_view bytes, absl::string_view file_name,
                                const TensorReadOptions& options = {});
absl::StatusOr<Tensor> ParseSafetensors(absl::string_view bytes, absl::string_view tensor_name,
                                        absl::string_view file_name,
                                        const TensorReadOptions& options = {});

// Names of the tensors in a safetensors header (without `__metadata__`),
// sorted. Used to list what is available.
absl::StatusOr<std::vector<std::string>> ListSafetensors(const std::string& path,
                                                         const TensorReadOptions& options = {});

// One entry of a safetensors header, as the file declares it.
struct SafetensorsTensorInfo {
  std::string name;
  // The format's dtype name: "F32", "BF16", ... (any the format defines).
  std::string dtype;
  std::vector<int64_t> shape;
  // Byte offsets [begin, end) in the data section (after the header).
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
};

// A validated safetensors header: the tensors, sorted by name, and the
// `__metadata__` object (string values as they are; any other JSON value
// as its compact JSON text).
struct SafetensorsIndex {
  std::vector<SafetensorsTensorInfo> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads and validates the header of a `.safetensors` file (no tensor data).
absl::StatusOr<SafetensorsIndex> ReadSafetensorsIndex(const std::string& path,
                                                      const TensorReadOptions& options = {});

// The dtype of a safetensors dtype name, for those the CLI reads (F64,
// F32, F16, BF16, F8_E4M3, F8_E5M2, F4, F8_E8M0); nullopt for any other.
std::optional<DType> SafetensorsDTypeOf(absl::string_view name);

// How a bfloat16 tensor is written to `.npy`, which has no bfloat16 dtype.
enum class Bf16NpyEncoding {
  // `<f4`: every bf16 value widened exactly to float32. The default: the
  // file loads with plain numpy and holds exactly the same values.
  kFloat32,
  // `<u2`: the raw bit patterns (`np.load(f).view(ml_dtypes.bfloat16)`);
  // read back with `--dtype NAME=bf16`.
  kUint16Bits,
};

// Serialises `t` as a `.npy` format v1.0 file (little-endian, C order,
// header padded to 64 bytes). FP8 tensors are written as their bit
// patterns, `|u1` (numpy's uint8), whatever `bf16` says: read them back
// with `--dtype NAME=fp8e4m3` or `fp8e5m2` (numpy:
// `np.load(f).view(ml_dtypes.float8_e4m3fn)`). Unlike bf16, which outputs
// have, FP8 tensors are only ever inputs and weights (the server returns no
// FP8 output), so a file of them exists to be fed back as such an operand.
std::string EncodeNpy(const Tensor& t, Bf16NpyEncoding bf16 = Bf16NpyEncoding::kFloat32);

// Writes EncodeNpy(t) to `path` (replacing it).
absl::Status WriteNpyFile(const std::string& path, const Tensor& t,
                          Bf16NpyEncoding bf16 = Bf16NpyEncoding::kFloat32);

}  // namespace tensorcheck::cli
