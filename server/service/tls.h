// TLS for the server's port (docs/operations.md, "TLS and mutual TLS"):
// the certificate and key it presents and, for mutual TLS, the CA its
// clients' certificates must chain to. gRPC's file watcher re-reads the
// files, so a rotated certificate is served without a restart.
//
//   TlsFiles files{"/tls/tls.crt", "/tls/tls.key", "/tls/ca.crt"};
//   TC_ASSIGN_OR_RETURN(std::string about, CheckTlsFiles(files));  // at start, on SIGHUP
//   builder.AddListeningPort(address, TlsServerCredentials(files, absl::Seconds(5)));
#pragma once

#include <memory>
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

// Reads and checks the files as gRPC will use them: a certificate, the key
// that matches it, and a CA certificate when given. What they hold
// ("CN=... until 2027-01-01, sha256 ..."), or INVALID_ARGUMENT naming the
// flag (--tls-cert, --tls-key, --tls-client-ca) and the problem.
absl::StatusOr<std::string> CheckTlsFiles(const TlsFiles& files);

// Credentials that serve the files' current contents, re-read every
// `refresh` (at least a second); with client_ca, a client without a
// certificate from that CA cannot connect.
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsFiles& files,
                                                              absl::Duration refresh);

}  // namespace tensorcheck
