#include "client/cli/tensor_ref.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/testing/status_matchers.h"

namespace tensorcheck::cli {
namespace {

using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// docs/api.md, "Worked example": bf16 [[1.0, -2.0], [0.5, 3.0]], checked
// there with sha256sum.
constexpr char kWorkedHex[] = "f3ae939bfe8dd5d00cb5acc191fd33b1a8c456d6af1341923d47b08db0719406";

std::string Arg(const std::string& rest) { return std::string("sha256:") + kWorkedHex + rest; }

TEST(Sha256Test, WorkedExampleOfTheApiDocHashesToItsDigest) {
  const std::string blob("\x80\x3f\x00\xc0\x00\x3f\x40\x40", 8);
  EXPECT_EQ(DigestOf(blob).hash, kWorkedHex);
}

TEST(Sha256Test, EmptyBlobIsTheWellKnownDigest) {
  EXPECT_EQ(DigestOf("").hash, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256Test, PiecesHashLikeTheWhole) {
  // FIPS 180-2's "abc" example, fed in two pieces.
  Sha256 h;
  h.Update("a");
  h.Update("");
  h.Update("bc");
  EXPECT_EQ(h.HexDigest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TensorRefTest, DigestArgumentsAreRecognisedByTheirPrefix) {
  EXPECT_TRUE(IsDigestArg(Arg(":bf16:2x2")));
  EXPECT_TRUE(IsDigestArg("sha256:"));
  EXPECT_FALSE(IsDigestArg("w.npy"));
  EXPECT_FALSE(IsDigestArg("sha256.npy"));
  EXPECT_FALSE(IsDigestArg("m.safetensors:sha256:x"));
}

TEST(TensorRefTest, WorkedExampleParsesToHashDtypeShapeAndSize) {
  auto r = ParseTensorRef(Arg(":bf16:2x2"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->hash_hex, kWorkedHex);
  EXPECT_EQ(r->dtype, DType::kBFloat16);
  EXPECT_THAT(r->shape, ElementsAre(2, 2));
  EXPECT_EQ(r->size_bytes(), 8);
  EXPECT_EQ(r->digest(), Arg(""));
}

TEST(TensorRefTest, FormatIsWhatParseReads) {
  TensorRef r{kWorkedHex, DType::kBFloat16, {3072, 4096}};
  EXPECT_EQ(FormatTensorRef(r), Arg(":bf16:3072x4096"));
  auto back = ParseTensorRef(FormatTensorRef(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hash_hex, r.hash_hex);
  EXPECT_EQ(back->dtype, r.dtype);
  EXPECT_EQ(back->shape, r.shape);
  EXPECT_EQ(back->size_bytes(), int64_t{3072} * 4096 * 2);
}

TEST(TensorRefTest, DtypeTakesEverySpellingAndPrintsTheShortName) {
  auto r = ParseTensorRef(Arg(":float32:4x8x16"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->dtype, DType::kFloat32);
  EXPECT_EQ(r->size_bytes(), 4 * 8 * 16 * 4);
  EXPECT_EQ(FormatTensorRef(*r), Arg(":fp32:4x8x16"));
  auto h = ParseTensorRef(Arg(":f8:5"));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->dtype, DType::kFloat64);
}

TEST(TensorRefTest, Fp8DtypesParseUnderEveryNameAndPrintTheShortName) {
  struct Case {
    const char* name;
    DType want;
    const char* printed;
  };
  for (const Case& c : {Case{"fp8e4m3", DType::kFloat8E4M3Fn, "fp8e4m3"},
                        Case{"float8_e4m3fn", DType::kFloat8E4M3Fn, "fp8e4m3"},
                        Case{"F8_E4M3", DType::kFloat8E4M3Fn, "fp8e4m3"},
                        Case{"e4m3", DType::kFloat8E4M3Fn, "fp8e4m3"},
                        Case{"fp8e5m2", DType::kFloat8E5M2, "fp8e5m2"},
                        Case{"float8_e5m2", DType::kFloat8E5M2, "fp8e5m2"},
                        Case{"F8_E5M2", DType::kFloat8E5M2, "fp8e5m2"}}) {
    SCOPED_TRACE(c.name);
    auto r = ParseTensorRef(Arg(std::string(":") + c.name + ":16x32"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->dtype, c.want);
    EXPECT_EQ(r->size_bytes(), 16 * 32);  // one byte each
    EXPECT_EQ(FormatTensorRef(*r), Arg(std::string(":") + c.printed + ":16x32"));
  }
}

TEST(TensorRefTest, EmptyShapeIsRankZeroAndZeroDimensionsAreEmpty) {
  auto scalar = ParseTensorRef(Arg(":fp32:"));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->size_bytes(), 4);
  EXPECT_EQ(FormatTensorRef(*scalar), Arg(":fp32:"));
  auto empty = ParseTensorRef(Arg(":fp16:0x7"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->size_bytes(), 0);
}

TEST(TensorRefTest, DigestAloneIsInvalidAndSaysDtypeAndShapeAreMissing) {
  EXPECT_THAT(ParseTensorRef(Arg("")),
              StatusIs(kInvalid, AllOf(HasSubstr("dtype and shape are missing"),
                                       HasSubstr("sha256:<64 lowercase hex digits>:<dtype>"))));
  EXPECT_THAT(ParseTensorRef(Arg(":bf16")), StatusIs(kInvalid, HasSubstr("shape is missing")));
  EXPECT_THAT(ParseTensorRef(Arg(":bf16:2x2:extra")),
              StatusIs(kInvalid, HasSubstr("more than four")));
}

TEST(TensorRefTest, MalformedHashIsInvalidArgument) {
  EXPECT_THAT(ParseTensorRef("sha256:abc:bf16:2"),
              StatusIs(kInvalid, HasSubstr("3 digits, not 64")));
  std::string upper = Arg(":bf16:2x2");
  upper[7] = 'F';
  EXPECT_THAT(ParseTensorRef(upper), StatusIs(kInvalid, HasSubstr("not lowercase hex")));
  std::string g = Arg(":bf16:2x2");
  g[10] = 'g';
  EXPECT_THAT(ParseTensorRef(g), StatusIs(kInvalid, HasSubstr("not lowercase hex")));
  EXPECT_THAT(ParseTensorRef("w.npy"), StatusIs(kInvalid, HasSubstr("no sha256: prefix")));
}

TEST(TensorRefTest, UnknownDtypeIsInvalidArgumentNamingIt) {
  EXPECT_THAT(ParseTensorRef(Arg(":int8:2x2")),
              StatusIs(kInvalid, AllOf(HasSubstr("dtype"), HasSubstr("int8"))));
}

TEST(TensorRefTest, BadDimensionsAreInvalidArgumentNamingThem) {
  for (const char* shape : {"2x", "x2", "2x-1", "2x+3", "axb", "2X2", "2x 2", "1e3"}) {
    EXPECT_THAT(ParseTensorRef(Arg(std::string(":bf16:") + shape)),
                StatusIs(kInvalid, HasSubstr("shape: dimension")))
        << shape;
  }
  EXPECT_THAT(ParseTensorRef(Arg(":fp64:4294967296x4294967296")),
              StatusIs(kInvalid, HasSubstr("too many elements")));
}

TEST(TensorRefTest, LongArgumentsAreShortenedInMessages) {
  const std::string arg = Arg(":bf16:" + std::string(500, 'z'));
  auto r = ParseTensorRef(arg);
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 400u);
  EXPECT_THAT(r.status().message(), HasSubstr("..."));
}

}  // namespace
}  // namespace tensorcheck::cli
