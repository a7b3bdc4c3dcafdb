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

  struct Loaded {
    Digest digest;
    std::string bytes;
  };
  // Every blob Scan lists, then read back (those Read drops left out).
  std::vector<Loaded> LoadEverything(StoreDir& dir, StoreDir::ScanReport* report) {
    std::vector<Loaded> got;
    auto r = dir.Scan();
    EXPECT_THAT(r, IsOk());
    if (!r.ok()) return got;
    for (const StoreDir::Listed& blob : r->blobs) {
      auto bytes = dir.Read(blob.digest);
      if (bytes.ok()) got.push_back({blob.digest, *std::move(bytes)});
    }
    if (report != nullptr) *report = *std::move(r);
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
  StoreDir::ScanReport report;
  std::map<std::string, Loaded> got;
  for (auto& blob : LoadEverything(*dir, &report)) got[blob.bytes] = std::move(blob);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got["abc"].digest, (Digest{kAbcSha256, 3}));
  EXPECT_EQ(got[b].digest, DigestOf(b));
  EXPECT_EQ(got[c].digest, DigestOf(c));
  EXPECT_EQ(report.blobs.size(), 3u);
  EXPECT_EQ(dir->bytes_read(), 3 + 100000 + 4097);
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

  // Scan reads no file: the flipped byte goes unseen, the wrong size not.
  auto report = dir->Scan();
  ASSERT_THAT(report, IsOk());
  EXPECT_EQ(dir->bytes_read(), 0);
  std::set<std::string> listed;
  for (const auto& b : report->blobs) listed.insert(StoreDir::FileName(b.digest));
  EXPECT_THAT(listed, UnorderedElementsAre(StoreDir::FileName(DigestOf(good)),
                                           flipped_file.filename().string()));
  // Reading finds it, deletes it, and says why.
  EXPECT_THAT(dir->Read(DigestOf(flipped)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("corrupt: its SHA-256 is")));
  auto read = dir->Read(DigestOf(good));
  ASSERT_THAT(read, IsOk());
  EXPECT_EQ(*read, good);
  // Everything else is gone from disk and reported with its reason.
  EXPECT_THAT(Names(dir_), ElementsAre(StoreDir::FileName(DigestOf(good))));
  std::map<std::string, std::string> reasons;
  for (const auto& d : report->dropped) reasons[fs::path(d.path).filename().string()] = d.reason;
  EXPECT_EQ(reasons.size(), 1 + stray.size());
  EXPECT_THAT(reasons[cut_file.filename().string()], HasSubstr("truncated: 5999 bytes"));
  EXPECT_THAT(reasons["notes.txt"], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[upper], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[stray[2]], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[stray[3]], HasSubstr("not a blob's file name"));
  EXPECT_THAT(reasons[stray[4]], HasSubstr("temporary"));
  for (const auto& d : report->dropped) EXPECT_THAT(d.path, HasSubstr(dir_.string()));
}

TEST_F(StoreDirTest, FileLongerThanItsNameIsDropped) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  WriteFile(dir_ / StoreDir::FileName(Digest{kAbcSha256, 3}), "abcd");
  StoreDir::ScanReport report;
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
  StoreDir::ScanReport report;
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
  StoreDir::ScanReport report;
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

TEST_F(StoreDirTest, ScanListsLeastRecentlyUsedFirstAndReadsNothing) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  const std::string old_b = Bytes(100, 8), mid_b = Bytes(200, 9), new_b = Bytes(300, 10);
  const fs::file_time_type now = fs::file_time_type::clock::now();
  int age = 3;
  for (const std::string* b : {&new_b, &old_b, &mid_b}) {
    ASSERT_THAT(dir->Write(DigestOf(*b), *b), IsOk());
  }
  for (const std::string* b : {&old_b, &mid_b, &new_b}) {
    fs::last_write_time(dir_ / StoreDir::FileName(DigestOf(*b)), now - std::chrono::hours(age--));
  }
  auto report = dir->Scan();
  ASSERT_THAT(report, IsOk());
  std::vector<int64_t> order;
  for (const auto& blob : report->blobs) order.push_back(blob.digest.size);
  EXPECT_THAT(order, ElementsAre(100, 200, 300));
  EXPECT_LT(report->blobs[0].used, report->blobs[1].used);
  EXPECT_EQ(dir->bytes_read(), 0);  // start-up does not read the files
  EXPECT_THAT(report->dropped, IsEmpty());
}

TEST_F(StoreDirTest, TouchSetsTheTimeOfUseThatScanOrdersBy) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  std::vector<Digest> d;
  for (int i = 0; i < 4; ++i) {
    const std::string b = Bytes(100 + i, 20 + i);
    d.push_back(DigestOf(b));
    ASSERT_THAT(dir->Write(d[i], b), IsOk());
  }
  // Used 2, 0, 3, 1, a nanosecond apart, in the past: the written order
  // (and the clock) no longer count.
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  int64_t n = 0;
  for (int i : {2, 0, 3, 1}) ASSERT_THAT(dir->Touch(d[i], t0 + absl::Nanoseconds(n++)), IsOk());
  auto report = dir->Scan();
  ASSERT_THAT(report, IsOk());
  std::vector<Digest> order;
  for (const auto& blob : report->blobs) order.push_back(blob.digest);
  EXPECT_THAT(order, ElementsAre(d[2], d[0], d[3], d[1]));
  EXPECT_EQ(report->blobs[3].used, t0 + absl::Nanoseconds(3));
  // A blob not on disk is fine; a malformed digest is not.
  ASSERT_THAT(dir->Remove(d[0]), IsOk());
  EXPECT_THAT(dir->Touch(d[0], t0), IsOk());
  EXPECT_THAT(Names(dir_).count(StoreDir::FileName(d[0])), 0u);
  EXPECT_THAT(dir->Touch(Digest{"../x", 3}, t0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(StoreDirTest, ReadingAFileThatIsGoneIsNotFound) {
  auto dir = OpenDir();
  ASSERT_NE(dir, nullptr);
  EXPECT_THAT(dir->Read(Digest{kAbcSha256, 3}), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(dir->FilePath(Digest{kAbcSha256, 3}),
            (dir_ / absl::StrCat("sha256-", kAbcSha256, "-3")).string());
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
