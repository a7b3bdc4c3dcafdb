#include "server/store/store_dir.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

namespace fs = std::filesystem;

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// SHA-256("abc"), from FIPS 180-2's example.
constexpr char kAbcSha256[] = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

std::string Bytes(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u + seed * 97u) >> 7);
  return s;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// The names in `dir`, the marker excluded.
std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != ".tensorcheck-store") names.insert(e.path().filename().string());
  }
  return names;
}

class StoreDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> n{0};
    root_ = fs::path(::testing::TempDir()) /
            absl::StrCat("store_dir_test-", ::getpid(), "-", n.fetch_add(1));
    fs::remove_all(root_);
    dir_ = root_ / "blobs";
  }
  void TearDown() override { fs::remove_all(root_); }

  std::unique_ptr<StoreDir> OpenDir() {
    auto dir = StoreDir::Open(dir_.string());
    EXPECT_THAT(dir, IsOk());
    return dir.ok() ? std::move(dir).value() : nullptr;
  }

  // Every blob LoadAll hands over, accepting all of them.
  std::vector<StoreDir::Loaded> LoadEverything(StoreDir& dir, StoreDir::LoadReport* report) {
    std::vector<StoreDir::Loaded> got;
    auto r = dir.LoadAll([&](StoreDir::Loaded&& blob) {
      got.push_back(std::move(blob));
      return true;
    });
    EXPECT_THAT(r, IsOk());
    if (r.ok() && report != nullptr) *report = *std::move(r);
    return got;
  }

  fs::path root_;
  fs::path dir_;
};

TEST_F(StoreDirTest, OpenCreatesTheDirectoryAndItsParents) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  EXPECT_EQ(dir->path(), dir_.string());
  EXPECT_TRUE(fs::is_directory(dir_));
  EXPECT_THAT(Names(dir_), IsEmpty());
}

TEST_F(StoreDirTest, BlobFileIsNamedByHashAndSize) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  ASSERT_THAT(dir->Write(Digest{kAbcSha256, 3}, "abc"), IsOk());
  const std::string name = absl::StrCat("sha256-", kAbcSha256, "-3");
  EXPECT_EQ(StoreDir::FileName(Digest{kAbcSha256, 3}), name);
  EXPECT_THAT(Names(dir_), ElementsAre(name));  // no temporary file left behind
  EXPECT_EQ(ReadFile(dir_ / name), "abc");
}

TEST_F(StoreDirTest, WrittenBlobsLoadBackInAFreshStoreDir) {
  const std::string a = "abc", b = Bytes(100000, 1), c = Bytes(4097, 2);
  {
    auto dir = OpenDir();
    ASSERT_NE(dir, nullptr);
    ASSERT_THAT(dir->Write(Digest{kAbcSha256, 3}, a), IsOk());
    ASSERT_THAT(dir->Write(DigestOf(b), b), IsOk());
    ASSERT_THAT(dir->Write(DigestOf(c), c), IsOk());
  }
  auto dir = OpenDir();  // as after a restart
  ASSERT_NE(dir, nullptr);
  StoreDir::LoadReport report;
  std::map<std::string, StoreDir::Loaded> got;
  for (auto& blob : LoadEverything(*dir, &report)) got[blob.bytes] = std::move(blob);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got["abc"].digest, (Digest{kAbcSha256, 3}));
  EXPECT_EQ(got[b].digest, DigestOf(b));
  EXPECT_EQ(got[c].digest, DigestOf(c));
  EXPECT_EQ(report.loaded, 3);
  EXPECT_EQ(report.loaded_bytes, 3 + 100000 + 4097);
  EXPECT_EQ(report.left_on_disk, 0);
  EXPECT_THAT(report.dropped, IsEmpty());
}

TEST_F(StoreDirTest, DamagedStrayAndTemporaryFilesAreDroppedAndDeleted) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  const std::string good = Bytes(5000, 3), cut = Bytes(6000, 4), flipped = Bytes(7000, 5);
  ASSERT_THAT(dir->Write(DigestOf(good), good), IsOk());
  ASSERT_THAT(dir->Write(DigestOf(cut), cut), IsOk());
  ASSERT_THAT(dir->Write(DigestOf(flipped), flipped), IsOk());
  const fs::path cut_file = dir_ / StoreDir::FileName(DigestOf(cut));
  const fs::path flipped_file = dir_ / StoreDir::FileName(DigestOf(flipped));
  fs::resize_file(cut_file, 5999);
  std::string damaged = flipped;
  damaged[3500] ^= 0x01;
  WriteFile(flipped_file, damaged);
  // Names that are not exactly a blob's: a stray file, upper-case hex, a
  // size with a leading zero, a missing size, and a crash's leftover.
  std::string upper_hex = kAbcSha256;
  for (char& ch : upper_hex) ch = (ch >= 'a' && ch <= 'f') ? static_cast<char>(ch - 32) : ch;
  const std::string upper = absl::StrCat("sha256-", upper_hex, "-3");
  const std::vector<std::string> stray = {
      "notes.txt", upper, absl::StrCat("sha256-", kAbcSha256, "-03"),
      absl::StrCat("sha256-", kAbcSha256), absl::StrCat(".tmp-", kAbcSha256, "-3-1-0")};
  for (const auto& name : stray) WriteFile(dir_ / name, "abc");

  StoreDir::LoadReport report;
  auto got = LoadEverything(*dir, &report);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].digest, DigestOf(good));
  EXPECT_EQ(got[0].bytes, good);
  EXPECT_EQ(report.loaded, 1);
  // Everything else is gone from disk and reported with its reason.
  EXPECT_THAT(Names(dir_), ElementsAre(StoreDir::FileName(DigestOf(good))));
  std::map<std::string, std::string> reasons;
  for (const auto& d : report.dropped) reasons[fs::path(d.path).filename().string()] = d.reason;
  EXPECT_EQ(reasons.size(), 2 + stray.size());
  EXPECT_THAT(reasons[cut_file.filename().string()], HasSubstr("truncated: 5999 bytes"));
  EXPECT_THAT(reasons[flipped_file.filename().string()], HasSubstr("corrupt"));
  EXPECT_THAT(reasons["notes.txt"], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[upper], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[stray[2]], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[stray[3]], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[stray[4]], HasSubstr("temporary"));
  for (const auto& d : report.dropped) EXPECT_THAT(d.path, HasSubstr(dir_.string()));
}

TEST_F(StoreDirTest, FileLongerThanItsNameIsDropped) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  WriteFile(dir_ / StoreDir::FileName(Digest{kAbcSha256, 3}), "abcd");
  StoreDir::LoadReport report;
  EXPECT_THAT(LoadEverything(*dir, &report), IsEmpty());
  ASSERT_EQ(report.dropped.size(), 1u);
  EXPECT_THAT(report.dropped[0].reason, HasSubstr("too long: 4 bytes"));
  EXPECT_THAT(Names(dir_), IsEmpty());
}

TEST_F(StoreDirTest, SubdirectoryIsReportedAndLeftAlone) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  fs::create_directory(dir_ / "keepme");
  WriteFile(dir_ / "keepme" / "precious", "x");
  StoreDir::LoadReport report;
  EXPECT_THAT(LoadEverything(*dir, &report), IsEmpty());
  ASSERT_EQ(report.dropped.size(), 1u);
  EXPECT_THAT(report.dropped[0].reason, HasSubstr("directory"));
  EXPECT_EQ(ReadFile(dir_ / "keepme" / "precious"), "x");
}

TEST_F(StoreDirTest, WritingABlobAlreadyThereWritesNothing) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  const fs::path file = dir_ / StoreDir::FileName(Digest{kAbcSha256, 3});
  ASSERT_THAT(dir->Write(Digest{kAbcSha256, 3}, "abc"), IsOk());
  // Mark the file: a second write that rewrote it would restore "abc".
  WriteFile(file, "xyz");
  EXPECT_THAT(dir->Write(Digest{kAbcSha256, 3}, "abc"), IsOk());
  EXPECT_EQ(ReadFile(file), "xyz");
  EXPECT_THAT(Names(dir_), ElementsAre(file.filename().string()));
}

TEST_F(StoreDirTest, RemoveDeletesTheFileAndAMissingBlobIsFine) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  const std::string b = Bytes(1000, 6);
  ASSERT_THAT(dir->Write(DigestOf(b), b), IsOk());
  ASSERT_THAT(dir->Write(Digest{kAbcSha256, 3}, "abc"), IsOk());
  EXPECT_THAT(dir->Remove(DigestOf(b)), IsOk());
  EXPECT_THAT(Names(dir_), ElementsAre(StoreDir::FileName(Digest{kAbcSha256, 3})));
  EXPECT_THAT(dir->Remove(DigestOf(b)), IsOk());
  auto got = LoadEverything(*dir, nullptr);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, "abc");
}

TEST_F(StoreDirTest, EmptyBlobRoundTrips) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  const Digest empty{kEmptySha256, 0};
  ASSERT_THAT(dir->Write(empty, ""), IsOk());
  EXPECT_EQ(fs::file_size(dir_ / absl::StrCat("sha256-", kEmptySha256, "-0")), 0u);
  StoreDir::LoadReport report;
  auto got = LoadEverything(*dir, &report);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].digest, empty);
  EXPECT_EQ(got[0].bytes, "");
  EXPECT_THAT(report.dropped, IsEmpty());
}

TEST_F(StoreDirTest, SixtyFourMebibyteBlobRoundTrips) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  // Not a multiple of the read chunk, so the last chunk is a short one.
  const std::string big = Bytes((size_t{64} << 20) + 12345, 7);
  const Digest d = DigestOf(big);
  ASSERT_THAT(dir->Write(d, big), IsOk());
  EXPECT_EQ(fs::file_size(dir_ / StoreDir::FileName(d)), big.size());
  auto got = LoadEverything(*dir, nullptr);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].digest, d);
  EXPECT_TRUE(got[0].bytes == big);  // not EXPECT_EQ: no 64 MiB failure message
}

TEST_F(StoreDirTest, LoadsNewestFirstAndStopsWhenKeepSaysFull) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  const std::string old_b = Bytes(100, 8), mid_b = Bytes(200, 9), new_b = Bytes(300, 10);
  const fs::file_time_type now = fs::file_time_type::clock::now();
  int age = 3;
  for (const std::string* b : {&old_b, &mid_b, &new_b}) {
    ASSERT_THAT(dir->Write(DigestOf(*b), *b), IsOk());
    fs::last_write_time(dir_ / StoreDir::FileName(DigestOf(*b)), now - std::chrono::hours(age--));
  }
  std::vector<int64_t> offered;
  auto report = dir->LoadAll([&](StoreDir::Loaded&& blob) {
    offered.push_back(static_cast<int64_t>(blob.bytes.size()));
    return offered.size() < 2;  // room for one only
  });
  ASSERT_THAT(report, IsOk());
  EXPECT_THAT(offered, ElementsAre(300, 200));  // the third is never read
  EXPECT_EQ(report->loaded, 1);
  EXPECT_EQ(report->loaded_bytes, 300);
  EXPECT_EQ(report->left_on_disk, 2);
  EXPECT_THAT(report->dropped, IsEmpty());
  // What was not loaded stays on disk for the next start.
  std::vector<int64_t> all;
  for (auto& blob : LoadEverything(*dir, nullptr)) all.push_back(blob.digest.size);
  EXPECT_THAT(all, ElementsAre(300, 200, 100));
}

TEST_F(StoreDirTest, OpenUnderARegularFileFailsNamingThePath) {
  fs::create_directories(root_);
  WriteFile(root_ / "file", "x");
  const std::string path = (root_ / "file" / "blobs").string();
  EXPECT_THAT(StoreDir::Open(path),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path)));
  EXPECT_THAT(StoreDir::Open((root_ / "file").string()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a directory")));
  EXPECT_THAT(StoreDir::Open(""), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreDirTest, OpenRefusesANonEmptyDirectoryThatIsNotAStore) {
  fs::create_directories(dir_);
  WriteFile(dir_ / "thesis.tex", "years of work");
  EXPECT_THAT(
      StoreDir::Open(dir_.string()),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               HasSubstr(absl::StrCat(dir_.string(), ": not empty and not a tensor store"))));
  EXPECT_EQ(ReadFile(dir_ / "thesis.tex"), "years of work");
}

TEST_F(StoreDirTest, ADirectoryIsHeldByOneStoreDirAtATime) {
  auto first = OpenDir();
  ASSERT_NE(first, nullptr);
  EXPECT_THAT(StoreDir::Open(dir_.string()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use")));
  first.reset();
  EXPECT_THAT(StoreDir::Open(dir_.string()), IsOk());
}

TEST_F(StoreDirTest, WriteChecksTheSizeAndRefusesAMalformedDigest) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  EXPECT_THAT(dir->Write(Digest{kAbcSha256, 4}, "abc"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("3 bytes given")));
  const Digest escape{"../../../../tmp/owned-0000000000000000000000000000000000000000000", 3};
  EXPECT_THAT(dir->Write(escape, "abc"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(dir->Remove(escape), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Names(dir_), IsEmpty());
}

}  // namespace
}  // namespace tensorcheck
