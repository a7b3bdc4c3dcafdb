#include "server/service/tls.h"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace tensorcheck {

namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

absl::Status Bad(const char* flag, const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", what));
}

absl::StatusOr<Cert> ReadCert(const char* flag, const std::string& path) {
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (bio == nullptr) return Bad(flag, path, "cannot be read");
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) return Bad(flag, path, "holds no PEM certificate");
  return cert;
}

std::string Describe(X509* cert) {
  char subject[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof(subject));
  std::string until = "?";
  if (Bio out(BIO_new(BIO_s_mem()));
      out != nullptr && ASN1_TIME_print(out.get(), X509_get0_notAfter(cert)) == 1) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(out.get(), &data);
    until.assign(data, static_cast<size_t>(n));
  }
  unsigned char fp[EVP_MAX_MD_SIZE];
  unsigned int fp_len = 0;
  X509_digest(cert, EVP_sha256(), fp, &fp_len);
  return absl::StrCat(
      subject, " until ", until, ", sha256 ",
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(fp), fp_len)));
}

}  // namespace

absl::StatusOr<std::string> CheckTlsFiles(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: both or neither expected (TLS needs the certificate and its "
        "key)");
  }
  absl::StatusOr<Cert> cert = ReadCert("--tls-cert", files.cert);
  if (!cert.ok()) return cert.status();
  Bio bio(BIO_new_file(files.key.c_str(), "r"));
  if (bio == nullptr) return Bad("--tls-key", files.key, "cannot be read");
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) return Bad("--tls-key", files.key, "holds no PEM private key");
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return Bad("--tls-key", files.key,
               absl::StrCat("is not the key of the certificate in ", files.cert));
  }
  std::string about = absl::StrCat("certificate ", Describe(cert->get()));
  if (!files.client_ca.empty()) {
    absl::StatusOr<Cert> ca = ReadCert("--tls-client-ca", files.client_ca);
    if (!ca.ok()) return ca.status();
    absl::StrAppend(&about, "; client CA ", Describe(ca->get()));
  }
  return about;
}

std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsFiles& files,
                                                              absl::Duration refresh) {
  const auto seconds =
      static_cast<unsigned int>(std::max(1.0, std::ceil(absl::ToDoubleSeconds(refresh))));
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key, files.cert, files.client_ca, seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace tensorcheck
