#include "core/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/float_formats.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// ---- CheckedNumel

TEST(CheckedNumelTest, ProductOfDims) {
  EXPECT_EQ(*CheckedNumel({2, 3, 4}, kI64Max, "x"), 24);
  EXPECT_EQ(*CheckedNumel({}, kI64Max, "x"), 1);  // a scalar
  EXPECT_EQ(*CheckedNumel({5, 0, 7}, kI64Max, "x"), 0);
}

TEST(CheckedNumelTest, ZeroDimBeforeHugeDimsIsNotAnOverflow) {
  EXPECT_EQ(*CheckedNumel({0, kI64Max, kI64Max}, kI64Max, "x"), 0);
}

TEST(CheckedNumelTest, NegativeDimIsInvalidArgumentNamingTheField) {
  EXPECT_THAT(CheckedNumel({2, -1}, kI64Max, "input"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("input.shape[1]"), HasSubstr("-1"))));
}

TEST(CheckedNumelTest, OverflowIsInvalidArgumentNamingTheField) {
  EXPECT_THAT(CheckedNumel({int64_t{1} << 32, int64_t{1} << 32}, kI64Max, "weight"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("weight.shape"), HasSubstr("overflows"))));
  EXPECT_THAT(CheckedNumel({kI64Max, 2}, kI64Max, "weight"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("weight.shape")));
}

TEST(CheckedNumelTest, RankAboveEightIsInvalidArgument) {
  EXPECT_THAT(CheckedNumel({1, 1, 1, 1, 1, 1, 1, 1}, kI64Max, "x"), IsOk());
  EXPECT_THAT(
      CheckedNumel({1, 1, 1, 1, 1, 1, 1, 1, 1}, kI64Max, "bias"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("bias.shape"), HasSubstr("rank at most 8"), HasSubstr("got 9"))));
}

TEST(CheckedNumelTest, OverTheLimitIsResourceExhausted) {
  EXPECT_THAT(CheckedNumel({10, 10}, 99, "input"),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("input.shape")));
  EXPECT_THAT(CheckedNumel({10, 10}, 100, "input"), IsOk());
}

// ---- Tensor::Create / FromBytes

TEST(TensorTest, CreateIsZeroFilledAndAligned) {
  auto t = Tensor::Create(DType::kFloat32, {3, 5});
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->numel(), 15);
  EXPECT_EQ(t->nbytes(), 60u);
  EXPECT_EQ(t->rank(), 2);
  EXPECT_EQ(t->dim(1), 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->raw()) % 64, 0u);
  for (int64_t i = 0; i < t->numel(); ++i) EXPECT_EQ(t->data<float>()[i], 0.0f);
}

TEST(TensorTest, CreateWithNegativeDimIsInvalidArgument) {
  EXPECT_THAT(Tensor::Create(DType::kFloat32, {4, -3}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape[1]")));
}

TEST(TensorTest, CreateWithOverflowingShapeIsInvalidArgument) {
  EXPECT_THAT(Tensor::Create(DType::kFloat32, {int64_t{1} << 40, int64_t{1} << 40}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("overflows")));
}

TEST(TensorTest, CreateWhoseByteSizeOverflowsIsInvalidArgument) {
  // 2^61 elements fit in int64; 2^61 * 8 bytes do not.
  EXPECT_THAT(Tensor::Create(DType::kFloat64, {int64_t{1} << 61}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("byte size"), HasSubstr("overflows"))));
}

TEST(TensorTest, CreateWithRankNineIsInvalidArgument) {
  EXPECT_THAT(Tensor::Create(DType::kFloat32, std::vector<int64_t>(9, 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rank")));
}

TEST(TensorTest, CreateTooLargeToAllocateIsResourceExhausted) {
  // 2^60 bytes: a valid shape, but no machine has the memory.
  EXPECT_THAT(Tensor::Create(DType::kFloat64, {int64_t{1} << 57}),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(TensorTest, FromBytesCopiesExactByteCount) {
  const float values[] = {1.5f, -2.0f, 0.25f};
  auto t =
      Tensor::FromBytes(DType::kFloat32, {3},
                        absl::string_view(reinterpret_cast<const char*>(values), sizeof(values)));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->data<float>()[0], 1.5f);
  EXPECT_EQ(t->data<float>()[2], 0.25f);
  EXPECT_EQ(t->bytes(), absl::string_view(reinterpret_cast<const char*>(values), sizeof(values)));
}

TEST(TensorTest, FromBytesWrongByteCountIsInvalidArgumentNamingData) {
  EXPECT_THAT(
      Tensor::FromBytes(DType::kFloat16, {2, 3}, std::string(11, '\0')),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("data"), HasSubstr("12 bytes expected"), HasSubstr("got 11"))));
  EXPECT_THAT(Tensor::FromBytes(DType::kFloat16, {2, 3}, std::string(13, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("got 13")));
}

TEST(TensorTest, FromBytesWithHugeShapeAndShortDataFailsBeforeAllocating) {
  // 2^40 floats (4 TiB) announced, 4 bytes sent: a byte-count error, not an
  // allocation attempt.
  EXPECT_THAT(Tensor::FromBytes(DType::kFloat32, {int64_t{1} << 40}, "abcd"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("data")));
}

TEST(TensorTest, FromBytesWithNegativeDimIsInvalidArgument) {
  EXPECT_THAT(Tensor::FromBytes(DType::kFloat32, {-1}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("shape[0]")));
}

TEST(TensorTest, EmptyTensorHasNoBytes) {
  auto t = Tensor::FromBytes(DType::kBFloat16, {0, 4}, "");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->numel(), 0);
  EXPECT_TRUE(t->bytes().empty());
  Tensor d;
  EXPECT_EQ(d.numel(), 0);
  EXPECT_EQ(d.dtype(), DType::kFloat32);
}

TEST(TensorTest, CloneIsADeepCopy) {
  auto t = FromDoubles(DType::kFloat64, {2}, std::vector<double>{1.0, 2.0});
  ASSERT_THAT(t, IsOk());
  Tensor c = t->Clone();
  c.data<double>()[0] = 7.0;
  EXPECT_EQ(t->data<double>()[0], 1.0);
  EXPECT_EQ(c.shape(), t->shape());
}

TEST(TensorTest, ReshapeKeepsDataAndRejectsOtherCounts) {
  auto t = Tensor::Create(DType::kFloat32, {2, 3});
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(t->Reshape({3, 2}), IsOk());
  EXPECT_EQ(t->shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_THAT(t->Reshape({4, 2}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(t->Reshape({-6}), StatusIs(absl::StatusCode::kInvalidArgument));
}

// ---- Conversions

TEST(TensorTest, ToDoubleFromDoublesRoundTripsRepresentableValues) {
  // Representable in every dtype: small integers, halves, a subnormal of
  // fp16 (2^-24), negative zero.
  const std::vector<double> values = {0.0,   -0.0, 1.0, -2.5, 0.125, 1024.0, std::ldexp(1.0, -24),
                                      -384.0};
  for (DType d : kWideDTypes) {
    SCOPED_TRACE(DTypeName(d));
    auto t = FromDoubles(d, {2, 4}, values);
    ASSERT_THAT(t, IsOk());
    EXPECT_EQ(t->nbytes(), 8 * ItemSize(d));
    std::vector<double> back(values.size());
    ToDouble(*t, back.data());
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_EQ(back[i], values[i]);
      EXPECT_EQ(std::signbit(back[i]), std::signbit(values[i]));
      EXPECT_EQ(t->GetDouble(static_cast<int64_t>(i)), values[i]);
    }
    std::vector<float> as_float(values.size());
    ToFloat(*t, as_float.data());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(as_float[i], values[i]);
    auto from_floats = FromFloats(d, {2, 4}, std::vector<float>(as_float));
    ASSERT_THAT(from_floats, IsOk());
    EXPECT_EQ(from_floats->bytes(), t->bytes());
  }
}

TEST(TensorTest, Fp8TensorsHoldOneByteBitPatterns) {
  // 1.5 = 0 0111 100 (e4m3fn, bias 7) = 0 01111 10 (e5m2, bias 15);
  // -448 and -57344 are the largest magnitudes; 2^-9 and 2^-16 the
  // smallest subnormals; 300 rounds to 288 (e4m3fn: spacing 32 above 256)
  // (0 1111 001) and to 320 (e5m2: spacing 64 above 256; 300 is nearer 320 than 256).
  auto e4 = FromDoubles(DType::kFloat8E4M3Fn, {4},
                        std::vector<double>{1.5, -448.0, std::ldexp(1.0, -9), 300.0});
  ASSERT_THAT(e4, IsOk());
  EXPECT_EQ(e4->nbytes(), 4u);
  EXPECT_EQ(e4->bytes(), absl::string_view("\x3c\xfe\x01\x79", 4));
  EXPECT_EQ(e4->GetDouble(3), 288.0);
  auto e5 = FromDoubles(DType::kFloat8E5M2, {4},
                        std::vector<double>{1.5, -57344.0, std::ldexp(1.0, -16), 300.0});
  ASSERT_THAT(e5, IsOk());
  EXPECT_EQ(e5->bytes(), absl::string_view("\x3e\xfb\x01\x5d", 4));
  std::vector<double> back(4);
  ToDouble(*e5, back.data());
  EXPECT_EQ(back, (std::vector<double>{1.5, -57344.0, std::ldexp(1.0, -16), 320.0}));
  std::vector<float> as_float(4);
  ToFloat(*e4, as_float.data());
  EXPECT_EQ(as_float, (std::vector<float>{1.5f, -448.0f, std::ldexp(1.0f, -9), 288.0f}));
  EXPECT_EQ(RoundToDType(300.0, DType::kFloat8E4M3Fn), 288.0);
  EXPECT_EQ(RoundToDType(300.0f, DType::kFloat8E5M2), 320.0f);
}

TEST(TensorTest, FromDoublesStoresBitPatterns) {
  auto bf = FromDoubles(DType::kBFloat16, {2}, std::vector<double>{1.0, -2.0});
  ASSERT_THAT(bf, IsOk());
  EXPECT_EQ(bf->data<uint16_t>()[0], 0x3f80);
  EXPECT_EQ(bf->data<uint16_t>()[1], 0xc000);
  auto h = FromDoubles(DType::kFloat16, {2}, std::vector<double>{1.0, 65504.0});
  ASSERT_THAT(h, IsOk());
  EXPECT_EQ(h->data<uint16_t>()[0], 0x3c00);
  EXPECT_EQ(h->data<uint16_t>()[1], 0x7bff);
}

TEST(TensorTest, FromDoublesRoundsOnceToNearestEven) {
  // Just above the bf16 and fp16 ties at 1 + 2^-8 and 1 + 2^-11: a detour
  // through fp32 would land on the tie and round down.
  const double above_bf16_tie = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  const double above_fp16_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -30);
  EXPECT_EQ(
      FromDoubles(DType::kBFloat16, {1}, std::vector<double>{above_bf16_tie})->data<uint16_t>()[0],
      0x3f81);
  EXPECT_EQ(
      FromDoubles(DType::kFloat16, {1}, std::vector<double>{above_fp16_tie})->data<uint16_t>()[0],
      0x3c01);
  // To fp32: the tie 1 + 2^-24 goes to even.
  EXPECT_EQ(FromDoubles(DType::kFloat32, {1}, std::vector<double>{1.0 + std::ldexp(1.0, -24)})
                ->data<float>()[0],
            1.0f);
  EXPECT_EQ(RoundToDType(above_bf16_tie, DType::kBFloat16), 1.0 + std::ldexp(1.0, -7));
  EXPECT_EQ(RoundToDType(above_fp16_tie, DType::kFloat16), 1.0 + std::ldexp(1.0, -10));
  EXPECT_EQ(RoundToDType(1.0f + std::ldexp(1.0f, -8), DType::kBFloat16), 1.0f);
  EXPECT_EQ(RoundToDType(70000.0, DType::kFloat16), std::numeric_limits<double>::infinity());
}

TEST(TensorTest, FromDoublesCountMismatchIsInvalidArgument) {
  EXPECT_THAT(FromDoubles(DType::kFloat32, {2, 2}, std::vector<double>{1.0, 2.0}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("values"), HasSubstr("4 expected"), HasSubstr("got 2"))));
  EXPECT_THAT(FromFloats(DType::kFloat32, {-2}, std::vector<float>{}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TensorTest, ToFloatRoundsFp64ToNearest) {
  auto t = FromDoubles(DType::kFloat64, {1}, std::vector<double>{1.0 + std::ldexp(1.0, -30)});
  ASSERT_THAT(t, IsOk());
  float f = 0.0f;
  ToFloat(*t, &f);
  EXPECT_EQ(f, 1.0f);
}

TEST(ShapeStringTest, Brackets) {
  EXPECT_EQ(ShapeString({2, 768}), "[2, 768]");
  EXPECT_EQ(ShapeString({}), "[]");
}

TEST(TensorBorrowTest, ViewsTheOwnersBytesWithoutCopyAndKeepsThemAlive) {
  auto owner = std::make_shared<std::string>(std::string("\x80\x3f\x00\xc0\x00\x3f\x40\x40", 8));
  const char* bytes = owner->data();
  const size_t size = owner->size();
  std::weak_ptr<std::string> watch = owner;
  absl::StatusOr<Tensor> t =
      Tensor::Borrow(DType::kBFloat16, {2, 2}, bytes, size, std::move(owner));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->borrowed());
  EXPECT_EQ(static_cast<const Tensor&>(*t).raw(), bytes);  // no copy
  // bf16 0x3f80, 0xc000, 0x3f00, 0x4040 are 1, -2, 0.5, 3.
  EXPECT_EQ(t->GetDouble(0), 1.0);
  EXPECT_EQ(t->GetDouble(1), -2.0);
  EXPECT_EQ(t->GetDouble(2), 0.5);
  EXPECT_EQ(t->GetDouble(3), 3.0);
  EXPECT_FALSE(watch.expired());
  Tensor moved = std::move(*t);
  EXPECT_FALSE(watch.expired());
  Tensor copy = moved.Clone();
  EXPECT_FALSE(copy.borrowed());
  moved = Tensor();
  EXPECT_TRUE(watch.expired());  // the last view gone, the owner goes
  EXPECT_EQ(copy.GetDouble(3), 3.0);
}

TEST(TensorBorrowTest, SizeMismatchAndMisalignmentAreInvalidArgument) {
  auto owner = std::make_shared<std::string>(16, '\0');
  EXPECT_EQ(
      Tensor::Borrow(DType::kFloat32, {3}, owner->data(), owner->size(), owner).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Borrow(DType::kFloat32, {3}, owner->data() + 1, 12, owner).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Tensor::Borrow(DType::kFloat32, {3}, owner->data() + 4, 12, owner).ok());
}

// FP4 tensors pack two elements per byte, element 2i in the low nibble
// (torch.float4_e2m1fn_x2): byte 0x7a holds 0xa (sign 1, exponent 01,
// mantissa 0: -1.0) then 0x7 (6.0).
TEST(TensorTest, Fp4IsPackedTwoPerByteLowNibbleFirst) {
  auto t = Tensor::FromBytes(DType::kFloat4E2M1Fn, {3}, std::string("\x7a\x03", 2));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->nbytes(), 2u);
  EXPECT_EQ(t->GetDouble(0), -1.0);
  EXPECT_EQ(t->GetDouble(1), 6.0);
  EXPECT_EQ(t->GetDouble(2), 1.5);
  std::vector<float> v(3);
  ToFloat(*t, v.data());
  EXPECT_EQ(v, (std::vector<float>{-1.0f, 6.0f, 1.5f}));
  // Three elements take two bytes; four take two; the byte count is checked.
  EXPECT_THAT(Tensor::FromBytes(DType::kFloat4E2M1Fn, {4}, std::string(3, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 bytes expected")));
  // Stored from values: rounded to E2M1 (2.5 is a tie: to even, 2), packed.
  auto s = FromFloats(DType::kFloat4E2M1Fn, {2}, {2.5f, -0.5f});
  ASSERT_THAT(s, IsOk());
  EXPECT_EQ(s->bytes(), absl::string_view("\x94", 1));
  EXPECT_EQ(StorageBytes(DType::kFloat4E2M1Fn, 5), 3);
  EXPECT_EQ(StorageBytes(DType::kFloat8E8M0Fnu, 5), 5);
}

// UE8M0 scales: 2^(bits - 127), 0xff NaN; ParseDType knows both names.
TEST(TensorTest, E8m0IsAPowerOfTwoScale) {
  auto t = Tensor::FromBytes(DType::kFloat8E8M0Fnu, {3}, std::string("\x7f\x80\xff", 3));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->GetDouble(0), 1.0);
  EXPECT_EQ(t->GetDouble(1), 2.0);
  EXPECT_TRUE(std::isnan(t->GetDouble(2)));
  EXPECT_EQ(*ParseDType("float8_e8m0fnu"), DType::kFloat8E8M0Fnu);
  EXPECT_EQ(*ParseDType("float4_e2m1fn"), DType::kFloat4E2M1Fn);
  EXPECT_EQ(DTypeName(DType::kFloat4E2M1Fn), "float4_e2m1fn");
}

}  // namespace
}  // namespace tensorcheck
