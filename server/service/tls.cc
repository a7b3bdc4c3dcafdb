#include "server/service/tls.h"

#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
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

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) return Bad(flag, path, "cannot be read");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Bad(flag, path, "cannot be read");
  return bytes;
}

absl::StatusOr<Cert> ParseCert(const char* flag, const std::string& path, const std::string& pem) {
  Bio bio = MemoryBio(pem);
  Cert cert(bio == nullptr ? nullptr : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (cert == nullptr) return Bad(flag, path, "holds no PEM certificate");
  return cert;
}

// The first certificate of a bundle whose certificates are all well
// formed, with no private key among them.
absl::StatusOr<Cert> ParseBundle(const char* flag, const std::string& path,
                                 const std::string& pem) {
  Bio bio = MemoryBio(pem);
  STACK_OF(X509_INFO)* infos =
      bio == nullptr ? nullptr : PEM_X509_INFO_read_bio(bio.get(), nullptr, nullptr, nullptr);
  ERR_clear_error();
  if (infos == nullptr) return Bad(flag, path, "is not a PEM bundle of certificates");
  Cert first;
  int certificates = 0;
  bool key = false;
  for (int i = 0; i < sk_X509_INFO_num(infos); ++i) {
    X509_INFO* info = sk_X509_INFO_value(infos, i);
    key = key || info->x_pkey != nullptr;
    if (info->x509 == nullptr) continue;
    if (certificates++ == 0) {
      X509_up_ref(info->x509);
      first.reset(info->x509);
    }
  }
  sk_X509_INFO_pop_free(infos, X509_INFO_free);
  if (certificates == 0) return Bad(flag, path, "holds no PEM certificate");
  // A private key there is a file mixed up with another.
  if (key) return Bad(flag, path, "holds a private key; a CA bundle holds certificates only");
  return first;
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

absl::StatusOr<TlsSet> ReadTlsFiles(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: both or neither expected (TLS needs the certificate and its "
        "key)");
  }
  TlsSet set;
  TC_ASSIGN_OR_RETURN(set.cert, ReadFile("--tls-cert", files.cert));
  TC_ASSIGN_OR_RETURN(set.key, ReadFile("--tls-key", files.key));
  if (!files.client_ca.empty()) {
    TC_ASSIGN_OR_RETURN(set.client_ca, ReadFile("--tls-client-ca", files.client_ca));
  }
  return set;
}

absl::StatusOr<std::string> CheckTls(const TlsFiles& files, const TlsSet& set) {
  TC_ASSIGN_OR_RETURN(const Cert cert, ParseCert("--tls-cert", files.cert, set.cert));
  Bio bio = MemoryBio(set.key);
  Key key(bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  ERR_clear_error();
  if (key == nullptr) return Bad("--tls-key", files.key, "holds no PEM private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    return Bad("--tls-key", files.key,
               absl::StrCat("is not the key of the certificate in ", files.cert));
  }
  std::string about = absl::StrCat("certificate ", Describe(cert.get()));
  if (!files.client_ca.empty()) {
    TC_ASSIGN_OR_RETURN(const Cert ca,
                        ParseBundle("--tls-client-ca", files.client_ca, set.client_ca));
    absl::StrAppend(&about, "; client CA ", Describe(ca.get()));
  }
  return about;
}

namespace {
constexpr char kCert[] = "cert.pem";
constexpr char kKey[] = "key.pem";
constexpr char kCa[] = "ca.pem";

absl::Status WriteFile(const std::filesystem::path& path, const std::string& bytes,
                       int64_t mtime_seconds) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path.string(), ": ", strerror(errno)));
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", path.string(), ": ", strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  // A modification time of the generation's own: gRPC's watcher compares
  // the times before and after its reads, so a read that straddles a
  // swap of generations is read again.
  const timespec times[2] = {{mtime_seconds, 0}, {mtime_seconds, 0}};
  const bool timed = futimens(fd, times) == 0;
  const int err = errno;
  close(fd);
  if (!timed) {
    return absl::InternalError(
        absl::StrCat("cannot set the time of ", path.string(), ": ", strerror(err)));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::unique_ptr<ServedTls>> ServedTls::Start(const TlsFiles& files,
                                                            const std::string& root) {
  TC_ASSIGN_OR_RETURN(const TlsSet set, ReadTlsFiles(files));
  TC_ASSIGN_OR_RETURN(std::string about, CheckTls(files, set));
  std::string base = root;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  }
  std::string pattern = (std::filesystem::path(base) / "tensorcheck-tls-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {  // mode 0700
    return absl::InternalError(absl::StrCat("cannot make a private directory for the TLS files in ",
                                            base, ": ", strerror(errno)));
  }
  auto tls = std::unique_ptr<ServedTls>(new ServedTls(files, pattern));
  std::lock_guard<std::mutex> lock(tls->mu_);
  TC_RETURN_IF_ERROR(tls->Install(set));
  tls->about_ = std::move(about);
  return tls;
}

ServedTls::~ServedTls() {
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

absl::Status ServedTls::Install(const TlsSet& set) {
  const int64_t generation = generation_ + 1;
  const std::filesystem::path dir(dir_);
  const std::string name = absl::StrCat("gen-", generation);
  std::error_code ec;
  std::filesystem::create_directory(dir / name, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot make ", (dir / name).string(), ": ", ec.message()));
  }
  // Times far apart from any other generation's (and from "now").
  const int64_t mtime = 1'000'000'000 + generation;
  TC_RETURN_IF_ERROR(WriteFile(dir / name / kCert, set.cert, mtime));
  TC_RETURN_IF_ERROR(WriteFile(dir / name / kKey, set.key, mtime));
  if (!files_.client_ca.empty()) {
    TC_RETURN_IF_ERROR(WriteFile(dir / name / kCa, set.client_ca, mtime));
  }
  const std::filesystem::path link = dir / "current";
  const std::filesystem::path staged = dir / "current.new";
  std::filesystem::remove(staged, ec);
  std::filesystem::create_directory_symlink(name, staged, ec);
  if (!ec) std::filesystem::rename(staged, link, ec);  // atomic: the link is swapped
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot point ", link.string(), " at ", name, ": ", ec.message()));
  }
  // The generation before stays for a watcher still reading it.
  std::filesystem::remove_all(dir / absl::StrCat("gen-", generation - 2), ec);
  generation_ = generation;
  in_force_ = set;
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> ServedTls::Credentials(absl::Duration refresh) const {
  const auto seconds =
      static_cast<unsigned int>(std::max(1.0, std::ceil(absl::ToDoubleSeconds(refresh))));
  const std::filesystem::path current = std::filesystem::path(dir_) / "current";
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider;
  if (files_.client_ca.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        (current / kKey).string(), (current / kCert).string(), seconds);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        (current / kKey).string(), (current / kCert).string(), (current / kCa).string(), seconds);
  }
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (files_.client_ca.empty()) {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

ServedTls::ReloadResult ServedTls::Reload() {
  ReloadResult r;
  absl::StatusOr<TlsSet> set = ReadTlsFiles(files_);
  absl::StatusOr<std::string> about =
      set.ok() ? CheckTls(files_, *set) : absl::StatusOr<std::string>(set.status());
  if (!about.ok()) {
    // Caught half way through an update? Then the files read differently
    // now, and the next call sees the finished set.
    const absl::StatusOr<TlsSet> again = ReadTlsFiles(files_);
    const bool settled = set.ok() == again.ok() && (!set.ok() || *set == *again);
    if (!settled) return r;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!about.ok()) {
    r.outcome = Outcome::kRefused;
    r.error = about.status();
    // Each distinct set counts once, however many polls see it.
    const TlsSet refused = set.ok() ? *set : TlsSet{};
    r.new_error = !refusing_ || !(refused == last_refused_);
    if (r.new_error) ++refused_sets_;
    refusing_ = true;
    last_refused_ = refused;
    return r;
  }
  refusing_ = false;
  if (*set == in_force_) return r;
  if (const absl::Status s = Install(*set); !s.ok()) {
    r.outcome = Outcome::kRefused;
    r.error = s;
    r.new_error = true;
    ++refused_sets_;
    return r;
  }
  about_ = *about;
  r.outcome = Outcome::kReplaced;
  r.about = *std::move(about);
  return r;
}

std::string ServedTls::about() const {
  std::lock_guard<std::mutex> lock(mu_);
  return about_;
}

int64_t ServedTls::refused_sets() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_sets_;
}

bool ServedTls::refusing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusing_;
}

}  // namespace tensorcheck
