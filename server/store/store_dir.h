// StoreDir: the tensor store's blobs on disk (`--store-dir`), so that they
// survive a restart. One file per blob; each is written to a temporary file
// and renamed into place once complete and synced, and re-hashed when it is
// loaded: a corrupt or truncated file is deleted and reported, never
// returned. No gRPC and no logging inside: LoadAll returns what it dropped
// and why, and the caller logs it (the service's LogEvent keeps JSON logs
// well-formed, which a plain spdlog line from here would not).
//
//   TC_ASSIGN_OR_RETURN(std::unique_ptr<StoreDir> dir, StoreDir::Open("/var/lib/tc"));
//   TC_ASSIGN_OR_RETURN(StoreDir::LoadReport report,
//                       dir->LoadAll([&](StoreDir::Loaded&& blob) {
//                         return store->Put(blob.digest, std::move(blob.bytes)).ok();
//                       }));                       // newest first, until the store is full
//   for (const auto& d : report.dropped) LogEvent(warn, "dropped", {{"path", d.path}, ...});
//   TC_RETURN_IF_ERROR(dir->Write(digest, bytes)); // after the store accepted them
//   TC_RETURN_IF_ERROR(dir->Remove(digest));       // when the store evicts them
//
// Layout of the directory:
//   sha256-<64 lowercase hex>-<size in decimal>   a blob, e.g. "sha256-e3b0...b855-0";
//                                                 the size has no leading zeros
//   .tmp-<hash>-<size>-<pid>-<n>                  a blob being written
//   .tensorcheck-store                            marks the directory as a store and
//                                                 holds its lock (see Open)
// Anything else found there is deleted by LoadAll (a subdirectory is only
// reported), which is why Open refuses a non-empty directory without the
// marker: a mistyped --store-dir must not empty someone's home directory.
//
// Thread safety: Write and Remove may be called from any thread at once,
// also for one digest (the last rename wins; the bytes are the same).
// LoadAll is meant for start-up, before the first Write: it deletes
// temporary files, including one a concurrent Write is filling (that Write
// then fails). One process holds a directory at a time (an flock on the
// marker, released when the StoreDir is destroyed).
//
// Error codes: FAILED_PRECONDITION when the directory cannot be used,
// RESOURCE_EXHAUSTED when the disk is full (ENOSPC, EDQUOT), otherwise the
// code of the failing call's errno (absl::ErrnoToStatus); every message
// names the path.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/store/digest.h"

namespace tensorcheck {

class StoreDir {
 public:
  // A blob read back by LoadAll: bytes whose size and SHA-256 were checked
  // against `digest` while reading.
  struct Loaded {
    Digest digest;
    std::string bytes;
  };

  // A directory entry LoadAll deleted (or, for a subdirectory, left alone)
  // instead of loading, for the caller to log as a warning.
  struct Dropped {
    std::string path;
    std::string reason;  // e.g. "truncated: 10 bytes, the name says 20"
  };

  struct LoadReport {
    int64_t loaded = 0;        // blobs `keep` accepted
    int64_t loaded_bytes = 0;  // their bytes together
    // Blobs not read because `keep` returned false; they stay on disk,
    // unverified, and are offered again at the next start.
    int64_t left_on_disk = 0;
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

  // Re-reads the directory: every blob file is read straight into the
  // string it is returned in (one copy, hashed while reading, in chunks)
  // and handed to `keep`, the most recently modified first (ties by name).
  // When `keep` returns false (the store is full), loading stops; that
  // blob and the ones after it stay on disk, not loaded (counted in
  // left_on_disk). Deleted and reported in `dropped`, never handed to
  // `keep`: a file whose size or hash differs from its name, a file that
  // cannot be read, a file whose name is not a blob's, and leftover
  // temporary files. An error only when the directory itself cannot be
  // listed.
  absl::StatusOr<LoadReport> LoadAll(const std::function<bool(Loaded&&)>& keep);

  // The directory as given to Open.
  const std::string& path() const { return path_; }

  // The blob's file name within the directory, "sha256-<hash>-<size>".
  static std::string FileName(const Digest& digest);

 private:
  StoreDir(std::string path, int lock_fd) : path_(std::move(path)), lock_fd_(lock_fd) {}

  std::string path_;
  int lock_fd_;  // the marker, flock'ed while this object lives
};

}  // namespace tensorcheck
