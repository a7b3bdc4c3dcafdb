#include "server/store/store_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tensorcheck {

namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kBlobPrefix = "sha256-";
constexpr absl::string_view kTempPrefix = ".tmp-";
constexpr char kMarker[] = ".tensorcheck-store";
// Big enough to keep the disk streaming, small enough to stay in cache
// between read() and the hash.
constexpr size_t kChunk = size_t{8} << 20;

// `what` on `path` failed with `err`: RESOURCE_EXHAUSTED for a full disk,
// otherwise errno's own code.
absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  const std::string message = absl::StrCat(what, " ", path);
  if (err == ENOSPC || err == EDQUOT) {
    return absl::ResourceExhaustedError(absl::StrCat(message, ": ", std::strerror(err)));
  }
  return absl::ErrnoToStatus(err, message);
}

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // Closes now, returning close()'s errno (0 when it succeeded): a write
  // error can first show here on some file systems.
  int Close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// The digest a file name stands for, or nothing when it is not exactly
// FileName() of one: a size with a leading zero or a sign would give two
// names to one blob, and Remove would miss the other.
std::optional<Digest> ParseFileName(absl::string_view name) {
  if (!absl::ConsumePrefix(&name, kBlobPrefix)) return std::nullopt;
  const size_t dash = name.find('-');
  if (dash == absl::string_view::npos) return std::nullopt;
  const absl::string_view size_text = name.substr(dash + 1);
  int64_t size = 0;
  if (!absl::SimpleAtoi(size_text, &size) || absl::StrCat(size) != size_text) return std::nullopt;
  auto digest = ParseDigest(absl::StrCat("sha256:", name.substr(0, dash)), size);
  if (!digest.ok()) return std::nullopt;
  return *std::move(digest);
}

// INVALID_ARGUMENT unless `digest` is well formed: its hash becomes part of
// a path, so "../x" must never get that far.
absl::Status CheckDigest(const Digest& digest) {
  auto parsed = ParseDigest(digest.ToString(), digest.size);
  return parsed.ok() ? absl::OkStatus() : parsed.status();
}

absl::Status SyncDirectory(const std::string& path) {
  Fd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() < 0) return ErrnoError(errno, "cannot open directory", path);
  if (::fsync(dir.get()) != 0) return ErrnoError(errno, "cannot fsync directory", path);
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    // Linux writes at most about 2 GiB per call.
    const ssize_t n = ::write(fd, bytes.data(), std::min(bytes.size(), size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Why a file of `actual` bytes is not the blob of `expected` bytes.
std::string SizeMismatch(int64_t actual, int64_t expected) {
  return absl::StrCat(actual < expected ? "truncated: " : "too long: ", actual,
                      " bytes, the name says ", expected);
}

// The blob at `path`, read and hashed in one pass, adding what it reads to
// `bytes_read`; the error's message is the reason to drop the file.
absl::StatusOr<std::string> ReadBlob(const std::string& path, const Digest& digest,
                                     std::atomic<int64_t>& bytes_read) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path);
  if (st.st_size != digest.size) {
    return absl::DataLossError(SizeMismatch(st.st_size, digest.size));
  }
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  std::string bytes;
  try {
    bytes.resize(static_cast<size_t>(digest.size));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", digest.size, " bytes to read ", path));
  }
  Sha256 hash;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd.get(), &bytes[done], std::min(kChunk, bytes.size() - done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot read", path);
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat("truncated while reading: ", done, " bytes, the name says ", digest.size));
    }
    hash.Update(absl::string_view(&bytes[done], static_cast<size_t>(n)));
    done += static_cast<size_t>(n);
    bytes_read.fetch_add(n, std::memory_order_relaxed);
  }
  char extra;
  ssize_t n;
  while ((n = ::read(fd.get(), &extra, 1)) < 0 && errno == EINTR) {
  }
  if (n != 0) {
    return n < 0 ? ErrnoError(errno, "cannot read", path)
                 : absl::DataLossError(
                       absl::StrCat("grew while reading, the name says ", digest.size, " bytes"));
  }
  const std::string got = hash.HexDigest();
  if (got != digest.hash) {
    return absl::DataLossError(
        absl::StrCat("corrupt: its SHA-256 is ", got, ", the name says ", digest.hash));
  }
  return bytes;
}

// Deletes `path` and reports it as dropped for `reason`.
void Drop(const std::string& path, std::string reason, std::vector<StoreDir::Dropped>& dropped) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    absl::StrAppend(&reason, "; could not delete it: ", std::strerror(errno));
  }
  dropped.push_back({path, std::move(reason)});
}

}  // namespace

std::string StoreDir::FileName(const Digest& digest) {
  return absl::StrCat(kBlobPrefix, digest.hash, "-", digest.size);
}

absl::StatusOr<std::unique_ptr<StoreDir>> StoreDir::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("store directory: an empty path");
  const auto unusable = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("store directory ", path, ": ", why, " (--store-dir)"));
  };
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_directory(path, ec)) return unusable("not a directory");
  fs::create_directories(path, ec);
  if (ec) return unusable(absl::StrCat("cannot create it: ", ec.message()));
  if (!fs::is_directory(path, ec)) return unusable("not a directory");
  if (::access(path.c_str(), W_OK | X_OK) != 0) {
    return unusable(absl::StrCat("not writable: ", std::strerror(errno)));
  }
  const std::string marker = (fs::path(path) / kMarker).string();
  if (!fs::exists(marker, ec)) {
    // Only a directory this class made may be cleaned by Scan.
    fs::directory_iterator it(path, ec);
    if (ec) return unusable(absl::StrCat("cannot list it: ", ec.message()));
    if (it != fs::directory_iterator()) {
      return unusable(absl::StrCat("not empty and not a tensor store (no ", kMarker,
                                   "); give an empty or new directory"));
    }
  }
  const int fd = ::open(marker.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return unusable(absl::StrCat("cannot create ", kMarker, ": ", std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return unusable(err == EWOULDBLOCK ? std::string("in use by another tensorcheck server")
                                       : absl::StrCat("cannot lock it: ", std::strerror(err)));
  }
  return std::unique_ptr<StoreDir>(new StoreDir(path, fd));
}

StoreDir::~StoreDir() { ::close(lock_fd_); }  // releases the flock

absl::Status StoreDir::Write(const Digest& digest, absl::string_view bytes) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  if (static_cast<int64_t>(bytes.size()) != digest.size) {
    return absl::InvalidArgumentError(absl::StrCat("store directory ", path_, ": ", bytes.size(),
                                                   " bytes given for ", digest.ToString(), " of ",
                                                   digest.size, " bytes"));
  }
  const std::string final_path = FilePath(digest);
  struct stat st;
  if (::lstat(final_path.c_str(), &st) == 0) return absl::OkStatus();

  static std::atomic<uint64_t> counter{0};
  const std::string temp_path =
      (fs::path(path_) / absl::StrCat(kTempPrefix, digest.hash, "-", digest.size, "-", ::getpid(),
                                      "-", counter.fetch_add(1)))
          .string();
  Fd fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) return ErrnoError(errno, "cannot create", temp_path);
  absl::Status status = WriteAll(fd.get(), bytes, temp_path);
  if (status.ok() && ::fsync(fd.get()) != 0) status = ErrnoError(errno, "cannot fsync", temp_path);
  if (const int err = fd.Close(); status.ok() && err != 0) {
    status = ErrnoError(err, "cannot close", temp_path);
  }
  if (status.ok() && ::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    status = ErrnoError(errno, "cannot rename into place", final_path);
  }
  if (!status.ok()) {
    ::unlink(temp_path.c_str());
    return status;
  }
  return SyncDirectory(path_);
}

absl::Status StoreDir::Remove(const Digest& digest) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  const std::string file = FilePath(digest);
  if (::unlink(file.c_str()) != 0 && errno != ENOENT)
    return ErrnoError(errno, "cannot delete", file);
  return absl::OkStatus();
}

std::string StoreDir::FilePath(const Digest& digest) const {
  return (fs::path(path_) / FileName(digest)).string();
}

absl::StatusOr<std::string> StoreDir::Read(const Digest& digest) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  const std::string file = FilePath(digest);
  absl::StatusOr<std::string> bytes = ReadBlob(file, digest, bytes_read_);
  if (!bytes.ok() && !absl::IsResourceExhausted(bytes.status())) {
    std::vector<Dropped> dropped;
    Drop(file, std::string(bytes.status().message()), dropped);
    return absl::Status(bytes.status().code(), dropped[0].reason);
  }
  return bytes;
}

absl::Status StoreDir::Touch(const Digest& digest, absl::Time used) {
  if (absl::Status s = CheckDigest(digest); !s.ok()) return s;
  const std::string file = FilePath(digest);
  const struct timespec times[2] = {{0, UTIME_OMIT}, absl::ToTimespec(used)};
  if (::utimensat(AT_FDCWD, file.c_str(), times, AT_SYMLINK_NOFOLLOW) != 0 && errno != ENOENT) {
    return ErrnoError(errno, "cannot set the modification time of", file);
  }
  return absl::OkStatus();
}

absl::StatusOr<StoreDir::ScanReport> StoreDir::Scan() {
  struct Candidate {
    Listed blob;
    std::string name;
  };
  ScanReport report;
  std::vector<Candidate> blobs;
  std::error_code ec;
  fs::directory_iterator it(path_, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string file = it->path().string();
    if (name == kMarker) continue;
    struct stat st;
    if (::lstat(file.c_str(), &st) != 0) {
      if (errno != ENOENT)
        report.dropped.push_back({file, absl::StrCat("cannot stat: ", std::strerror(errno))});
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      report.dropped.push_back({file, "a directory, left alone"});
      continue;
    }
    if (absl::StartsWith(name, kTempPrefix)) {
      Drop(file, "leftover temporary file (a write interrupted)", report.dropped);
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      Drop(file, "not a regular file", report.dropped);
      continue;
    }
    std::optional<Digest> digest = ParseFileName(name);
    if (!digest) {
      Drop(file, "not a blob's file name (sha256-<64 lowercase hex>-<size> expected)",
           report.dropped);
      continue;
    }
    if (st.st_size != digest->size) {
      Drop(file, SizeMismatch(st.st_size, digest->size), report.dropped);
      continue;
    }
    blobs.push_back({{*std::move(digest), absl::TimeFromTimespec(st.st_mtim)}, name});
  }
  if (ec) {
    return absl::ErrnoToStatus(ec.value(),
                               absl::StrCat("store directory ", path_, ": cannot list it"));
  }
  std::sort(blobs.begin(), blobs.end(), [](const Candidate& a, const Candidate& b) {
    if (a.blob.used != b.blob.used) return a.blob.used < b.blob.used;
    return a.name < b.name;
  });
  report.blobs.reserve(blobs.size());
  for (Candidate& c : blobs) report.blobs.push_back(std::move(c.blob));
  return report;
}

}  // namespace tensorcheck
