// The CLI's connection to the server (internal/connection.h).
#include "client/cli/internal/connection.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/client_interceptor.h"

namespace tensorcheck::cli::internal {
namespace {

namespace gx = ::grpc::experimental;

// The value of environment variable `name`, "" when unset.
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

// The whole of `path`, read for flag --`flag`; `pem_label` is what the
// file must hold a PEM block of ("CERTIFICATE", "PRIVATE KEY").
absl::StatusOr<std::string> ReadPemFile(const std::string& flag, const std::string& path,
                                        absl::string_view pem_label) {
  if (path.empty()) return Usage(absl::StrCat("--", flag, ": a file name expected"));
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) {
    return Usage(absl::StrCat("--", flag, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  std::string data;
  char buf[1 << 14];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) data.append(buf, n);
  if (std::ferror(f.get())) {
    return Usage(absl::StrCat("--", flag, ": cannot read ", path, ": ", std::strerror(errno)));
  }
  // Without this check a wrong file fails only at the handshake, as an
  // unreachable server.
  if (!absl::StrContains(data, "-----BEGIN ") ||
      !absl::StrContains(data, absl::StrCat(pem_label, "-----"))) {
    return Usage(absl::StrCat("--", flag, ": ", path, " holds no PEM ", pem_label));
  }
  return data;
}

// A token gRPC can send as a metadata value: printable ASCII, one line.
bool ValidToken(absl::string_view t) {
  for (char c : t) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// Adds `authorization: Bearer <token>` to every call's initial metadata.
// An interceptor rather than call credentials: gRPC sends those only over
// TLS, and the server also takes tokens over plaintext (inside a cluster).
class BearerInterceptor : public gx::Interceptor {
 public:
  explicit BearerInterceptor(std::string value) : value_(std::move(value)) {}

  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            gx::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", value_);
    }
    methods->Proceed();
  }

 private:
  const std::string value_;
};

class BearerInterceptorFactory : public gx::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(const std::string& token)
      : value_(absl::StrCat("Bearer ", token)) {}

  gx::Interceptor* CreateClientInterceptor(gx::ClientRpcInfo* /*info*/) override {
    return new BearerInterceptor(value_);
  }

 private:
  const std::string value_;
};

}  // namespace

std::string Connection::Describe() const { return tls ? absl::StrCat(target, ", TLS") : target; }

absl::StatusOr<Connection> ConnectionFromFlags(const CommandLine& cl) {
  Connection conn;
  if (cl.Has("server")) {
    conn.target = cl.Get("server");
    if (conn.target.empty()) return Usage("--server: HOST:PORT expected");
    if (cl.Has("target"))
      conn.warnings.push_back("--target is deprecated and ignored here: --server is given");
  } else if (cl.Has("target")) {
    conn.target = cl.Get("target");
    if (conn.target.empty()) return Usage("--target: HOST:PORT expected");
    conn.warnings.push_back("--target is deprecated: use --server");
  } else if (std::string env = Env(kServerEnv); !env.empty()) {
    conn.target = std::move(env);
  } else if (std::string old = Env(kDeprecatedServerEnv); !old.empty()) {
    conn.target = std::move(old);
    conn.warnings.push_back(absl::StrCat(kDeprecatedServerEnv, " is deprecated: set ", kServerEnv));
  }

  if (cl.Has("tls-cert") != cl.Has("tls-key")) {
    return Usage(cl.Has("tls-cert") ? "--tls-cert needs --tls-key (the certificate's private key)"
                                    : "--tls-key needs --tls-cert (the client certificate)");
  }
  if (cl.Has("tls-ca") || cl.Has("tls-cert")) {
    grpc::SslCredentialsOptions ssl;
    if (cl.Has("tls-ca")) {
      auto ca = ReadPemFile("tls-ca", cl.Get("tls-ca"), "CERTIFICATE");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *std::move(ca);
    }
    if (cl.Has("tls-cert")) {
      auto cert = ReadPemFile("tls-cert", cl.Get("tls-cert"), "CERTIFICATE");
      if (!cert.ok()) return cert.status();
      auto key = ReadPemFile("tls-key", cl.Get("tls-key"), "PRIVATE KEY");
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *std::move(cert);
      ssl.pem_private_key = *std::move(key);
    }
    conn.credentials = grpc::SslCredentials(ssl);
    conn.tls = true;
  }

  if (cl.Has("token")) {
    conn.token = cl.Get("token");
    if (!conn.token.empty()) conn.token_source = "--token";
  } else if (std::string env = Env(kTokenEnv); !env.empty()) {
    conn.token = std::move(env);
    conn.token_source = kTokenEnv;
  }
  if (!ValidToken(conn.token)) {
    return Usage(
        absl::StrCat(conn.token_source, ": the token must be one line of printable ASCII"));
  }
  return conn;
}

std::shared_ptr<grpc::Channel> MakeChannel(const Connection& conn,
                                           const grpc::ChannelArguments& args) {
  if (conn.token.empty()) return grpc::CreateCustomChannel(conn.target, conn.credentials, args);
  std::vector<std::unique_ptr<gx::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BearerInterceptorFactory>(conn.token));
  return gx::CreateCustomChannelWithInterceptors(conn.target, conn.credentials, args,
                                                 std::move(interceptors));
}

}  // namespace tensorcheck::cli::internal
