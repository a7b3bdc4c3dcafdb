// TensorCoreAccumulate against KernelOrderDot, its definition (itself
// tested against an independent implementation in
// core/tensor_core_model_test.cc), bit for bit: the vectorised path (where
// the CPU has one; AVX-512 and AVX2 where it has both) and the portable one, every preset
// (sm80/sm90/sm100 x bf16/fp16/TF32, sm90/sm100 x E4M3/E5M2 and the mixed pairs), residues first
// and last, promotion, odd shapes and both weight layouts, on values that exercise each step of the
// vector path's exactness argument: blocks whose terms fill the int32 runs, truncated and
// cancelling terms, format subnormals, magnitudes outside the vector path's range, inf/NaN and
// values wider than the format.
#include "server/backends/cpu/internal/tensor_core_accumulate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/float_formats.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::internal {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;

// Sets an environment variable to 1 while alive, when `on` (read on every
// call): TENSORCHECK_TCACC_SCALAR forces the portable path,
// TENSORCHECK_TCACC_AVX2 the AVX2 kernel where the CPU has AVX-512.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, bool on) : name_(name), on_(on) {
    if (on_) setenv(name_, "1", 1);
  }
  ~ScopedEnv() {
    if (on_) unsetenv(name_);
  }

 private:
  const char* name_;
  bool on_;
};

const char* InputName(TensorCoreInput f) {
  switch (f) {
    case TensorCoreInput::kFp16:
      return "fp16";
    case TensorCoreInput::kBf16:
      return "bf16";
    case TensorCoreInput::kTf32:
      return "tf32";
    case TensorCoreInput::kE4M3:
      return "e4m3";
    case TensorCoreInput::kE5M2:
      return "e5m2";
  }
  return "?";
}

// v as a value of format f (to nearest; FP8 saturating).
float RoundTo(TensorCoreInput f, double v) {
  switch (f) {
    case TensorCoreInput::kFp16:
      return Fp16BitsToFloat(DoubleToFp16Bits(v));
    case TensorCoreInput::kBf16:
      return Bf16BitsToFloat(DoubleToBf16Bits(v));
    case TensorCoreInput::kTf32:
      return BitsToFloat(FloatBits(static_cast<float>(v)) & ~0x1FFFu);
    case TensorCoreInput::kE4M3:
      return Fp8BitsToFloat(DoubleToFp8Bits(v, Fp8Format::kE4M3Fn, Fp8Overflow::kSaturate),
                            Fp8Format::kE4M3Fn);
    case TensorCoreInput::kE5M2:
      return Fp8BitsToFloat(DoubleToFp8Bits(v, Fp8Format::kE5M2, Fp8Overflow::kSaturate),
                            Fp8Format::kE5M2);
  }
  return 0.0f;
}

// Fraction bits and the exponents of the smallest subnormal and the
// largest normal.
struct Range {
  int mantissa_bits, min_subnormal, max_exponent;
};

Range RangeOf(TensorCoreInput f) {
  switch (f) {
    case TensorCoreInput::kFp16:
      return {10, -24, 15};
    case TensorCoreInput::kBf16:
      return {7, -133, 127};
    case TensorCoreInput::kTf32:
      return {10, -136, 127};
    case TensorCoreInput::kE4M3:
      return {3, -9, 8};
    case TensorCoreInput::kE5M2:
      return {2, -16, 15};
  }
  return {};
}

enum class Data {
  kNormal,      // N(0, 1) scaled, some zeros of both signs
  kWide,        // magnitudes over the format's range, subnormals included;
                // bf16 and TF32 pairs beyond the vector range (the fallback)
  kNearFour,    // every product near 4 * 2^e, one sign: full int32 runs
  kCancelling,  // +-1, +-2, +-0 and small values: zero sums, swamping
  kSpecials,    // kNormal with a few inf, NaN, wider, huge and tiny values
  kLowest,      // products whose exponents sum to the vector path's floor,
                // align_bits - 126, and just above: blocks whose results sit
                // at fp32's smallest normals (format subnormals for fp16 and FP8)
};

const char* DataName(Data d) {
  switch (d) {
    case Data::kNormal:
      return "normal";
    case Data::kWide:
      return "wide";
    case Data::kNearFour:
      return "near_four";
    case Data::kCancelling:
      return "cancelling";
    case Data::kSpecials:
      return "specials";
    case Data::kLowest:
      return "lowest";
  }
  return "?";
}

// `exponent`: kLowest's usual exponent.
float Draw(std::mt19937& rng, TensorCoreInput f, Data data, double scale, int exponent = 0) {
  std::uniform_int_distribution<int> pick(0, 99);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const Range range = RangeOf(f);
  const int p = pick(rng);
  switch (data) {
    case Data::kNormal:
      if (p < 4) return 0.0f;
      if (p < 8) return -0.0f;
      return RoundTo(f, normal(rng) * scale);
    case Data::kWide: {
      if (p < 5) return p < 3 ? 0.0f : -0.0f;
      std::uniform_int_distribution<int> exponent(range.min_subnormal,
                                                  std::min(range.max_exponent, 60));
      const double v = std::ldexp(1.0 + unit(rng), exponent(rng));
      return RoundTo(f, p % 2 == 0 ? v : -v);
    }
    case Data::kNearFour: {
      // The largest significand, at exponent 0 mostly: products of
      // (2 - 2^-mb)^2, just below 4, every one the block's largest.
      const double top = 2.0 - std::ldexp(1.0, -range.mantissa_bits);
      return static_cast<float>(std::ldexp(top, p < 90 ? 0 : -1));
    }
    case Data::kCancelling: {
      static constexpr double kValues[] = {1.0, -1.0, 2.0, -2.0, 0.0, -0.0, 0.125, -0.125};
      if (p >= 80) return RoundTo(f, std::ldexp(p % 2 == 0 ? 1.0 : -1.0, -(p % 9)));
      return static_cast<float>(kValues[p % 8]);
    }
    case Data::kSpecials:
      switch (p) {
        case 0:
          return std::numeric_limits<float>::infinity();
        case 1:
          return -std::numeric_limits<float>::infinity();
        case 2:
          return std::numeric_limits<float>::quiet_NaN();
        case 3:
          return 1.0f + 0x1p-20f;  // wider than every input format
        case 4:
          return RoundTo(f, std::ldexp(1.5, range.max_exponent));  // huge
        case 5:
          return RoundTo(f, std::ldexp(1.0, range.min_subnormal));  // tiny
        case 6:
          return 0x1p-140f;  // an fp32 subnormal
        default:
          return RoundTo(f, normal(rng) * scale);
      }
    case Data::kLowest: {
      // Mostly the usual exponent, some up to 8 above (the smaller
      // products then lose bits), one in a thousand 2 below (its row or
      // column outside the vector range).
      const int below = p == 99 && pick(rng) < 10 ? -2 : 0;
      const int e = std::max(exponent, range.min_subnormal) + (p < 70 ? 0 : p % 9) + below;
      const double v = std::ldexp(1.0 + unit(rng), e);
      return RoundTo(f, p % 2 == 0 ? v : -v);
    }
  }
  return 0.0f;
}

// kSpecials: only a few entries special, the rest kNormal.
std::vector<float> Fill(std::mt19937& rng, TensorCoreInput f, Data data, int64_t count,
                        double scale, int exponent = 0) {
  std::vector<float> v(static_cast<size_t>(count));
  const Data base = data == Data::kSpecials ? Data::kNormal : data;
  for (float& e : v) e = Draw(rng, f, base, scale, exponent);
  if (data == Data::kSpecials && count > 0) {
    std::uniform_int_distribution<int64_t> at(0, count - 1);
    for (int64_t s = 0; s < std::max<int64_t>(1, count / 150); ++s) {
      v[static_cast<size_t>(at(rng))] = Draw(rng, f, Data::kSpecials, scale);
    }
  }
  if (data == Data::kNearFour) {
    // One sign per operand: every product of one sign (x positive; w
    // negative for odd seeds' columns via the caller's choice).
    for (float& e : v) e = std::fabs(e);
  }
  return v;
}

struct Shape {
  int64_t m, nb, k;
};

struct Case {
  std::string name;
  KernelOrder order;
  TensorCoreInput a, b;
};

struct RunOptions {
  bool scalar = false;
  int threads = 2;
  bool avx2 = false;  // the AVX2 kernel even where the CPU has AVX-512
};

void ExpectMatchesDefinition(const Shape& s, WeightLayout layout, const Case& c, Data data,
                             const RunOptions& run, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool out_in = layout == WeightLayout::kOutIn;
  const int64_t ldw = out_in ? 0 : s.nb + 3;  // IN_OUT: a block of a wider weight
  const int64_t ldc = s.nb + 5;
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(s.k, 1)));
  // kLowest: x's and w's usual exponents sum to align_bits - 126.
  const int low = c.order.model.align_bits - 126;
  const std::vector<float> x = Fill(rng, c.a, data, s.m * s.k, 1.0, low / 2);
  std::vector<float> w =
      Fill(rng, c.b, data, out_in ? s.nb * s.k : s.k * ldw, w_scale, low - low / 2);
  if (data == Data::kNearFour && seed % 2 == 1) {
    for (float& e : w) e = -e;
  }
  // One row more than m, to see that nothing is written past it.
  std::vector<float> acc(static_cast<size_t>((s.m + 1) * ldc), 12345.0f);
  {
    ScopedEnv scalar("TENSORCHECK_TCACC_SCALAR", run.scalar);
    ScopedEnv avx2("TENSORCHECK_TCACC_AVX2", run.avx2);
    ASSERT_THAT(TensorCoreAccumulate(x.data(), w.data(), layout, s.m, s.nb, s.k, ldw, c.order,
                                     run.threads, acc.data(), ldc, /*stop=*/nullptr),
                IsOk());
  }
  int64_t mismatches = 0;
  for (int64_t i = 0; i <= s.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = acc[static_cast<size_t>(i * ldc + j)];
      if (i == s.m || j >= s.nb) {
        ASSERT_EQ(FloatBits(got), FloatBits(12345.0f)) << "wrote outside at " << i << "," << j;
        continue;
      }
      const float want =
          out_in ? KernelOrderDot(x.data() + i * s.k, w.data() + j * s.k, 1, s.k, c.order)
                 : KernelOrderDot(x.data() + i * s.k, w.data() + j, ldw, s.k, c.order);
      if (FloatBits(got) != FloatBits(want) && ++mismatches <= 5) {
        ADD_FAILURE() << c.name << " m=" << s.m << " nb=" << s.nb << " k=" << s.k
                      << (out_in ? " OUT_IN" : " IN_OUT") << " data=" << DataName(data)
                      << (run.scalar ? " scalar" : "") << (run.avx2 ? " avx2" : "")
                      << " threads=" << run.threads << " at [" << i << ", " << j << "]: got " << got
                      << " (0x" << std::hex << FloatBits(got) << "), want " << want << " (0x"
                      << FloatBits(want) << std::dec << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// A kernel order: tile_k, residue, promotion.
KernelOrder OrderOf(const TensorCoreModel& model, int64_t tile_k, KResidue residue,
                    int64_t promote) {
  KernelOrder o;
  o.model = model;
  o.tile_k = tile_k;
  o.residue = residue;
  o.promote = promote;
  return o;
}

// Every preset with the orders a configuration can name, and some it
// cannot (a tile or promotion interval that is no multiple of the block).
std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const TensorCoreInput wide[] = {TensorCoreInput::kBf16, TensorCoreInput::kFp16,
                                  TensorCoreInput::kTf32};
  const std::pair<TensorCoreInput, TensorCoreInput> fp8[] = {
      {TensorCoreInput::kE4M3, TensorCoreInput::kE4M3},
      {TensorCoreInput::kE5M2, TensorCoreInput::kE5M2},
      {TensorCoreInput::kE4M3, TensorCoreInput::kE5M2},
      {TensorCoreInput::kE5M2, TensorCoreInput::kE4M3}};
  for (TensorCoreGpu gpu : {TensorCoreGpu::kSm80, TensorCoreGpu::kSm90, TensorCoreGpu::kSm100}) {
    std::vector<std::pair<TensorCoreInput, TensorCoreInput>> inputs;
    for (TensorCoreInput f : wide) inputs.push_back({f, f});
    if (gpu != TensorCoreGpu::kSm80) inputs.insert(inputs.end(), std::begin(fp8), std::end(fp8));
    for (const auto& [a, b] : inputs) {
      const TensorCoreModel model = *TensorCoreModelFor(gpu, a, b);
      const std::string base =
          absl::StrCat(TensorCoreGpuName(gpu), "_", InputName(a), "x", InputName(b));
      const bool is_fp8 = a == TensorCoreInput::kE4M3 || a == TensorCoreInput::kE5M2;
      const int64_t blk = model.block;
      cases.push_back({base, OrderOf(model, 0, KResidue::kLast, 0), a, b});
      cases.push_back({base + "_tile2b_first", OrderOf(model, 2 * blk, KResidue::kFirst, 0), a, b});
      cases.push_back({base + "_tile37_first", OrderOf(model, 37, KResidue::kFirst, 0), a, b});
      if (is_fp8) {
        cases.push_back({base + "_promote128", OrderOf(model, 0, KResidue::kLast, 128), a, b});
        cases.push_back(
            {base + "_tile64_first_promote64", OrderOf(model, 64, KResidue::kFirst, 64), a, b});
        cases.push_back({base + "_promote40", OrderOf(model, 0, KResidue::kLast, 40), a, b});
      }
    }
  }
  return cases;
}

TEST(TensorCoreAccumulateTest, VectorPathIsTheDefinitionBitForBitOverPresetsOrdersAndData) {
  const Shape shapes[] = {{1, 1, 1}, {3, 17, 33}, {5, 9, 100}, {2, 31, 0}, {6, 11, 203}};
  const Data datas[] = {Data::kNormal,     Data::kWide,     Data::kNearFour,
                        Data::kCancelling, Data::kSpecials, Data::kLowest};
  for (bool avx2 : {false, true}) {
    uint32_t seed = 1;
    for (const Case& c : AllCases()) {
      for (const Shape& s : shapes) {
        for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
          for (Data data : datas) {
            ExpectMatchesDefinition(s, layout, c, data, RunOptions{false, 2, avx2}, seed++);
            if (HasFailure()) return;
          }
        }
      }
    }
  }
}

// Enough rows and K for several row blocks, K chunks (promotion pieces and
// blocks cut across chunk boundaries), both threads and several slices.
TEST(TensorCoreAccumulateTest, ManyRowsOverChunksThreadsAndSlicesMatchTheDefinition) {
  const TensorCoreModel sm90_bf16 =
      *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16);
  const TensorCoreModel sm80_fp16 =
      *TensorCoreModelFor(TensorCoreGpu::kSm80, TensorCoreInput::kFp16);
  const TensorCoreModel sm90_e4m3 =
      *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kE4M3);
  const TensorCoreModel sm100_e5m2 =
      *TensorCoreModelFor(TensorCoreGpu::kSm100, TensorCoreInput::kE5M2);
  const Case cases[] = {
      {"sm90_bf16_tile128_first", OrderOf(sm90_bf16, 128, KResidue::kFirst, 0),
       TensorCoreInput::kBf16, TensorCoreInput::kBf16},
      {"sm80_fp16", OrderOf(sm80_fp16, 0, KResidue::kLast, 0), TensorCoreInput::kFp16,
       TensorCoreInput::kFp16},
      {"sm90_e4m3_tile1024_first_promote1024", OrderOf(sm90_e4m3, 1024, KResidue::kFirst, 1024),
       TensorCoreInput::kE4M3, TensorCoreInput::kE4M3},
      {"sm100_e5m2_promote128", OrderOf(sm100_e5m2, 0, KResidue::kLast, 128),
       TensorCoreInput::kE5M2, TensorCoreInput::kE5M2},
  };
  uint32_t seed = 1000;
  for (const Case& c : cases) {
    ExpectMatchesDefinition({70, 41, 1500}, WeightLayout::kOutIn, c, Data::kNormal, RunOptions{},
                            seed++);
    ExpectMatchesDefinition({70, 41, 1500}, WeightLayout::kInOut, c, Data::kSpecials,
                            RunOptions{false, 2, /*avx2=*/true}, seed++);
  }
  ExpectMatchesDefinition({37, 16, 1100}, WeightLayout::kOutIn, cases[0], Data::kWide,
                          RunOptions{false, 1}, seed++);
  ExpectMatchesDefinition({37, 16, 1100}, WeightLayout::kOutIn, cases[3], Data::kNearFour,
                          RunOptions{false, 1}, seed++);
}

TEST(TensorCoreAccumulateTest, PortablePathIsTheDefinitionBitForBit) {
  const std::vector<Case> cases = AllCases();
  uint32_t seed = 7;
  for (size_t i = 0; i < cases.size(); i += 5) {
    for (WeightLayout layout : {WeightLayout::kOutIn, WeightLayout::kInOut}) {
      for (int threads : {1, 2}) {
        ExpectMatchesDefinition({3, 19, 70}, layout, cases[i], Data::kSpecials,
                                RunOptions{true, threads}, seed++);
      }
    }
  }
  // Enough work for two threads.
  ExpectMatchesDefinition({9, 40, 3000}, WeightLayout::kOutIn, cases[0], Data::kNormal,
                          RunOptions{true, 2}, seed++);
}

// Models outside the vector path's conditions run KernelOrderDot.
TEST(TensorCoreAccumulateTest, OtherModelsAreTheDefinition) {
  TensorCoreModel nearest = *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16);
  nearest.rounding = TensorCoreRounding::kNearestEven;
  TensorCoreModel narrow_align = nearest;
  narrow_align.rounding = TensorCoreRounding::kTowardZero;
  narrow_align.align_bits = 20;  // result_bits 24 > align_bits + 1
  TensorCoreModel wide_align = narrow_align;
  wide_align.align_bits = 30;  // terms beyond int32
  TensorCoreModel odd = narrow_align;
  odd.align_bits = 29;  // one term per int32 run
  odd.result_bits = 9;
  odd.block = 5;
  uint32_t seed = 500;
  for (const TensorCoreModel& model : {nearest, narrow_align, wide_align, odd}) {
    const Case c{"custom", OrderOf(model, 48, KResidue::kFirst, 0), TensorCoreInput::kBf16,
                 TensorCoreInput::kBf16};
    for (Data data : {Data::kNormal, Data::kNearFour, Data::kCancelling}) {
      ExpectMatchesDefinition({4, 13, 150}, WeightLayout::kOutIn, c, data, RunOptions{}, seed++);
    }
  }
}

TEST(TensorCoreAccumulateTest, StopBeforeTheWorkReturnsItsStatusAndWritesNothing) {
  const int64_t m = 64, nb = 64, k = 1024;
  std::mt19937 rng(3);
  const std::vector<float> x = Fill(rng, TensorCoreInput::kBf16, Data::kNormal, m * k, 1.0);
  const std::vector<float> w = Fill(rng, TensorCoreInput::kBf16, Data::kNormal, nb * k, 0.03);
  const KernelOrder order = OrderOf(
      *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16), 0, KResidue::kLast, 0);
  StopSignal cancelled;
  cancelled.Cancel(StopSignal::Reason::kClientCancelled);
  StopSignal expired(absl::Now() - absl::Seconds(1));
  for (bool scalar : {false, true}) {
    ScopedEnv force("TENSORCHECK_TCACC_SCALAR", scalar);
    for (int threads : {1, 2}) {
      std::vector<float> acc(static_cast<size_t>(m * nb), 12345.0f);
      EXPECT_THAT(TensorCoreAccumulate(x.data(), w.data(), WeightLayout::kOutIn, m, nb, k, 0, order,
                                       threads, acc.data(), nb, &cancelled),
                  StatusIs(absl::StatusCode::kCancelled));
      EXPECT_THAT(TensorCoreAccumulate(x.data(), w.data(), WeightLayout::kOutIn, m, nb, k, 0, order,
                                       threads, acc.data(), nb, &expired),
                  StatusIs(absl::StatusCode::kDeadlineExceeded));
      for (float v : acc) ASSERT_EQ(v, 12345.0f) << (scalar ? "scalar" : "vector");
    }
  }
}

TEST(TensorCoreAccumulateTest, StopDuringTheWorkReturnsItsStatus) {
  // Tens of milliseconds of work on one core, the deadline 1 ms away.
  const int64_t m = 128, nb = 512, k = 4096;
  std::mt19937 rng(4);
  const std::vector<float> x = Fill(rng, TensorCoreInput::kBf16, Data::kNormal, m * k, 1.0);
  const std::vector<float> w = Fill(rng, TensorCoreInput::kBf16, Data::kNormal, nb * k, 0.02);
  const KernelOrder order = OrderOf(
      *TensorCoreModelFor(TensorCoreGpu::kSm90, TensorCoreInput::kBf16), 0, KResidue::kLast, 0);
  std::vector<float> acc(static_cast<size_t>(m * nb));
  StopSignal soon(absl::Now() + absl::Milliseconds(1));
  EXPECT_THAT(TensorCoreAccumulate(x.data(), w.data(), WeightLayout::kOutIn, m, nb, k, 0, order,
                                   /*threads=*/2, acc.data(), nb, &soon),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

}  // namespace
}  // namespace tensorcheck::internal
