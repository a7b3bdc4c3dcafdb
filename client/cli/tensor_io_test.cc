#include "client/cli/tensor_io.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cli {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

// ---- byte builders, written out by hand (not with the code under test).

std::string Le(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A .npy file: magic, version, header length, `header` verbatim, `data`.
std::string Npy(int major, const std::string& header, const std::string& data) {
  std::string s("\x93NUMPY", 6);
  s.push_back(static_cast<char>(major));
  s.push_back('\0');
  s += Le(header.size(), major == 1 ? 2 : 4);
  return s + header + data;
}

std::string Dict(const std::string& descr, const std::string& shape,
                 const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape +
         ", }    \n";
}

template <typename T>
std::string Raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A safetensors file: 8-byte LE header length, JSON, data.
std::string St(const std::string& json, const std::string& data) {
  return Le(json.size(), 8) + json + data;
}

// fp16 and bf16 bit patterns of a few exact values, by hand:
// 1.0 = 0x3c00 (fp16) / 0x3f80 (bf16); -2.5 = 0xc100 / 0xc020;
// 0.5 = 0x3800 / 0x3f00.
const std::vector<uint16_t> kF16Bits = {0x3c00, 0xc100, 0x3800};
const std::vector<uint16_t> kBf16Bits = {0x3f80, 0xc020, 0x3f00};
// The same values in FP8, sign.exponent.mantissa: e4m3fn (bias 7) 1.0 =
// 0.0111.000, -2.5 = 1.25 * 2^1 = 1.1000.010, 0.5 = 0.0110.000; e5m2 (bias
// 15) 1.0 = 0.01111.00, -2.5 = 1.10000.01, 0.5 = 0.01110.00.
const std::vector<uint8_t> kE4m3Bits = {0x38, 0xc2, 0x30};
const std::vector<uint8_t> kE5m2Bits = {0x3c, 0xc1, 0x38};
const std::vector<double> kValues = {1.0, -2.5, 0.5};

TensorReadOptions Expect(DType d) {
  TensorReadOptions o;
  o.expected_dtype = d;
  return o;
}

TensorReadOptions ExpectBf16() { return Expect(DType::kBFloat16); }

// ---- .npy round trips

class NpyVersionTest : public ::testing::TestWithParam<int> {};

TEST_P(NpyVersionTest, EveryDTypeReadsBackItsValues) {
  const int v = GetParam();
  struct Case {
    std::string descr;
    std::string data;
    DType dtype;
    TensorReadOptions options;
  };
  const std::vector<Case> cases = {
      {"<f8", Raw(kValues), DType::kFloat64, {}},
      {"<f4", Raw(std::vector<float>{1.0f, -2.5f, 0.5f}), DType::kFloat32, {}},
      {"<f2", Raw(kF16Bits), DType::kFloat16, {}},
      {"<u2", Raw(kBf16Bits), DType::kBFloat16, ExpectBf16()},
      {"|u1", Raw(kE4m3Bits), DType::kFloat8E4M3Fn, Expect(DType::kFloat8E4M3Fn)},
      {"<u1", Raw(kE4m3Bits), DType::kFloat8E4M3Fn, Expect(DType::kFloat8E4M3Fn)},
      {"|u1", Raw(kE5m2Bits), DType::kFloat8E5M2, Expect(DType::kFloat8E5M2)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.descr);
    auto t = ParseNpy(Npy(v, Dict(c.descr, "(1, 3)"), c.data), "x.npy", c.options);
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ(t->dtype(), c.dtype);
    EXPECT_THAT(t->shape(), ElementsAre(1, 3));
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t->GetDouble(i), kValues[static_cast<size_t>(i)]);
  }
}

INSTANTIATE_TEST_SUITE_P(Versions, NpyVersionTest, ::testing::Values(1, 2, 3));

TEST(TensorIo, NpyScalarAndOneDimAndEmptyShapesRead) {
  auto scalar = ParseNpy(Npy(1, Dict("<f8", "()"), Raw(std::vector<double>{7.0})), "s.npy");
  ASSERT_THAT(scalar, IsOk());
  EXPECT_TRUE(scalar->shape().empty());
  EXPECT_EQ(scalar->GetDouble(0), 7.0);
  auto one = ParseNpy(Npy(1, Dict("<f8", "(3,)"), Raw(kValues)), "v.npy");
  ASSERT_THAT(one, IsOk());
  EXPECT_THAT(one->shape(), ElementsAre(3));
  auto empty = ParseNpy(Npy(1, Dict("<f4", "(0, 5)"), ""), "e.npy");
  ASSERT_THAT(empty, IsOk());
  EXPECT_EQ(empty->numel(), 0);
}

TEST(TensorIo, NpyHeaderKeysInAnyOrderWithDoubleQuotesRead) {
  const std::string h = "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<f8\"}\n";
  auto t = ParseNpy(Npy(1, h, Raw(kValues)), "x.npy");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->GetDouble(1), -2.5);
}

TEST(TensorIo, NpyWriterRoundTripsEveryDType) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(DTypeName(d));
    // FP4's .npy holds whole bytes of each row: an even last dimension.
    const std::vector<int64_t> shape =
        d == DType::kFloat4E2M1Fn ? std::vector<int64_t>{3, 2} : std::vector<int64_t>{2, 3};
    auto src = FromDoubles(d, shape, {1.0, -2.5, 0.5, 3.0, -0.0, 65504.0 / 4});
    ASSERT_THAT(src, IsOk());
    // bf16 and FP8 as raw bits, read back with --dtype's option.
    const bool bits = d == DType::kBFloat16 || IsNarrow(d);
    auto back = ParseNpy(EncodeNpy(*src, Bf16NpyEncoding::kUint16Bits), "w.npy",
                         bits ? Expect(d) : TensorReadOptions{});
    ASSERT_THAT(back, IsOk());
    EXPECT_EQ(back->dtype(), d);
    EXPECT_EQ(back->shape(), shape);
    EXPECT_EQ(back->bytes(), src->bytes());
  }
}

TEST(TensorIo, NpyWriterWidensBf16ToFloat32ByDefault) {
  auto src = FromDoubles(DType::kBFloat16, {3}, kValues);
  ASSERT_THAT(src, IsOk());
  const std::string bytes = EncodeNpy(*src);
  EXPECT_EQ(
      (10 + (static_cast<unsigned char>(bytes[8]) | static_cast<unsigned char>(bytes[9]) << 8)) %
          64,
      0u);
  EXPECT_THAT(bytes, HasSubstr("'descr': '<f4'"));
  EXPECT_THAT(bytes, HasSubstr("'shape': (3,)"));
  auto back = ParseNpy(bytes, "w.npy");
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->dtype(), DType::kFloat32);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(back->GetDouble(i), kValues[static_cast<size_t>(i)]);
}

TEST(TensorIo, NpyFp8BitPatternsReadAsTheFormatDTypeNamesWithTheirBytes) {
  // e4m3fn: 1.5 = 0.0111.100, 448 (its largest) = 0.1111.110, -1.5, 0, and
  // the smallest subnormal 2^-9 = 0.0000.001.
  const std::string e4m3 = Raw(std::vector<uint8_t>{0x3c, 0x7e, 0xbc, 0x00, 0x01, 0x3c});
  auto x = ParseNpy(Npy(1, Dict("|u1", "(2, 3)"), e4m3), "x.npy", Expect(DType::kFloat8E4M3Fn));
  ASSERT_THAT(x, IsOk());
  EXPECT_EQ(x->dtype(), DType::kFloat8E4M3Fn);
  EXPECT_THAT(x->shape(), ElementsAre(2, 3));
  EXPECT_EQ(x->bytes(), e4m3);
  EXPECT_EQ(x->GetDouble(0), 1.5);
  EXPECT_EQ(x->GetDouble(1), 448.0);
  EXPECT_EQ(x->GetDouble(2), -1.5);
  EXPECT_EQ(x->GetDouble(4), 1.0 / 512);
  // The same bytes under e5m2 are other values: 1.5 = 0.01111.10, 57344
  // (its largest) = 0.11110.11.
  const std::string e5m2 = Raw(std::vector<uint8_t>{0x3e, 0x7b});
  auto w = ParseNpy(Npy(1, Dict("<u1", "(2,)"), e5m2), "w.npy", Expect(DType::kFloat8E5M2));
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ(w->dtype(), DType::kFloat8E5M2);
  EXPECT_EQ(w->bytes(), e5m2);
  EXPECT_EQ(w->GetDouble(0), 1.5);
  EXPECT_EQ(w->GetDouble(1), 57344.0);
}

TEST(TensorIo, NpyWriterWritesFp8AsUint8BitsWhateverTheBf16Encoding) {
  const std::string bits = Raw(std::vector<uint8_t>{0x3c, 0x7e, 0xbc, 0x00});
  for (DType d : kFp8DTypes) {
    auto src = Tensor::FromBytes(d, {2, 2}, bits);
    ASSERT_THAT(src, IsOk());
    for (Bf16NpyEncoding e : {Bf16NpyEncoding::kFloat32, Bf16NpyEncoding::kUint16Bits}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(d), " ", static_cast<int>(e)));
      const std::string npy = EncodeNpy(*src, e);
      EXPECT_THAT(npy, HasSubstr("'descr': '|u1'"));
      EXPECT_THAT(npy, HasSubstr("'shape': (2, 2)"));
      ASSERT_GE(npy.size(), bits.size());
      EXPECT_EQ(npy.substr(npy.size() - bits.size()), bits);
      auto back = ParseNpy(npy, "w.npy", Expect(d));
      ASSERT_THAT(back, IsOk());
      EXPECT_EQ(back->dtype(), d);
      EXPECT_EQ(back->bytes(), bits);
    }
  }
}

// FP4 E2M1 codes by hand (sign, 2 exponent bits of bias 1, 1 mantissa
// bit): 1.0 = 0.01.0 (0x2), 0.5 = 0.00.1 (0x1), 6 = 0.11.1 (0x7), -1 =
// 1.01.0 (0xa). Packed two per byte, element 2i in the low nibble:
// [1.0, 0.5] -> 0x12, [6, -1] -> 0xa7.
const std::string kFp4Packed = "\x12\xa7";
const std::vector<double> kFp4Values = {1.0, 0.5, 6.0, -1.0};

TEST(TensorIo, NpyFp4IsPackedBytesWhoseLastDimIsHalfTheTensors) {
  auto x =
      ParseNpy(Npy(1, Dict("|u1", "(1, 2)"), kFp4Packed), "x.npy", Expect(DType::kFloat4E2M1Fn));
  ASSERT_THAT(x, IsOk());
  EXPECT_EQ(x->dtype(), DType::kFloat4E2M1Fn);
  EXPECT_THAT(x->shape(), ElementsAre(1, 4));
  EXPECT_EQ(x->bytes(), kFp4Packed);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(x->GetDouble(i), kFp4Values[static_cast<size_t>(i)]);
  // What the writer makes of it reads back the same.
  const std::string npy = EncodeNpy(*x);
  EXPECT_THAT(npy, HasSubstr("'shape': (1, 2)"));
  auto back = ParseNpy(npy, "x.npy", Expect(DType::kFloat4E2M1Fn));
  ASSERT_THAT(back, IsOk());
  EXPECT_THAT(back->shape(), ElementsAre(1, 4));
  EXPECT_EQ(back->bytes(), kFp4Packed);
  // A 0-d file holds no pair.
  EXPECT_THAT(ParseNpy(Npy(1, Dict("|u1", "()"), "\x12"), "x.npy", Expect(DType::kFloat4E2M1Fn)),
              StatusIs(kInvalid, HasSubstr("at least one dimension")));
  // A float file where FP4 is expected says what FP4 files hold.
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f4", "(1,)"), Raw(std::vector<float>{1.0f})), "x.npy",
                       Expect(DType::kFloat4E2M1Fn)),
              StatusIs(kInvalid, HasSubstr("float4_e2m1fn .npy files hold '|u1' bytes")));
}

TEST(TensorIo, NpyE8m0BitPatternsReadAsPowersOfTwo) {
  // UE8M0: 2^(bits - 127): 127 -> 1, 130 -> 8, 120 -> 2^-7.
  const std::string bits = Raw(std::vector<uint8_t>{127, 130, 120});
  auto s = ParseNpy(Npy(1, Dict("|u1", "(3, 1)"), bits), "s.npy", Expect(DType::kFloat8E8M0Fnu));
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->dtype(), DType::kFloat8E8M0Fnu);
  EXPECT_THAT(s->shape(), ElementsAre(3, 1));
  EXPECT_EQ(s->bytes(), bits);
  EXPECT_EQ(s->GetDouble(0), 1.0);
  EXPECT_EQ(s->GetDouble(1), 8.0);
  EXPECT_EQ(s->GetDouble(2), 1.0 / 128);
}

TEST(TensorIo, NpyUint8WithoutADTypeNamesTheFp4AndE8m0FlagsToo) {
  EXPECT_THAT(
      ParseNpy(Npy(1, Dict("|u1", "(2,)"), kFp4Packed), "q.npy"),
      StatusIs(kInvalid, AllOf(HasSubstr("--dtype NAME=fp4e2m1"), HasSubstr("--dtype NAME=e8m0"))));
}

TEST(TensorIo, SafetensorsF4CountsElementsTwoToAByte) {
  const std::string json = R"({"w": {"dtype": "F4", "shape": [2, 2], "data_offsets": [0, 2]}})";
  auto w = ParseSafetensors(St(json, kFp4Packed), "w", "m.safetensors");
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ(w->dtype(), DType::kFloat4E2M1Fn);
  EXPECT_THAT(w->shape(), ElementsAre(2, 2));
  EXPECT_EQ(w->bytes(), kFp4Packed);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(w->GetDouble(i), kFp4Values[static_cast<size_t>(i)]);
  // One byte per element is not F4's size; nor is an odd count.
  EXPECT_THAT(ParseSafetensors(St(R"({"w": {"dtype": "F4", "shape": [4], "data_offsets": [0, 4]}})",
                                  kFp4Packed + kFp4Packed),
                               "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("2 bytes expected for shape [4] of F4")));
  EXPECT_THAT(ParseSafetensors(
                  St(R"({"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", kFp4Packed),
                  "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("an even count expected")));
  // safetensors' F32 is float32 whatever numpy's "f4" means.
  EXPECT_THAT(
      ParseSafetensors(St(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                          Raw(std::vector<float>{1.0f})),
                       "w", "m.safetensors", Expect(DType::kFloat4E2M1Fn)),
      StatusIs(kInvalid, HasSubstr("float4_e2m1fn expected")));
}

TEST(TensorIo, SafetensorsF8E8m0IsFloat8E8m0fnu) {
  const std::string bits = Raw(std::vector<uint8_t>{127, 128});
  for (const char* name : {"F8_E8M0", "E8M0"}) {
    SCOPED_TRACE(name);
    const std::string json =
        absl::StrCat(R"({"s": {"dtype": ")", name, R"(", "shape": [2], "data_offsets": [0, 2]}})");
    auto s = ParseSafetensors(St(json, bits), "s", "m.safetensors");
    ASSERT_THAT(s, IsOk());
    EXPECT_EQ(s->dtype(), DType::kFloat8E8M0Fnu);
    EXPECT_EQ(s->GetDouble(0), 1.0);
    EXPECT_EQ(s->GetDouble(1), 2.0);
  }
}

// ---- hostile .npy files

TEST(TensorIo, NpyBadMagicIsRejected) {
  std::string b = Npy(1, Dict("<f8", "(3,)"), Raw(kValues));
  b[1] = 'X';
  EXPECT_THAT(ParseNpy(b, "bad.npy"),
              StatusIs(kInvalid, AllOf(HasSubstr("bad.npy"), HasSubstr("magic"))));
  EXPECT_THAT(ParseNpy("", "empty.npy"), StatusIs(kInvalid, HasSubstr("magic")));
}

TEST(TensorIo, NpyUnknownVersionIsRejected) {
  std::string b = Npy(1, Dict("<f8", "(3,)"), Raw(kValues));
  b[6] = 4;
  EXPECT_THAT(ParseNpy(b, "x.npy"), StatusIs(kInvalid, HasSubstr("found 4.0")));
  b[6] = 1;
  b[7] = 1;
  EXPECT_THAT(ParseNpy(b, "x.npy"), StatusIs(kInvalid, HasSubstr("found 1.1")));
}

TEST(TensorIo, NpyTruncatedPreambleIsRejected) {
  EXPECT_THAT(ParseNpy(std::string("\x93NUMPY\x01\x00", 8), "x.npy"),
              StatusIs(kInvalid, HasSubstr("truncated")));
  EXPECT_THAT(ParseNpy(std::string("\x93NUMPY\x02\x00\x10\x00", 10), "x.npy"),
              StatusIs(kInvalid, HasSubstr("truncated")));
}

TEST(TensorIo, NpyHeaderLengthPastEndOfFileIsRejected) {
  std::string b("\x93NUMPY\x01\x00", 8);
  b += Le(0xffff, 2);
  b += "{'descr': '<f8'";
  EXPECT_THAT(ParseNpy(b, "x.npy"), StatusIs(kInvalid, HasSubstr("runs past the end")));
  std::string v2("\x93NUMPY\x02\x00", 8);
  v2 += Le(0xfffffff0u, 4);
  v2 += "{}";
  EXPECT_THAT(ParseNpy(v2, "x.npy"), StatusIs(kInvalid, HasSubstr("runs past the end")));
}

TEST(TensorIo, NpyNonDictHeaderIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, "['<f8', False, (3,)]\n", Raw(kValues)), "x.npy"),
              StatusIs(kInvalid, HasSubstr("dict")));
  EXPECT_THAT(
      ParseNpy(Npy(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,)\n", Raw(kValues)),
               "x.npy"),
      StatusIs(kInvalid, HasSubstr("unparseable")));
  EXPECT_THAT(ParseNpy(Npy(1, "{'descr': '<f8', 'shape': (3,)}\n", Raw(kValues)), "x.npy"),
              StatusIs(kInvalid, HasSubstr("'fortran_order'")));
  EXPECT_THAT(ParseNpy(Npy(1,
                           "{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, "
                           "'shape': (3,)}\n",
                           Raw(kValues)),
                       "x.npy"),
              StatusIs(kInvalid, HasSubstr("twice")));
  EXPECT_THAT(ParseNpy(Npy(1,
                           "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), "
                           "'extra': 1}\n",
                           Raw(kValues)),
                       "x.npy"),
              StatusIs(kInvalid, HasSubstr("'extra'")));
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(3,)") + "junk", Raw(kValues)), "x.npy"),
              StatusIs(kInvalid, HasSubstr("padding")));
}

TEST(TensorIo, NpyBigEndianIsRejected) {
  EXPECT_THAT(
      ParseNpy(Npy(1, Dict(">f4", "(3,)"), std::string(12, '\0')), "be.npy"),
      StatusIs(kInvalid, AllOf(HasSubstr("be.npy"), HasSubstr("big-endian"), HasSubstr("'>f4'"))));
}

TEST(TensorIo, NpyObjectDTypeIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("|O", "(3,)"), std::string(24, '\0')), "o.npy"),
              StatusIs(kInvalid, HasSubstr("object")));
}

TEST(TensorIo, NpyUnsupportedDTypeIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<i4", "(3,)"), std::string(12, '\0')), "i.npy"),
              StatusIs(kInvalid, AllOf(HasSubstr("unsupported dtype"), HasSubstr("'<i4'"))));
  EXPECT_THAT(ParseNpy(Npy(1, Dict("|u1", "(3,)"), std::string(3, '\0')), "u.npy"),
              StatusIs(kInvalid, HasSubstr("'|u1'")));
  EXPECT_THAT(ParseNpy(Npy(1,
                           "{'descr': [('a', '<f4')], 'fortran_order': False, "
                           "'shape': (3,)}\n",
                           std::string(12, '\0')),
                       "s.npy"),
              StatusIs(kInvalid, HasSubstr("structured")));
}

TEST(TensorIo, NpyUint16WithoutBf16OptionIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<u2", "(3,)"), Raw(kBf16Bits)), "b.npy"),
              StatusIs(kInvalid, HasSubstr("--dtype NAME=bf16")));
}

TEST(TensorIo, NpyUint8WithoutFp8DTypeIsRejectedNamingTheFlag) {
  for (const char* descr : {"|u1", "<u1"}) {
    EXPECT_THAT(ParseNpy(Npy(1, Dict(descr, "(3,)"), Raw(kE4m3Bits)), "q.npy"),
                StatusIs(kInvalid, AllOf(HasSubstr("q.npy"), HasSubstr("FP8 bit patterns"),
                                         HasSubstr("--dtype NAME=fp8e4m3"),
                                         HasSubstr("--dtype NAME=fp8e5m2"))))
        << descr;
  }
}

TEST(TensorIo, NpyFloatWhereFp8ExpectedSaysFp8FilesHoldUint8Bits) {
  EXPECT_THAT(
      ParseNpy(Npy(1, Dict("<f4", "(3,)"), std::string(12, '\0')), "q.npy",
               Expect(DType::kFloat8E4M3Fn)),
      StatusIs(kInvalid, AllOf(HasSubstr("float8_e4m3fn expected (--dtype)"),
                               HasSubstr("'<f4' (float32)"), HasSubstr("'|u1' bit patterns"))));
}

TEST(TensorIo, NpyBitPatternsOfAnotherFormatThanExpectedAreRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("|u1", "(3,)"), Raw(kE4m3Bits)), "q.npy", ExpectBf16()),
              StatusIs(kInvalid, AllOf(HasSubstr("bfloat16 expected"),
                                       HasSubstr("'|u1' (uint8, FP8 bit patterns)"))));
  EXPECT_THAT(
      ParseNpy(Npy(1, Dict("<u2", "(3,)"), Raw(kBf16Bits)), "b.npy", Expect(DType::kFloat8E5M2)),
      StatusIs(kInvalid, AllOf(HasSubstr("float8_e5m2 expected"),
                               HasSubstr("'<u2' (uint16, bfloat16 bit patterns)"))));
}

TEST(TensorIo, ExpectedDTypeMessageSaysWhoExpectsIt) {
  TensorReadOptions o = Expect(DType::kFloat32);
  o.expected_by = "scales are float32";
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<u2", "(3,)"), Raw(kBf16Bits)), "s.npy", o),
              StatusIs(kInvalid, HasSubstr("float32 expected (scales are float32), found '<u2'")));
  const std::string json = R"({"s": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}})";
  EXPECT_THAT(ParseSafetensors(St(json, Raw(kBf16Bits)), "s", "m.safetensors", o),
              StatusIs(kInvalid, HasSubstr("float32 expected (scales are float32), found BF16")));
}

TEST(TensorIo, NpyDTypeOtherThanExpectedIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f4", "(3,)"), std::string(12, '\0')), "b.npy", ExpectBf16()),
              StatusIs(kInvalid, AllOf(HasSubstr("bfloat16 expected"), HasSubstr("'<f4'"))));
}

TEST(TensorIo, NpyFortranOrderIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(1, 3)", "True"), Raw(kValues)), "f.npy"),
              StatusIs(kInvalid, HasSubstr("fortran_order")));
}

TEST(TensorIo, NpyNegativeDimensionIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(-1, 3)"), Raw(kValues)), "n.npy"),
              StatusIs(kInvalid, HasSubstr("non-negative")));
}

TEST(TensorIo, NpyOverflowingShapeIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(99999999999999999999999,)"), ""), "o.npy"),
              StatusIs(kInvalid, HasSubstr("int64")));
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(4294967296, 4294967296)"), ""), "o.npy"),
              StatusIs(kInvalid, HasSubstr("overflows")));
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(1, 1, 1, 1, 1, 1, 1, 1, 1)"), Raw(kValues)), "r.npy"),
              StatusIs(kInvalid, HasSubstr("rank")));
}

TEST(TensorIo, NpyHugeShapeOverSmallFileFailsWithoutAllocating) {
  // 2^40 doubles would be 8 TiB: the size check comes first.
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(1099511627776,)"), Raw(kValues)), "h.npy"),
              StatusIs(kInvalid, HasSubstr("truncated")));
}

TEST(TensorIo, NpyShortDataIsRejected) {
  EXPECT_THAT(
      ParseNpy(Npy(1, Dict("<f8", "(4,)"), Raw(kValues)), "s.npy"),
      StatusIs(kInvalid, AllOf(HasSubstr("32 bytes of data expected"), HasSubstr("found 24"))));
}

TEST(TensorIo, NpyTrailingDataIsRejected) {
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(2,)"), Raw(kValues)), "l.npy"),
              StatusIs(kInvalid, HasSubstr("trailing bytes")));
}

TEST(TensorIo, NpyOverSizeLimitIsRejected) {
  TensorReadOptions o;
  o.max_file_bytes = 16;
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<f8", "(3,)"), Raw(kValues)), "big.npy", o),
              StatusIs(kInvalid, HasSubstr("at most 16 bytes")));
}

// ---- safetensors

const std::string kTwoTensors =
    R"({"__metadata__": {"format": "pt"},)"
    R"( "w": {"dtype": "F32", "shape": [1, 3], "data_offsets": [0, 12]},)"
    R"( "b": {"dtype": "F16", "shape": [3], "data_offsets": [12, 18]}})";

std::string TwoTensorData() { return Raw(std::vector<float>{1.0f, -2.5f, 0.5f}) + Raw(kF16Bits); }

TEST(TensorIo, SafetensorsEveryDTypeReadsBackItsValues) {
  struct Case {
    std::string dtype;
    std::string data;
    DType want;
  };
  const std::vector<Case> cases = {
      {"F64", Raw(kValues), DType::kFloat64},
      {"F32", Raw(std::vector<float>{1.0f, -2.5f, 0.5f}), DType::kFloat32},
      {"F16", Raw(kF16Bits), DType::kFloat16},
      {"BF16", Raw(kBf16Bits), DType::kBFloat16},
      {"F8_E4M3", Raw(kE4m3Bits), DType::kFloat8E4M3Fn},
      {"F8_E5M2", Raw(kE5m2Bits), DType::kFloat8E5M2},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dtype);
    const std::string json =
        absl::StrCat(R"({"t": {"dtype": ")", c.dtype, R"(", "shape": [3, 1], "data_offsets": [0, )",
                     c.data.size(), "]}}");
    auto t = ParseSafetensors(St(json, c.data), "t", "m.safetensors");
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ(t->dtype(), c.want);
    EXPECT_THAT(t->shape(), ElementsAre(3, 1));
    EXPECT_EQ(t->bytes(), c.data);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(t->GetDouble(i), kValues[static_cast<size_t>(i)]);
  }
}

TEST(TensorIo, SafetensorsFp8OfTheOtherFormatThanExpectedIsRejected) {
  const std::string json = R"({"w": {"dtype": "F8_E5M2", "shape": [3], "data_offsets": [0, 3]}})";
  EXPECT_THAT(ParseSafetensors(St(json, Raw(kE5m2Bits)), "w", "m.safetensors",
                               Expect(DType::kFloat8E4M3Fn)),
              StatusIs(kInvalid,
                       AllOf(HasSubstr("float8_e4m3fn expected (--dtype)"), HasSubstr("F8_E5M2"))));
  auto ok =
      ParseSafetensors(St(json, Raw(kE5m2Bits)), "w", "m.safetensors", Expect(DType::kFloat8E5M2));
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->dtype(), DType::kFloat8E5M2);
}

TEST(TensorIo, SafetensorsSecondTensorReadsAtItsOffset) {
  auto b = ParseSafetensors(St(kTwoTensors, TwoTensorData()), "b", "m.safetensors");
  ASSERT_THAT(b, IsOk());
  EXPECT_EQ(b->dtype(), DType::kFloat16);
  EXPECT_EQ(b->GetDouble(1), -2.5);
}

TEST(TensorIo, SafetensorsHeaderLengthPastEndIsRejected) {
  std::string b = Le(1000, 8) + "{}";
  EXPECT_THAT(ParseSafetensors(b, "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("runs past the end")));
  EXPECT_THAT(ParseSafetensors("abc", "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("truncated")));
}

TEST(TensorIo, SafetensorsAbsurdHeaderLengthIsRejected) {
  EXPECT_THAT(ParseSafetensors(Le(0xffffffffffffffffull, 8) + "{}", "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("at most 100000000")));
}

TEST(TensorIo, SafetensorsInvalidJsonIsRejected) {
  EXPECT_THAT(ParseSafetensors(St("{\"w\": ", ""), "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("not valid JSON")));
  EXPECT_THAT(ParseSafetensors(St(std::string(5000, '[') + std::string(5000, ']'), ""), "w",
                               "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("nested")));
}

TEST(TensorIo, SafetensorsJsonNotAnObjectIsRejected) {
  EXPECT_THAT(ParseSafetensors(St("[1, 2]", ""), "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("object expected, found array")));
}

TEST(TensorIo, SafetensorsMissingTensorListsAvailableNames) {
  EXPECT_THAT(ParseSafetensors(St(kTwoTensors, TwoTensorData()), "x", "m.safetensors"),
              StatusIs(kInvalid, AllOf(HasSubstr("m.safetensors"), HasSubstr("'x'"),
                                       HasSubstr("available: b, w"))));
}

TEST(TensorIo, SafetensorsUnknownDTypeIsRejected) {
  const std::string json = R"({"w": {"dtype": "F7", "shape": [3], "data_offsets": [0, 3]}})";
  EXPECT_THAT(ParseSafetensors(St(json, "abc"), "w", "m.safetensors"),
              StatusIs(kInvalid, AllOf(HasSubstr("'F7'"), HasSubstr("unknown dtype"))));
  const std::string i64 = R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})";
  EXPECT_THAT(ParseSafetensors(St(i64, std::string(8, '\0')), "w", "m.safetensors"),
              StatusIs(kInvalid,
                       HasSubstr("F64, F32, F16, BF16, F8_E4M3, F8_E5M2, F4 or F8_E8M0 expected")));
}

TEST(TensorIo, SafetensorsDataOffsetsOutOfRangeAreRejected) {
  const std::string json = R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}})";
  EXPECT_THAT(ParseSafetensors(St(json, std::string(8, '\0')), "w", "m.safetensors"),
              StatusIs(kInvalid, AllOf(HasSubstr("out of range"), HasSubstr("8 bytes"))));
}

TEST(TensorIo, SafetensorsEndBeforeBeginIsRejected) {
  const std::string json = R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})";
  EXPECT_THAT(ParseSafetensors(St(json, std::string(8, '\0')), "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("end >= begin")));
}

TEST(TensorIo, SafetensorsSizeNotMatchingShapeIsRejected) {
  const std::string json = R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})";
  EXPECT_THAT(ParseSafetensors(St(json, std::string(12, '\0')), "w", "m.safetensors"),
              StatusIs(kInvalid, AllOf(HasSubstr("16 bytes expected"), HasSubstr("span 12"))));
}

TEST(TensorIo, SafetensorsOverlappingOffsetsAreRejected) {
  const std::string json = R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},)"
                           R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})";
  EXPECT_THAT(ParseSafetensors(St(json, std::string(16, '\0')), "w", "m.safetensors"),
              StatusIs(kInvalid, AllOf(HasSubstr("overlap"), HasSubstr("'w'"), HasSubstr("'b'"))));
}

TEST(TensorIo, SafetensorsNegativeOrNonIntegerShapeIsRejected) {
  const std::string neg = R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})";
  EXPECT_THAT(ParseSafetensors(St(neg, ""), "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("non-negative integer")));
  const std::string big =
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})";
  EXPECT_THAT(ParseSafetensors(St(big, ""), "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("overflows")));
  const std::string bad_off = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})";
  EXPECT_THAT(ParseSafetensors(St(bad_off, "abcd"), "w", "m.safetensors"),
              StatusIs(kInvalid, HasSubstr("data_offsets")));
}

// ---- random damage never crashes

void DamageNeverCrashes(const std::string& valid,
                        const std::function<absl::Status(const std::string&)>& parse) {
  for (size_t n = 0; n < valid.size(); ++n) {
    const absl::Status s = parse(valid.substr(0, n));
    EXPECT_FALSE(s.ok()) << "truncated to " << n << " bytes";
  }
  std::mt19937 rng(12345);
  std::uniform_int_distribution<size_t> pos(0, valid.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 3000; ++i) {
    std::string b = valid;
    const int flips = 1 + i % 4;
    for (int f = 0; f < flips; ++f) b[pos(rng)] = static_cast<char>(byte(rng));
    (void)parse(b);  // an error or a tensor; either is fine
  }
}

TEST(TensorIo, NpyRandomTruncationsAndByteFlipsNeverCrash) {
  const std::string valid = Npy(1, Dict("<f8", "(1, 3)"), Raw(kValues));
  DamageNeverCrashes(valid, [](const std::string& b) {
    auto t = ParseNpy(b, "fuzz.npy", ExpectBf16());
    if (t.ok()) {
      EXPECT_EQ(static_cast<size_t>(t->numel()) * ItemSize(t->dtype()), t->nbytes());
    }
    return t.status();
  });
}

TEST(TensorIo, SafetensorsRandomTruncationsAndByteFlipsNeverCrash) {
  const std::string valid = St(kTwoTensors, TwoTensorData());
  DamageNeverCrashes(valid, [](const std::string& b) {
    auto t = ParseSafetensors(b, "w", "fuzz.safetensors");
    return t.status();
  });
}

// ---- files and CLI arguments

class TensorFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/tensor_io_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const std::string& f : files_) std::remove(f.c_str());
    rmdir(dir_.c_str());
  }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = dir_ + "/" + name;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    files_.push_back(path);
    return path;
  }
  std::string dir_;
  std::vector<std::string> files_;
};

TEST_F(TensorFileTest, NpyArgumentReadsFromDisk) {
  const std::string p = Write("x.npy", Npy(2, Dict("<f8", "(3,)"), Raw(kValues)));
  auto t = ReadTensorArg(p);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->GetDouble(2), 0.5);
}

TEST_F(TensorFileTest, SafetensorsArgumentReadsTheNamedTensor) {
  const std::string p = Write("m.safetensors", St(kTwoTensors, TwoTensorData()));
  auto t = ReadTensorArg(p + ":w");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_EQ(t->GetDouble(1), -2.5);
}

TEST_F(TensorFileTest, SafetensorsArgumentWithoutNameListsTensors) {
  const std::string p = Write("m.safetensors", St(kTwoTensors, TwoTensorData()));
  EXPECT_THAT(ReadTensorArg(p), StatusIs(kInvalid, HasSubstr("available: b, w")));
  EXPECT_THAT(ReadTensorArg(p + ":"), StatusIs(kInvalid, HasSubstr("available: b, w")));
  EXPECT_THAT(ReadTensorArg(p + ":nope"), StatusIs(kInvalid, HasSubstr("available: b, w")));
}

TEST_F(TensorFileTest, WrittenNpyReadsBack) {
  auto src = FromDoubles(DType::kFloat16, {3}, kValues);
  ASSERT_THAT(src, IsOk());
  const std::string p = dir_ + "/out.npy";
  files_.push_back(p);
  ASSERT_THAT(WriteNpyFile(p, *src), IsOk());
  auto t = ReadTensorArg(p);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->bytes(), src->bytes());
}

// np.save of an ml_dtypes bfloat16 array, [1.5, -2] (as the file
// `np.save("y.npy", np.array([1.5, -2], dtype=ml_dtypes.bfloat16))` writes:
// descr '<V2', raw 2-byte values). bf16 bits by hand: 1.5 = 0 01111111
// 1000000 = 0x3fc0, -2 = 1 10000000 0000000 = 0xc000.
std::string MlDtypesBf16Npy() {
  const std::string header = "{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }";
  std::string padded = header + std::string(118 - header.size() - 1, ' ') + "\n";
  return std::string("\x93NUMPY\x01\x00", 8) + std::string("\x76\x00", 2) + padded +
         std::string("\xc0\x3f\x00\xc0", 4);
}

TEST_F(TensorFileTest, MlDtypesBf16NpyReadsAsBf16WithTheDTypeFlag) {
  const std::string p = Write("y.npy", MlDtypesBf16Npy());
  TensorReadOptions o;
  o.expected_dtype = DType::kBFloat16;
  auto t = ReadTensorArg(p, o);
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->dtype(), DType::kBFloat16);
  ASSERT_EQ(t->numel(), 2);
  EXPECT_EQ(t->GetDouble(0), 1.5);
  EXPECT_EQ(t->GetDouble(1), -2.0);
}

TEST_F(TensorFileTest, MlDtypesBf16NpyWithoutTheDTypeFlagSaysWhichFlagToPass) {
  const std::string p = Write("y.npy", MlDtypesBf16Npy());
  EXPECT_THAT(ReadTensorArg(p),
              StatusIs(kInvalid, p + ": dtype <V2 (raw 2-byte values, e.g. ml_dtypes bfloat16): "
                                     "pass --dtype NAME=bf16"));
  // upload takes one dtype for every tensor: its flag has no NAME=.
  TensorReadOptions upload;
  upload.dtype_flag = "--dtype ";
  EXPECT_THAT(ReadTensorArg(p, upload),
              StatusIs(kInvalid, p + ": dtype <V2 (raw 2-byte values, e.g. ml_dtypes bfloat16): "
                                     "pass --dtype bf16"));
  // Another dtype required: the mismatch says what the file holds.
  TensorReadOptions f32;
  f32.expected_dtype = DType::kFloat32;
  EXPECT_THAT(ReadTensorArg(p, f32),
              StatusIs(kInvalid, HasSubstr("found '<V2' (raw 2-byte values, e.g. ml_dtypes "
                                           "bfloat16)")));
}

TEST(TensorIo, UploadsUint16MessageNamesUploadsDTypeFlag) {
  TensorReadOptions upload;
  upload.dtype_flag = "--dtype ";
  EXPECT_THAT(ParseNpy(Npy(1, Dict("<u2", "(3,)"), Raw(kBf16Bits)), "b.npy", upload),
              StatusIs(kInvalid, AllOf(HasSubstr("say so with --dtype bf16"),
                                       ::testing::Not(HasSubstr("NAME=")))));
}

// A tensor of 2 MiB: its bytes are a pattern no two neighbouring words share.
std::string PatternBytes(size_t n) {
  std::string b(n, '\0');
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>((i * 131 + i / 251) & 0xff);
  return b;
}

TEST_F(TensorFileTest, Fp8NpyAndSafetensorsArgumentsReadFromDisk) {
  const std::string bits = Raw(std::vector<uint8_t>{0x3c, 0x7e});  // e4m3fn 1.5, 448
  const std::string npy = Write("q.npy", Npy(1, Dict("|u1", "(1, 2)"), bits));
  EXPECT_THAT(ReadTensorArg(npy), StatusIs(kInvalid, HasSubstr("--dtype NAME=fp8e4m3")));
  auto x = ReadTensorArg(npy, Expect(DType::kFloat8E4M3Fn));
  ASSERT_THAT(x, IsOk());
  EXPECT_EQ(x->dtype(), DType::kFloat8E4M3Fn);
  EXPECT_EQ(x->bytes(), bits);
  const std::string st =
      Write("q.safetensors",
            St(R"({"w": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}})", bits));
  auto w = ReadTensorArg(st + ":w");  // safetensors names its format: no --dtype
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ(w->dtype(), DType::kFloat8E4M3Fn);
  EXPECT_EQ(w->GetDouble(1), 448.0);
}

TEST_F(TensorFileTest, Fp4NpyAndSafetensorsArgumentsReadFromDisk) {
  const std::string npy = Write("q4.npy", Npy(1, Dict("|u1", "(2,)"), kFp4Packed));
  auto x = ReadTensorArg(npy, Expect(DType::kFloat4E2M1Fn));
  ASSERT_THAT(x, IsOk());
  EXPECT_THAT(x->shape(), ElementsAre(4));
  EXPECT_EQ(x->bytes(), kFp4Packed);
  const std::string st =
      Write("q4.safetensors",
            St(R"({"w": {"dtype": "F4", "shape": [1, 4], "data_offsets": [0, 2]}})", kFp4Packed));
  auto w = ReadTensorArg(st + ":w");
  ASSERT_THAT(w, IsOk());
  EXPECT_EQ(w->dtype(), DType::kFloat4E2M1Fn);
  EXPECT_THAT(w->shape(), ElementsAre(1, 4));
  EXPECT_EQ(w->GetDouble(2), 6.0);
}

TEST_F(TensorFileTest, LargeNpyIsAViewOfTheFileWithItsBytes) {
  const std::string data = PatternBytes(size_t{2} << 20);
  const std::string p =
      Write("big.npy", Npy(1, Dict("<u2", "(1024, 1024)"), data));  // 64-byte aligned data
  auto t = ReadTensorArg(p, ExpectBf16());
  ASSERT_THAT(t, IsOk());
  EXPECT_TRUE(t->borrowed());  // mapped, not copied
  EXPECT_THAT(t->shape(), ElementsAre(1024, 1024));
  EXPECT_TRUE(t->bytes() == data);
}

TEST_F(TensorFileTest, LargeSafetensorsAtAnUnalignedOffsetIsReadIntoItsOwnBuffer) {
  const std::string data = PatternBytes(size_t{2} << 20);
  // Header padded so that the data starts 2 bytes past a multiple of 4.
  const std::string json = R"({"w":{"dtype":"F32","shape":[524288],"data_offsets":[0,2097152]}})";
  std::string header = json;
  while ((8 + header.size()) % 4 != 2) header += ' ';
  const std::string p = Write("u.safetensors", St(header, data));
  auto t = ReadTensorArg(p + ":w");
  ASSERT_THAT(t, IsOk());
  EXPECT_FALSE(t->borrowed());
  EXPECT_TRUE(t->bytes() == data);
  // Aligned, the same tensor is mapped and reads the same.
  while ((8 + header.size()) % 4 != 0) header += ' ';
  const std::string q = Write("a.safetensors", St(header, data));
  auto m = ReadTensorArg(q + ":w");
  ASSERT_THAT(m, IsOk());
  EXPECT_TRUE(m->borrowed());
  EXPECT_TRUE(m->bytes() == data);
}

TEST_F(TensorFileTest, FileOverLimitIsRejectedBeforeReading) {
  const std::string p = Write("x.npy", Npy(1, Dict("<f8", "(3,)"), Raw(kValues)));
  TensorReadOptions o;
  o.max_file_bytes = 10;
  EXPECT_THAT(ReadTensorArg(p, o), StatusIs(kInvalid, HasSubstr("at most 10 bytes")));
}

TEST_F(TensorFileTest, TruncatedFileOnDiskIsRejected) {
  const std::string p = Write("t.npy", Npy(1, Dict("<f8", "(4,)"), Raw(kValues)));
  EXPECT_THAT(ReadTensorArg(p), StatusIs(kInvalid, HasSubstr("truncated")));
}

TEST_F(TensorFileTest, MissingFileIsNotFound) {
  EXPECT_THAT(ReadTensorArg(dir_ + "/none.npy"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("none.npy")));
}

TEST_F(TensorFileTest, UnknownExtensionIsRejected) {
  EXPECT_THAT(ReadTensorArg("x.pt"),
              StatusIs(kInvalid, HasSubstr("FILE.npy or FILE.safetensors:TENSOR")));
}

}  // namespace
}  // namespace tensorcheck::cli
