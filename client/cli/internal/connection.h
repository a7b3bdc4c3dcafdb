// How the CLI reaches the server: the target, TLS and the bearer token, from
// the flags every command that calls the server takes and from the
// environment. Internal to client/cli.
//
//   TC_ASSIGN_OR_RETURN(Connection conn, ConnectionFromFlags(cl));
//   auto stub = pb::TensorCheck::NewStub(MakeChannel(conn, grpc::ChannelArguments()));
//
//   --server HOST:PORT   else $TENSORCHECK_SERVER, else localhost:50051
//                        (--target and $TENSORCHECK_TARGET: deprecated
//                        names of the same, read with a warning)
//   --tls-ca FILE        PEM roots the server's certificate must chain to;
//                        turns TLS on
//   --tls-cert FILE      PEM client certificate chain (mTLS), with
//   --tls-key FILE       its PEM private key: both or neither; they turn
//                        TLS on too (with the system's roots when there is
//                        no --tls-ca)
//   --token TOKEN        else $TENSORCHECK_TOKEN; sent as
//                        `authorization: Bearer TOKEN` on every call, over
//                        TLS or plaintext alike; an empty --token sends none
//
// Errors are INVALID_ARGUMENT usage errors whose message starts with the
// flag (or the environment variable) at fault: an unreadable or empty file,
// a file without PEM, --tls-cert without --tls-key or the reverse, a token
// that is not one line of printable ASCII.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli/internal/command_line.h"
#include "grpcpp/grpcpp.h"

namespace tensorcheck::cli::internal {

// The target when neither --server nor $TENSORCHECK_SERVER gives one.
inline constexpr char kDefaultServer[] = "localhost:50051";
// The environment variables read when the flag is not given (an empty
// value counts as unset).
inline constexpr char kServerEnv[] = "TENSORCHECK_SERVER";
inline constexpr char kTokenEnv[] = "TENSORCHECK_TOKEN";
// The deprecated name of kServerEnv, read when it is unset.
inline constexpr char kDeprecatedServerEnv[] = "TENSORCHECK_TARGET";

struct Connection {
  std::string target = kDefaultServer;
  // TLS (or plaintext when false) credentials; never null.
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  bool tls = false;
  // Empty: no authorization metadata.
  std::string token;
  // Where the token came from: "--token" or "TENSORCHECK_TOKEN" ("" without one).
  std::string token_source;

  // Deprecated names the flags or the environment used ("--target is
  // deprecated: use --server"), for the caller to print on stderr.
  std::vector<std::string> warnings;

  // The target as error messages name it: "HOST:PORT", "HOST:PORT, TLS".
  std::string Describe() const;
};

// The connection the flags and the environment ask for; reads the PEM files.
absl::StatusOr<Connection> ConnectionFromFlags(const CommandLine& cl);

// A channel to conn.target with conn's credentials whose every call carries
// the token, if any.
std::shared_ptr<grpc::Channel> MakeChannel(const Connection& conn,
                                           const grpc::ChannelArguments& args);

}  // namespace tensorcheck::cli::internal
