#include "client/cli/internal/tensor_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace tensorcheck::cli::internal {

std::string Quote(absl::string_view s, size_t max_len) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > max_len) out += "...";
  out += "'";
  return out;
}

std::string Short(absl::string_view s) {
  constexpr size_t kMax = 80;
  if (s.size() <= kMax) return std::string(s);
  return absl::StrCat(s.substr(0, kMax), "...");
}

uint64_t LoadLe(absl::string_view bytes, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  return v;
}

absl::StatusOr<int64_t> NumelFor(const std::vector<int64_t>& shape, size_t itemsize,
                                 const std::string& what) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank at most ", kMaxRank,
                                                   " expected, found ", shape.size(), " (shape ",
                                                   ShapeString(shape), ")"));
  }
  const int64_t limit = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(itemsize);
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": non-negative dimensions expected, found shape ", ShapeString(shape)));
    }
    if (d != 0 && n > limit / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": shape ", ShapeString(shape), " overflows the element count"));
    }
    n *= d;
  }
  return n;
}

absl::Status CheckFileSize(absl::string_view bytes, absl::string_view file_name,
                           const TensorReadOptions& options) {
  if (bytes.size() > static_cast<uint64_t>(options.max_file_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": file of at most ",
                                                   options.max_file_bytes,
                                                   " bytes expected, found ", bytes.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<File> File::Open(const std::string& path, int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(msg);
    return absl::InvalidArgumentError(msg);
  }
  File f(fd, path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot stat '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': a regular file expected"));
  }
  if (st.st_size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': file of at most ", max_bytes,
                                                   " bytes expected, found ", st.st_size,
                                                   " bytes"));
  }
  f.size_ = static_cast<uint64_t>(st.st_size);
  return f;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status File::ReadAt(uint64_t offset, size_t n, char* dst) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, dst + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return absl::InvalidArgumentError(
          absl::StrCat("'", path_, "': read failed: ", std::strerror(errno)));
    }
    if (r == 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", path_, "': file ended early (", n,
                                                     " bytes expected at offset ", offset, ", got ",
                                                     done, "); was it modified while being read?"));
    }
    done += static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> File::ReadString(uint64_t offset, size_t n) const {
  std::string s(n, '\0');
  TC_RETURN_IF_ERROR(ReadAt(offset, n, s.data()));
  return s;
}

absl::StatusOr<Tensor> File::ReadTensor(uint64_t offset, DType dtype,
                                        const std::vector<int64_t>& shape) const {
  TC_ASSIGN_OR_RETURN(const int64_t numel, NumelFor(shape, ItemSize(dtype), path_));
  // FP4's shape counts elements, two to a byte.
  const uint64_t n = static_cast<uint64_t>(StorageBytes(dtype, numel));
  if (n >= kMapMinBytes && offset % ItemSize(dtype) == 0 && offset + n <= size_) {
    // mmap offsets are whole pages: map from the page holding `offset`.
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t start = offset / page * page;
    const size_t len = static_cast<size_t>(offset + n - start);
    // MAP_POPULATE reads the pages in now, sequentially, instead of one
    // fault at a time while the tensor is hashed and sent.
    void* p =
        ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd_, static_cast<off_t>(start));
    if (p != MAP_FAILED) {
      std::shared_ptr<const void> mapping(
          p, [len](const void* q) { ::munmap(const_cast<void*>(q), len); });
      const char* bytes = static_cast<const char*>(p) + (offset - start);
      return Tensor::Borrow(dtype, shape, bytes, static_cast<size_t>(n), std::move(mapping));
    }
    // A file system that cannot map: read it instead.
  }
  TC_ASSIGN_OR_RETURN(Tensor t, Tensor::Create(dtype, shape));
  TC_RETURN_IF_ERROR(ReadAt(offset, t.nbytes(), static_cast<char*>(t.raw())));
  return t;
}

}  // namespace tensorcheck::cli::internal
