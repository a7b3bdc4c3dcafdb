// ServedTls: the set in force is replaced only by a set that passes the
// check, as a whole (docs/operations.md, "Rotating tokens and
// certificates"). Certificates are made here with OpenSSL.
#include "server/service/tls.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A P-256 key and a certificate for it, self-signed under `cn`, as PEM.
struct Pem {
  std::string cert;
  std::string key;
};

Pem MakeSelfSigned(const std::string& cn) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 86400);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  auto to_string = [](BIO* bio) {
    char* data = nullptr;
    const long n = BIO_get_mem_data(bio, &data);
    std::string s(data, static_cast<size_t>(n));
    BIO_free(bio);
    return s;
  };
  BIO* c = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(c, cert);
  BIO* k = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr);
  Pem pem{to_string(c), to_string(k)};
  X509_free(cert);
  EVP_PKEY_free(key);
  return pem;
}

std::string Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// As an operator rotates: a temporary file renamed over the old one.
void Replace(const fs::path& path, const std::string& bytes) {
  const fs::path tmp = path.string() + ".tmp";
  std::ofstream(tmp, std::ios::binary) << bytes;
  fs::rename(tmp, path);
}

class ServedTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("served_tls_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "private");
    server_ = MakeSelfSigned("server one");
    ca_ = MakeSelfSigned("client CA one");
    files_ = {(dir_ / "tls.crt").string(), (dir_ / "tls.key").string(), (dir_ / "ca.crt").string()};
    Replace(files_.cert, server_.cert);
    Replace(files_.key, server_.key);
    Replace(files_.client_ca, ca_.cert);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // What gRPC's watcher reads now.
  std::string Served(const char* name) const {
    return Read(fs::path(tls_->dir()) / "current" / name);
  }
  void Start() {
    auto tls = ServedTls::Start(files_, (dir_ / "private").string());
    ASSERT_THAT(tls, IsOk());
    tls_ = std::move(*tls);
  }

  fs::path dir_;
  Pem server_, ca_;
  TlsFiles files_;
  std::unique_ptr<ServedTls> tls_;
};

TEST_F(ServedTlsTest, TheWatcherReadsAPrivateCopyOfTheCheckedFiles) {
  Start();
  EXPECT_EQ(Served("cert.pem"), server_.cert);
  EXPECT_EQ(Served("key.pem"), server_.key);
  EXPECT_EQ(Served("ca.pem"), ca_.cert);
  EXPECT_NE(fs::path(tls_->dir()).parent_path(), dir_);  // not the operator's directory
  EXPECT_THAT(tls_->about(), HasSubstr("CN=server one"));
  struct stat st = {};
  ASSERT_EQ(stat(tls_->dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);  // the key is copied there
  EXPECT_EQ(tls_->Reload().outcome, ServedTls::Outcome::kUnchanged);
  const std::string dir = tls_->dir();
  tls_.reset();
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(ServedTlsTest, ABrokenCaBundleIsRefusedAndTheSetInForceStays) {
  Start();
  Replace(files_.client_ca,
          "-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
          "-----END CERTIFICATE-----\n");
  const ServedTls::ReloadResult r = tls_->Reload();
  EXPECT_EQ(r.outcome, ServedTls::Outcome::kRefused);
  EXPECT_THAT(r.error, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-client-ca")));
  EXPECT_TRUE(r.new_error);
  EXPECT_EQ(Served("ca.pem"), ca_.cert);
  EXPECT_TRUE(tls_->refusing());
  // Every later poll sees the same set: refused, counted once.
  const ServedTls::ReloadResult again = tls_->Reload();
  EXPECT_EQ(again.outcome, ServedTls::Outcome::kRefused);
  EXPECT_FALSE(again.new_error);
  EXPECT_EQ(tls_->refused_sets(), 1);
  // A CA file with a key in it instead of certificates is no better.
  Replace(files_.client_ca, ca_.cert + server_.key);
  EXPECT_EQ(tls_->Reload().outcome, ServedTls::Outcome::kRefused);
  EXPECT_EQ(tls_->refused_sets(), 2);
  EXPECT_EQ(Served("ca.pem"), ca_.cert);
}

TEST_F(ServedTlsTest, AKeyThatIsNotTheCertificatesIsRefusedWithTheCertificateStillServed) {
  Start();
  const Pem other = MakeSelfSigned("server two");
  Replace(files_.cert, other.cert);  // the new certificate, the old key
  const ServedTls::ReloadResult r = tls_->Reload();
  EXPECT_EQ(r.outcome, ServedTls::Outcome::kRefused);
  EXPECT_THAT(r.error, StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("is not the key of the certificate")));
  EXPECT_EQ(Served("cert.pem"), server_.cert);
  EXPECT_EQ(Served("key.pem"), server_.key);
  // Its key arrives: the set is whole and replaces the old one together.
  Replace(files_.key, other.key);
  const ServedTls::ReloadResult done = tls_->Reload();
  EXPECT_EQ(done.outcome, ServedTls::Outcome::kReplaced);
  EXPECT_THAT(done.about, HasSubstr("CN=server two"));
  EXPECT_EQ(Served("cert.pem"), other.cert);
  EXPECT_EQ(Served("key.pem"), other.key);
  EXPECT_EQ(Served("ca.pem"), ca_.cert);
  EXPECT_FALSE(tls_->refusing());
  EXPECT_EQ(tls_->refused_sets(), 1);
}

TEST_F(ServedTlsTest, AnUnreadableFileIsRefused) {
  Start();
  fs::remove(files_.key);
  const ServedTls::ReloadResult r = tls_->Reload();
  EXPECT_EQ(r.outcome, ServedTls::Outcome::kRefused);
  EXPECT_THAT(r.error, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-key")));
  EXPECT_EQ(Served("key.pem"), server_.key);
}

TEST_F(ServedTlsTest, EachGenerationHasItsOwnFileTimesAndOnlyTwoAreKept) {
  Start();
  struct stat before = {};
  ASSERT_EQ(stat((fs::path(tls_->dir()) / "current" / "cert.pem").c_str(), &before), 0);
  for (int i = 0; i < 3; ++i) {
    const Pem next = MakeSelfSigned("server " + std::to_string(i));
    Replace(files_.cert, next.cert);
    Replace(files_.key, next.key);
    ASSERT_EQ(tls_->Reload().outcome, ServedTls::Outcome::kReplaced);
    struct stat after = {};
    ASSERT_EQ(stat((fs::path(tls_->dir()) / "current" / "cert.pem").c_str(), &after), 0);
    // gRPC's watcher tells a read that straddled a swap by these times.
    EXPECT_NE(after.st_mtime, before.st_mtime);
    before = after;
  }
  int generations = 0;
  for (const auto& entry : fs::directory_iterator(tls_->dir())) {
    generations += entry.path().filename().string().rfind("gen-", 0) == 0;
  }
  EXPECT_EQ(generations, 2);
}

TEST(TlsCheckTest, OnlyOneOfCertAndKeyIsInvalidArgument) {
  EXPECT_THAT(ServedTls::Start({"/x.crt", "", ""}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-cert and --tls-key")));
}

}  // namespace
}  // namespace tensorcheck
