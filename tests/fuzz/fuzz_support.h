// What the fuzz targets share: failing loudly (libFuzzer records an abort
// as a crash, with the input that caused it) and an in-memory file whose
// path the file readers can open, so that no disk is touched.
//
//   FuzzFail("npy_fuzzer", "file and memory readers disagree");
//   MemFile file("npy_fuzzer");
//   ReadNpyFile(file.Write(bytes), options);
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tensorcheck::fuzz {

[[noreturn]] inline void FuzzFail(absl::string_view target, const std::string& what) {
  std::fprintf(stderr, "%.*s: %s\n", static_cast<int>(target.size()), target.data(), what.c_str());
  std::abort();
}

class MemFile {
 public:
  explicit MemFile(const char* target) : target_(target), fd_(memfd_create(target, 0)) {
    if (fd_ < 0) FuzzFail(target_, "memfd_create failed");
    path_ = absl::StrCat("/proc/self/fd/", fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { close(fd_); }

  // Replaces the file's contents with `bytes`; returns its path.
  const std::string& Write(absl::string_view bytes) {
    if (ftruncate(fd_, 0) != 0 ||
        pwrite(fd_, bytes.data(), bytes.size(), 0) != static_cast<ssize_t>(bytes.size())) {
      FuzzFail(target_, "writing the memfd failed");
    }
    return path_;
  }

 private:
  const char* target_;
  int fd_;
  std::string path_;
};

}  // namespace tensorcheck::fuzz
