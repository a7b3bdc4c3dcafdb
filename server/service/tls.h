// TLS for the server's port (docs/operations.md, "TLS and mutual TLS"):
// the certificate and key it presents and, for mutual TLS, the CA its
// clients' certificates must chain to. A rotated set is served without a
// restart, and only as a whole: a new certificate, key and CA bundle are
// checked together before they replace the set in force, so a broken file
// or a key that is not the certificate's never reaches a handshake.
//
//   TlsFiles files{"/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"};
//   TC_ASSIGN_OR_RETURN(auto tls, ServedTls::Start(files));   // checks them
//   builder.AddListeningPort(address, tls->Credentials(absl::Seconds(5)));
//   ServedTls::ReloadResult r = tls->Reload();   // every poll, and on SIGHUP
//   if (r.outcome == ServedTls::Outcome::kRefused) log(r.error);  // old set stays
//
// How: gRPC's file watcher serves a private copy of the set (a directory
// of generations under $TMPDIR, the current one named by a symlink that is
// swapped in one rename), never the operator's files; Reload writes a new
// generation only once the set passed CheckTls. Each generation's files
// carry their own modification time, so a watcher read that straddles a
// swap is seen by gRPC's own before/after check and read again.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"

namespace tensorcheck {

struct TlsFiles {
  std::string cert;       // PEM: the server's certificate (chain)
  std::string key;        // PEM: its private key
  std::string client_ca;  // PEM: client certificates required, issued by this CA; empty: none

  bool enabled() const { return !cert.empty() || !key.empty(); }
};

// The contents of a TlsFiles set, as read at one moment.
struct TlsSet {
  std::string cert;
  std::string key;
  std::string client_ca;  // empty when TlsFiles::client_ca is

  bool operator==(const TlsSet& o) const {
    return cert == o.cert && key == o.key && client_ca == o.client_ca;
  }
};

// Reads the files; INVALID_ARGUMENT naming the flag (--tls-cert,
// --tls-key, --tls-client-ca) of a file that cannot be read, or when only
// one of cert and key is given.
absl::StatusOr<TlsSet> ReadTlsFiles(const TlsFiles& files);

// Checks a set as gRPC will use it: a certificate, the key that matches
// it, and a CA bundle of well-formed certificates (no private key) when
// given. What it holds
// ("CN=... until 2027-01-01, sha256 ..."), or INVALID_ARGUMENT naming the
// flag and file (paths from `files`) and the problem.
absl::StatusOr<std::string> CheckTls(const TlsFiles& files, const TlsSet& set);

// The set in force and its rotation (see the top of this file).
// Thread-safe.
class ServedTls {
 public:
  // Checks the files and copies them into a new private directory under
  // `root` (empty: $TMPDIR, else /tmp); INVALID_ARGUMENT as CheckTls, or
  // the error of a directory that cannot be written.
  static absl::StatusOr<std::unique_ptr<ServedTls>> Start(const TlsFiles& files,
                                                          const std::string& root = "");
  ~ServedTls();  // removes the private directory
  ServedTls(const ServedTls&) = delete;
  ServedTls& operator=(const ServedTls&) = delete;

  // Credentials serving the set in force, re-read by gRPC every `refresh`
  // (at least a second); with a client CA, a client without a certificate
  // from it cannot connect.
  std::shared_ptr<grpc::ServerCredentials> Credentials(absl::Duration refresh) const;

  enum class Outcome {
    kUnchanged,  // the files hold the set in force (or are being replaced)
    kReplaced,   // a new set passed the check and is now in force
    kRefused,    // the files hold a set that fails the check; the old one stays
  };
  struct ReloadResult {
    Outcome outcome = Outcome::kUnchanged;
    std::string about;       // kReplaced: what the new set holds
    absl::Status error;      // kRefused: what is wrong with it
    bool new_error = false;  // kRefused: a set not refused before
  };
  // Reads the files and puts their set in force when it differs and
  // passes the check. A set that fails it is read again once: one caught
  // half way through an update (new certificate, old key) reads
  // differently the second time and waits for the next call.
  ReloadResult Reload();

  // What the set in force holds; how many sets were refused (each
  // distinct set once), and whether the files hold a refused set now.
  std::string about() const;
  int64_t refused_sets() const;
  bool refusing() const;

  // The private copy gRPC reads (for tests): DIR/current/{cert,key,ca}.pem.
  const std::string& dir() const { return dir_; }

 private:
  ServedTls(const TlsFiles& files, std::string dir) : files_(files), dir_(std::move(dir)) {}
  // Writes generation `generation_ + 1` and points "current" at it.
  // Needs mu_.
  absl::Status Install(const TlsSet& set);

  const TlsFiles files_;
  const std::string dir_;
  mutable std::mutex mu_;
  TlsSet in_force_;           // guarded by mu_
  std::string about_;         // guarded by mu_
  int64_t generation_ = 0;    // guarded by mu_
  TlsSet last_refused_;       // guarded by mu_
  bool refusing_ = false;     // guarded by mu_
  int64_t refused_sets_ = 0;  // guarded by mu_
};

}  // namespace tensorcheck
