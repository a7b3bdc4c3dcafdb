// Fp8FastAccumulate against FastAccumDot, the model's definition, bit for
// bit: the vectorised path (where the CPU has one) and the portable one,
// both weight layouts, many shapes, several models (in and outside the
// vector path's range), FP8 values of both formats with zeros, cancelling
// products, subnormals, inf/NaN, and rows and columns of other floats.
// A few elements are also checked against an exact integer evaluation of
// the model written out from its documented definition.
#include "server/backends/cpu/internal/fp8_accumulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float_formats.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::internal {
namespace {

using ::tensorcheck::testing::IsOk;

// Forces the portable path while alive (read on every call).
class ScopedScalarFp8Acc {
 public:
  explicit ScopedScalarFp8Acc(bool on) : on_(on) {
    if (on_) setenv("TENSORCHECK_FP8ACC_SCALAR", "1", 1);
  }
  ~ScopedScalarFp8Acc() {
    if (on_) unsetenv("TENSORCHECK_FP8ACC_SCALAR");
  }

 private:
  bool on_;
};

enum class Data {
  kE4M3,        // any e4m3fn value but NaN, small and large exponents alike
  kE5M2,        // any finite e5m2 value
  kCancelling,  // +-1, +-2, 0 and small values: zero sums, -0, swamping
  kSpecials,    // e5m2 with some inf and NaN, and a few fp32 values that are no FP8 value
};

// An FP8 byte of `format` that is not NaN (nor inf).
float FiniteFp8(std::mt19937& rng, Fp8Format format) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (;;) {
    const float v = Fp8BitsToFloat(static_cast<uint8_t>(byte(rng)), format);
    if (std::isfinite(v)) return v;
  }
}

float Draw(std::mt19937& rng, Data data) {
  std::uniform_int_distribution<int> pick(0, 99);
  const int p = pick(rng);
  switch (data) {
    case Data::kE4M3:
      return p < 8 ? 0.0f : FiniteFp8(rng, Fp8Format::kE4M3Fn);
    case Data::kE5M2:
      return p < 8 ? -0.0f : FiniteFp8(rng, Fp8Format::kE5M2);
    case Data::kCancelling: {
      static constexpr float kValues[] = {1.0f,  -1.0f,  2.0f,    -2.0f,   0.0f,
                                          -0.0f, 0.125f, -0.125f, 0x1p-9f, -0x1p-9f};
      return kValues[p % 10];
    }
    case Data::kSpecials:
      if (p == 0) return std::numeric_limits<float>::infinity();
      if (p == 1) return -std::numeric_limits<float>::infinity();
      if (p == 2) return std::numeric_limits<float>::quiet_NaN();
      if (p == 3) return 0x1p-140f;  // an fp32 subnormal
      if (p == 4) return 1.0f + 0x1p-20f;
      if (p == 5) return 0x1p20f;
      return FiniteFp8(rng, Fp8Format::kE5M2);
  }
  return 0.0f;
}

// Fills most of v from `data`; for kSpecials only a few rows/columns
// (every seventh entry of `lines`) get the special values, the rest e5m2.
std::vector<float> Fill(std::mt19937& rng, Data data, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& f : v) f = Draw(rng, data == Data::kSpecials ? Data::kE5M2 : data);
  if (data == Data::kSpecials && count > 0) {
    std::uniform_int_distribution<int64_t> at(0, count - 1);
    for (int64_t s = 0; s < std::max<int64_t>(1, count / 200); ++s) {
      v[static_cast<size_t>(at(rng))] = Draw(rng, Data::kSpecials);
    }
  }
  return v;
}

struct Shape {
  int64_t m, nb, k;
};

void ExpectMatchesDefinition(const Shape& s, WeightLayout layout, const FastAccumModel& model,
                             Data data, bool scalar, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool out_in = layout == WeightLayout::kOutIn;
  const int64_t ldw = out_in ? 0 : s.nb + 3;  // IN_OUT: a block of a wider weight
  const int64_t ldc = s.nb + 5;
  const std::vector<float> x = Fill(rng, data, s.m * s.k);
  const std::vector<float> w = Fill(rng, data, out_in ? s.nb * s.k : s.k * ldw);
  std::vector<float> acc(static_cast<size_t>(s.m * ldc), 12345.0f);
  {
    ScopedScalarFp8Acc force(scalar);
    ASSERT_THAT(Fp8FastAccumulate(x.data(), w.data(), layout, s.m, s.nb, s.k, ldw, model,
                                  /*threads=*/2, acc.data(), ldc, /*stop=*/nullptr),
                IsOk());
  }
  int64_t mismatches = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = acc[static_cast<size_t>(i * ldc + j)];
      if (j >= s.nb) {
        ASSERT_EQ(FloatBits(got), FloatBits(12345.0f)) << "wrote past nb at " << i << "," << j;
        continue;
      }
      const float want = out_in
                             ? FastAccumDot(x.data() + i * s.k, w.data() + j * s.k, 1, s.k, model)
                             : FastAccumDot(x.data() + i * s.k, w.data() + j, ldw, s.k, model);
      if (FloatBits(got) != FloatBits(want) && ++mismatches <= 5) {
        ADD_FAILURE() << "m=" << s.m << " nb=" << s.nb << " k=" << s.k
                      << (out_in ? " OUT_IN" : " IN_OUT") << " bits=" << model.accumulator_bits
                      << " group=" << model.group << " data=" << static_cast<int>(data)
                      << (scalar ? " scalar" : "") << " at [" << i << ", " << j << "]: got " << got
                      << " (0x" << std::hex << FloatBits(got) << "), want " << want << " (0x"
                      << FloatBits(want) << std::dec << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp8FastAccumulateTest, VectorPathIsTheModelBitForBitOverShapesLayoutsAndModels) {
  const Shape shapes[] = {{1, 1, 1},    {2, 16, 32},  {3, 17, 33}, {5, 7, 100},
                          {4, 33, 257}, {7, 50, 515}, {2, 31, 0},  {9, 64, 1031}};
  // In the vector path's range, at its edges, and outside it (the
  // fallback): bits 17/group 32 uses 2^23.0 of fp32's 2^24.
  const FastAccumModel models[] = {{13, 32},   {13, 1},  {0, 7},    {17, 32}, {14, 256},
                                   {13, 1000}, {10, 5},  {15, 256}, {23, 1},  {24, 32},
                                   {52, 32},   {-1, 32}, {13, 0}};
  const Data datas[] = {Data::kE4M3, Data::kE5M2, Data::kCancelling, Data::kSpecials};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (const FastAccumModel& model : models) {
        for (Data data : datas) {
          ExpectMatchesDefinition(s, layout, model, data, /*scalar=*/false, seed++);
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST(Fp8FastAccumulateTest, PortablePathIsTheModelBitForBit) {
  for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
    for (Data data : {Data::kE4M3, Data::kSpecials}) {
      ExpectMatchesDefinition({3, 19, 70}, layout, FastAccumModel{}, data, /*scalar=*/true, 7);
    }
  }
}

TEST(Fp8FastAccumulateTest, ManyRowsOverThreadsAndSlicesMatchTheModel) {
  // Enough work for two threads and several slices per thread.
  ExpectMatchesDefinition({37, 100, 4096}, WeightLayout::kOutIn, FastAccumModel{}, Data::kE4M3,
                          /*scalar=*/false, 99);
  ExpectMatchesDefinition({37, 100, 4096}, WeightLayout::kInOut, FastAccumModel{},
                          Data::kCancelling, /*scalar=*/false, 100);
}

// The model written out from its definition (core/fp8_scaling.h) in exact
// integer arithmetic, for finite FP8 inputs: every value is an integer
// multiple of 2^-64 (products of FP8 values are multiples of 2^-32, and
// quanta stay above 2^-64 for bits <= 16), held in 128 bits; C++'s
// integer division truncates toward zero. Zeros have no sign here.
double IntegerModel(const float* a, const float* b, int64_t k, int bits, int group) {
  __extension__ typedef __int128 Int;
  auto exponent = [](Int v) {  // floor(log2 |v|) in units of 2^-64
    if (v < 0) v = -v;
    int e = -1;
    while (v != 0) {
      v >>= 1;
      ++e;
    }
    return e - 64;
  };
  auto truncate = [](Int v, int e) {  // toward zero to a multiple of 2^e
    const Int unit = Int{1} << (e + 64);
    return v / unit * unit;
  };
  Int acc = 0;
  for (int64_t start = 0; start < k; start += group) {
    const int64_t count = std::min<int64_t>(group, k - start);
    std::vector<Int> p;
    int e_max = acc != 0 ? exponent(acc) : std::numeric_limits<int>::min();
    for (int64_t i = 0; i < count; ++i) {
      // Exact: a product of FP8 values times 2^64 is an integer.
      const double prod = static_cast<double>(a[start + i]) * b[start + i];
      p.push_back(static_cast<Int>(std::ldexp(prod, 64)));
      if (p.back() != 0) e_max = std::max(e_max, exponent(p.back()));
    }
    if (e_max == std::numeric_limits<int>::min()) continue;
    Int sum = truncate(acc, e_max - bits);
    for (Int v : p) sum += truncate(v, e_max - bits);
    if (sum != 0) sum = truncate(sum, exponent(sum) - bits);
    acc = sum;
  }
  return std::ldexp(static_cast<double>(acc), -64);
}

TEST(Fp8FastAccumulateTest, AgreesWithAnExactIntegerEvaluationOfTheModel) {
  std::mt19937 rng(5);
  const int64_t m = 4, nb = 24, k = 300;
  for (const FastAccumModel model : {FastAccumModel{13, 32}, FastAccumModel{4, 5}}) {
    for (Data data : {Data::kE4M3, Data::kE5M2, Data::kCancelling}) {
      const std::vector<float> x = Fill(rng, data, m * k);
      const std::vector<float> w = Fill(rng, data, nb * k);
      std::vector<float> acc(static_cast<size_t>(m * nb));
      ASSERT_THAT(Fp8FastAccumulate(x.data(), w.data(), WeightLayout::kOutIn, m, nb, k, 0, model,
                                    /*threads=*/1, acc.data(), nb, nullptr),
                  IsOk());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < nb; ++j) {
          const double want = IntegerModel(x.data() + i * k, w.data() + j * k, k,
                                           model.accumulator_bits, model.group);
          EXPECT_EQ(static_cast<double>(acc[static_cast<size_t>(i * nb + j)]), want)
              << "[" << i << ", " << j << "] bits=" << model.accumulator_bits;
        }
      }
    }
  }
}

}  // namespace
}  // namespace tensorcheck::internal
