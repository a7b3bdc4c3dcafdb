// What the tensor file readers and writer of client/cli/tensor_io.h share:
// the .npy preamble, a bounded read-only file, little-endian loads, checked
// element counts and untrusted bytes quoted for messages. Internal to
// client/cli.
//
//   TC_ASSIGN_OR_RETURN(File f, File::Open(path, options.max_file_bytes));
//   TC_ASSIGN_OR_RETURN(std::string first8, f.ReadString(0, 8));
//   const uint64_t header_len = LoadLe(first8, 8);
//
// Every error is INVALID_ARGUMENT naming the file, except a missing file
// (NOT_FOUND). A File is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/cli/tensor_io.h"
#include "core/dtype.h"
#include "core/tensor.h"

// Tensor bytes are copied as they lie in the file (little-endian).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tensor_io assumes a little-endian host");

namespace tensorcheck::cli::internal {

// The .npy magic string.
inline constexpr absl::string_view kNpyMagic("\x93NUMPY", 6);
// Magic (6) + version (2) + header length (2 in v1, 4 in v2/v3).
inline constexpr size_t kNpyV1Preamble = 10;
inline constexpr size_t kNpyV2Preamble = 12;

// Printable rendering of untrusted bytes for messages (bounded length).
std::string Quote(absl::string_view s, size_t max_len = 40);

// A name from a file, cut to a readable length for messages.
std::string Short(absl::string_view s);

// The unsigned little-endian integer in the first `n` (at most 8) bytes.
uint64_t LoadLe(absl::string_view bytes, size_t n);

// Product of dims, each already non-negative, with overflow of
// numel * itemsize detected. `what` labels the message.
absl::StatusOr<int64_t> NumelFor(const std::vector<int64_t>& shape, size_t itemsize,
                                 const std::string& what);

// In-memory contents are held to the same size limit as files.
absl::Status CheckFileSize(absl::string_view bytes, absl::string_view file_name,
                           const TensorReadOptions& options);

// Tensors this large are mapped rather than read (File::ReadTensor).
inline constexpr uint64_t kMapMinBytes = uint64_t{1} << 20;

// An open file descriptor, closed on destruction.
class File {
 public:
  // Opens a regular file of at most `max_bytes` bytes for reading.
  static absl::StatusOr<File> Open(const std::string& path, int64_t max_bytes);

  File(File&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), size_(o.size_) {}
  File& operator=(File&&) = delete;
  File(const File&) = delete;
  ~File();

  uint64_t size() const { return size_; }

  // Reads exactly `n` bytes at `offset` into `dst`.
  absl::Status ReadAt(uint64_t offset, size_t n, char* dst) const;

  // Reads exactly `n` bytes at `offset` into a string.
  absl::StatusOr<std::string> ReadString(uint64_t offset, size_t n) const;

  // The tensor whose bytes (already checked to lie in the file) start at
  // `offset`. From kMapMinBytes on, and when `offset` suits the dtype's
  // alignment, the tensor is a read-only view of the file's pages (mmap, no
  // copy: a multi-GB weight is neither copied nor zeroed first), mapped for
  // as long as the tensor lives; smaller ones are read into a new tensor.
  absl::StatusOr<Tensor> ReadTensor(uint64_t offset, DType dtype,
                                    const std::vector<int64_t>& shape) const;

 private:
  File(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_;
  std::string path_;
  uint64_t size_ = 0;
};

}  // namespace tensorcheck::cli::internal
