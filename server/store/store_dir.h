// StoreDir: the tensor store's blobs on disk (`--store-dir`), so that they
// survive a restart. One file per blob; each is written to a temporary file
// and renamed into place once complete and synced. A file's modification
// time records when its tensor was last used (Touch), so that a restart
// keeps the most recently used ones (docs/api.md, "The store itself").
// Start-up only lists and stats the files (Scan); a blob is read and
// re-hashed when it is first wanted (Read): a corrupt or truncated file is
// deleted and reported, never returned. No gRPC and no logging inside:
// Scan and Read return what they dropped and why, and the caller logs it
// (the service's LogEvent keeps JSON logs well-formed, which a plain spdlog
// line from here would not).
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<StoreDir> dir, StoreDir::Open("/var/lib/tc"));
//   TC_ASSIGN_OR_RETURN(StoreDir::ScanReport scan, dir->Scan());  // no file read
//   for (const auto& d : scan.dropped) LogEvent(warn, "dropped", {{"path", d.path}, ...});
//   for (const StoreDir::Listed& b : scan.blobs) ...;  // least recently used first
//   absl::StatusOr<std::string> bytes = dir->Read(digest);  // verified, or dropped
//   TC_RETURN_IF_ERROR(dir->Write(digest, bytes));  // after the store accepted them
//   dir->Touch(digest, absl::Now());                // when the store uses them
//   TC_RETURN_IF_ERROR(dir->Remove(digest));        // when the store evicts them
//
// Layout of the directory:
//   sha256-<64 lowercase hex>-<size in decimal>   a blob, e.g. "sha256-e3b0...b855-0";
//                                                 the size has no leading zeros;
//                                                 its mtime: when it was last used
//   .tmp-<hash>-<size>-<pid>-<n>                  a blob being written
//   .tensorcheck-store                            marks the directory as a store and
//                                                 holds its lock (see Open)
// Anything else found there is deleted by Scan (a subdirectory is only
// reported), which is why Open refuses a non-empty directory without the
// marker: a mistyped --store-dir must not empty someone's home directory.
//
// Thread safety: Write, Read, Touch and Remove may be called from any
// thread at once, also for one digest (the last rename wins; the bytes are
// the same). Scan is meant for start-up, before the first Write: it deletes
// temporary files, including one a concurrent Write is filling (that Write
// then fails). One process holds a directory at a time (an flock on the
// marker, released when the StoreDir is destroyed).
//
// Error codes: FAILED_PRECONDITION when the directory cannot be used,
// RESOURCE_EXHAUSTED when the disk (or, in Read, memory) is full (ENOSPC,
// EDQUOT), DATA_LOSS for a blob whose bytes are not its name's, otherwise
// the code of the failing call's errno (absl::ErrnoToStatus); every
// message names the path, except Read's, which is the reason alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/digest.h"

namespace tensorcheck {

class StoreDir {
 public:
  // A blob file Scan found: its name parsed and its size checked, its
  // bytes not read yet.
  struct Listed {
    Digest digest;
    absl::Time used;  // the file's mtime: when the store last used it
  };

  // A directory entry Scan or Read deleted (or, for a subdirectory, left
  // alone) instead of handing it over, for the caller to log as a warning.
  struct Dropped {
    std::string path;
    std::string reason;  // e.g. "truncated: 10 bytes, the name says 20"
  };

  struct ScanReport {
    // Least recently used first (oldest mtime; ties by name).
    std::vector<Listed> blobs;
    std::vector<Dropped> dropped;
  };

  // Opens the directory at `path`, creating it and its parents if needed,
  // and takes its lock. INVALID_ARGUMENT for an empty path;
  // FAILED_PRECONDITION naming the path when it cannot be created, is not a
  // directory, is not writable, is a non-empty directory without the
  // marker, or is held by another StoreDir (of this or another process).
  static absl::StatusOr<std::unique_ptr<StoreDir>> Open(const std::string& path);

  ~StoreDir();
  StoreDir(const StoreDir&) = delete;
  StoreDir& operator=(const StoreDir&) = delete;

  // Writes `bytes` as the blob `digest` durably: a temporary file in the
  // directory, fsync, rename into place (atomic: a crash leaves either no
  // blob or the whole one), fsync of the directory. A blob already on disk
  // is left alone (OK, nothing written). The caller has checked the hash
  // (TensorStore::Put does); only the size is checked here
  // (INVALID_ARGUMENT when it differs). On error nothing is left behind.
  absl::Status Write(const Digest& digest, absl::string_view bytes);

  // Deletes the blob's file, e.g. when the store evicts it; a blob not on
  // disk is fine. Not synced: a blob that comes back after a crash is
  // still a valid one.
  absl::Status Remove(const Digest& digest);

  // Lists the directory for start-up without reading any file: stats each
  // entry and returns the blobs, least recently used first. Deleted and
  // reported in `dropped`, never listed: a blob file whose size differs
  // from its name (truncated, too long), a file whose name is not a
  // blob's, anything not a regular file, and leftover temporary files. An
  // error only when the directory itself cannot be listed.
  absl::StatusOr<ScanReport> Scan();

  // The blob's bytes, read and hashed in one pass (in chunks, straight into
  // the string returned). When they are not the blob's, or the file cannot
  // be read, the file is deleted and the error's message says why, for
  // the caller to report as dropped: DATA_LOSS (corrupt, truncated, too
  // long), NOT_FOUND (the file is gone), or errno's code. RESOURCE_EXHAUSTED
  // when memory for the bytes cannot be had: the file is left alone.
  absl::StatusOr<std::string> Read(const Digest& digest);

  // Records that the blob was used at `used`: sets its file's mtime (the
  // order Scan lists). A blob not on disk is fine. Not synced.
  absl::Status Touch(const Digest& digest, absl::Time used);

  // Bytes Read has read from files, for tests and logs.
  int64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

  // The blob's file, "<path>/sha256-<hash>-<size>".
  std::string FilePath(const Digest& digest) const;

  // The directory as given to Open.
  const std::string& path() const { return path_; }

  // The blob's file name within the directory, "sha256-<hash>-<size>".
  static std::string FileName(const Digest& digest);

 private:
  StoreDir(std::string path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}

  std::string path_;
  int lock_fd_;  // the marker, flock'ed while this object lives
  std::atomic<int64_t> bytes_read_{0};
};

}  // namespace tensorcheck
