// Tests of the request verify and diagnose build from their flags
// (internal/verify_request.h): FP8 operands, their dequantisation scales
// (--input-scale, --weight-scale) and fp8 configurations, on files written
// here byte by byte.
#include "client/cli/internal/verify_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli/internal/command_line.h"
#include "tests/testing/status_matchers.h"

namespace tensorcheck::cli::internal {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

std::string Le(uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A .npy v1 file with `descr`, `shape` (a Python tuple) and `data`.
std::string Npy(const std::string& descr, const std::string& shape, const std::string& data) {
  const std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }\n";
  return std::string("\x93NUMPY\x01\x00", 8) + Le(header.size(), 2) + header + data;
}

// A safetensors file of one tensor `name`.
std::string St(const std::string& name, const std::string& dtype, const std::string& shape,
               const std::string& data) {
  const std::string json = "{\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape +
                           ", \"data_offsets\": [0, " + std::to_string(data.size()) + "]}}";
  return Le(json.size(), 8) + json + data;
}

std::string Bytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Little-endian float32 bit patterns, written out by hand:
// 0.0125 = 1.6 * 2^-7 -> exponent 120 = 0x78, mantissa round(0.6 * 2^23) =
// 0x4ccccd: 0x3c4ccccd. 2.0 = 0x40000000, 0.5 = 0x3f000000, 0.25 = 0x3e800000.
std::string F32Bits(const std::vector<uint32_t>& bits) {
  std::string s;
  for (uint32_t b : bits) s += Le(b, 4);
  return s;
}

// e4m3fn: 1.5 = 0.0111.100, 448 = 0.1111.110, -1.5 = 1.0111.100, 0.
// e5m2: 1.5 = 0.01111.10, 57344 = 0.11110.11.
const std::string kInputE4m3 = Bytes({0x3c, 0x7e, 0xbc, 0x00, 0x3c, 0x3c});  // [2, 3]
const std::string kWeightE4m3 = Bytes({0x3c, 0x00, 0x00, 0x00, 0x3c, 0x00,   // [4, 3]
                                       0x00, 0x00, 0x3c, 0x7e, 0x7e, 0x7e});
const std::string kWeightE5m2 = Bytes({0x3e, 0x00, 0x00, 0x00, 0x3e, 0x00,  // [4, 3]
                                       0x00, 0x00, 0x3e, 0x7b, 0x7b, 0x7b});

class VerifyRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/verify_request_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    x_ = Write("x.npy", Npy("|u1", "(2, 3)", kInputE4m3));
    w_ = Write("w.npy", Npy("|u1", "(4, 3)", kWeightE4m3));
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
  // Parses `args` as the command line `tensorcheck ARGS...`.
  static absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "tensorcheck");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  }
  // `verify` of the FP8 input and weight with `extra` flags.
  static absl::StatusOr<pb::VerifyRequest> Build(const std::vector<std::string>& flags,
                                                 std::vector<HeldTensor>* held = nullptr) {
    auto cl = Parse(flags);
    if (!cl.ok()) return cl.status();
    return BuildRequest(*cl, held);
  }
  std::vector<std::string> Fp8Flags() const {
    return {"verify",  "--input",       x_,        "--weight",      w_,
            "--dtype", "input=fp8e4m3", "--dtype", "weight=fp8e4m3"};
  }
  static std::vector<std::string> Plus(std::vector<std::string> a,
                                       const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  std::string dir_, x_, w_;
  std::vector<std::string> files_;
};

TEST_F(VerifyRequestTest, Fp8NpyOperandsAndNumberScalesLandAsTheirBytesAndFloat32Scalars) {
  auto req = Build(Plus(Fp8Flags(), {"--input-scale", "0.0125", "--weight-scale=2"}));
  ASSERT_THAT(req, IsOk());
  const pb::LinearOp& op = req->op();
  EXPECT_EQ(op.input().dtype(), pb::DTYPE_FLOAT8_E4M3FN);
  EXPECT_THAT(op.input().shape(), ElementsAre(2, 3));
  EXPECT_EQ(op.input().data(), kInputE4m3);
  EXPECT_EQ(op.weight().dtype(), pb::DTYPE_FLOAT8_E4M3FN);
  EXPECT_THAT(op.weight().shape(), ElementsAre(4, 3));
  EXPECT_EQ(op.weight().data(), kWeightE4m3);
  // A number is one per-tensor scale: float32, shape [].
  EXPECT_EQ(op.input_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(op.input_scale().shape(), IsEmpty());
  EXPECT_EQ(op.input_scale().data(), F32Bits({0x3c4ccccd}));
  EXPECT_EQ(op.weight_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(op.weight_scale().shape(), IsEmpty());
  EXPECT_EQ(op.weight_scale().data(), F32Bits({0x40000000}));
}

TEST_F(VerifyRequestTest, Fp8NpyWithoutDTypeIsAnErrorNamingTheFlagToPass) {
  EXPECT_THAT(
      Build({"verify", "--input", x_, "--weight", w_, "--input-scale", "1", "--weight-scale", "1"}),
      StatusIs(kInvalid, AllOf(HasSubstr("--input: "), HasSubstr("FP8 bit patterns"),
                               HasSubstr("--dtype NAME=fp8e4m3"))));
}

TEST_F(VerifyRequestTest, MixedFp8FormatsReadEachByItsDType) {
  const std::string w = Write("w5.npy", Npy("|u1", "(4, 3)", kWeightE5m2));
  auto req = Build({"verify", "--input", x_, "--weight", w, "--dtype", "input=fp8e4m3", "--dtype",
                    "weight=float8_e5m2", "--input-scale", "1", "--weight-scale", "1"});
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->op().input().dtype(), pb::DTYPE_FLOAT8_E4M3FN);
  EXPECT_EQ(req->op().weight().dtype(), pb::DTYPE_FLOAT8_E5M2);
  EXPECT_EQ(req->op().weight().data(), kWeightE5m2);
}

TEST_F(VerifyRequestTest, Fp8SafetensorsOperandsNeedNoDType) {
  const std::string st = Write("m.safetensors", St("fc.weight", "F8_E5M2", "[4, 3]", kWeightE5m2));
  auto req = Build({"verify", "--input", x_, "--dtype", "input=e4m3", "--weight", st + ":fc.weight",
                    "--input-scale", "1", "--weight-scale", "1"});
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->op().weight().dtype(), pb::DTYPE_FLOAT8_E5M2);
  EXPECT_EQ(req->op().weight().data(), kWeightE5m2);
}

TEST_F(VerifyRequestTest, RowWiseScaleFilesLandAsFloat32WithTheirShapes) {
  // Input rows: 0.5, 0.25; weight rows [N, 1]: 2, 0.5, 0.25, 0.0125.
  const std::string xs_bits = F32Bits({0x3f000000, 0x3e800000});
  const std::string ws_bits = F32Bits({0x40000000, 0x3f000000, 0x3e800000, 0x3c4ccccd});
  const std::string xs = Write("xs.npy", Npy("<f4", "(2,)", xs_bits));
  const std::string ws = Write("s.safetensors", St("fc.weight_scale", "F32", "[4, 1]", ws_bits));
  auto req =
      Build(Plus(Fp8Flags(), {"--input-scale", xs, "--weight-scale", ws + ":fc.weight_scale"}));
  ASSERT_THAT(req, IsOk());
  const pb::LinearOp& op = req->op();
  EXPECT_EQ(op.input_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(op.input_scale().shape(), ElementsAre(2));
  EXPECT_EQ(op.input_scale().data(), xs_bits);
  EXPECT_EQ(op.weight_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(op.weight_scale().shape(), ElementsAre(4, 1));
  EXPECT_EQ(op.weight_scale().data(), ws_bits);
}

TEST_F(VerifyRequestTest, ScaleDigestArgumentGoesByDigest) {
  const std::string hex(64, 'a');
  auto req = Build(Plus(Fp8Flags(), {"--input-scale", "sha256:" + hex + ":fp32:2", "--weight-scale",
                                     "sha256:" + hex + ":float32:"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->op().input_scale().digest(), "sha256:" + hex);
  EXPECT_EQ(req->op().input_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(req->op().input_scale().shape(), ElementsAre(2));
  EXPECT_THAT(req->op().weight_scale().shape(), IsEmpty());
  EXPECT_THAT(Build(Plus(Fp8Flags(),
                         {"--input-scale", "1", "--weight-scale", "sha256:" + hex + ":bf16:4"})),
              StatusIs(kInvalid, AllOf(HasSubstr("--weight-scale: the digest argument says bf16"),
                                       HasSubstr("float32"))));
}

TEST_F(VerifyRequestTest, LargeScaleIsHeldForTheStoreUnderItsField) {
  const int64_t m = 300'000;  // 1.2 MB of float32, above kInlineMaxBytes
  const std::string bits(static_cast<size_t>(m) * 4, '\x3f');
  const std::string xs = Write("big.npy", Npy("<f4", "(300000,)", bits));
  std::vector<HeldTensor> held;
  auto req = Build(Plus(Fp8Flags(), {"--input-scale", xs, "--weight-scale", "1"}), &held);
  ASSERT_THAT(req, IsOk());
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].field, "op.input_scale");
  EXPECT_EQ(held[0].tensor.bytes(), bits);
  EXPECT_THAT(req->op().input_scale().shape(), ElementsAre(m));
  EXPECT_EQ(req->op().input_scale().source_case(), pb::Tensor::SOURCE_NOT_SET);
}

TEST_F(VerifyRequestTest, ScaleThatIsNeitherANumberNorATensorIsAnErrorNamingTheFlag) {
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "abc", "--weight-scale", "1"})),
              StatusIs(kInvalid, AllOf(HasSubstr("--input-scale: a number"), HasSubstr("FILE.npy"),
                                       HasSubstr("'abc'"))));
  for (const char* bad : {"0", "-0.5", "nan", "inf", "1e39"}) {
    EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", bad})),
                StatusIs(kInvalid, HasSubstr("--weight-scale: a finite, positive float32 scale")))
        << bad;
  }
  // Non-zero, but below float32's smallest subnormal (2^-149 ~ 1.4e-45).
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "1e-60", "--weight-scale", "1"})),
              StatusIs(kInvalid, HasSubstr("(0 in float32)")));
}

TEST_F(VerifyRequestTest, ScaleFileOfAnotherDTypeIsAnErrorNamingTheFlag) {
  // bf16 1.0 = 0x3f80 as '<u2' bits; fp16 1.0 = 0x3c00 as '<f2'.
  const std::string bf16 = Write("s16.npy", Npy("<u2", "(1,)", Le(0x3f80, 2)));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", bf16})),
              StatusIs(kInvalid, AllOf(HasSubstr("--weight-scale: "), HasSubstr("s16.npy"),
                                       HasSubstr("float32 expected (scales are float32"),
                                       HasSubstr("'<u2'"))));
  const std::string f16 = Write("h.npy", Npy("<f2", "(1,)", Le(0x3c00, 2)));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", f16, "--weight-scale", "1"})),
              StatusIs(kInvalid, AllOf(HasSubstr("--input-scale: "), HasSubstr("float32 expected"),
                                       HasSubstr("'<f2'"))));
  const std::string st = Write("b.safetensors", St("s", "BF16", "[1]", Le(0x3f80, 2)));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", st + ":s", "--weight-scale", "1"})),
              StatusIs(kInvalid, AllOf(HasSubstr("--input-scale: "), HasSubstr("float32 expected"),
                                       HasSubstr("BF16"))));
}

// NVFP4: FP4 operands as .npy files of packed bytes (two E2M1 codes each,
// element 2i in the low nibble, the file's last dimension half the
// tensor's), float8_e4m3fn block scales [M, K/16] and [N, K/16], and the
// float32 global scales. K = 16: the input [2, 16] is 2 x 8 bytes, the
// weight [3, 16] 3 x 8. e4m3fn block scales by hand: 1.0 = 0.0111.000
// (0x38), 2.0 = 0.1000.000 (0x40), 0.5 = 0.0110.000 (0x30).
TEST_F(VerifyRequestTest, Nvfp4OperandsBlockScalesAndGlobalScalesLandAsTheServerReadsThem) {
  std::string xq, wq;
  for (int i = 0; i < 16; ++i) xq.push_back(static_cast<char>((i * 37 + 5) & 0xff));
  for (int i = 0; i < 24; ++i) wq.push_back(static_cast<char>((i * 53 + 11) & 0xff));
  const std::string x = Write("x4.npy", Npy("|u1", "(2, 8)", xq));
  const std::string w = Write("w4.safetensors", St("fc.weight", "F4", "[3, 16]", wq));
  const std::string xs = Write("xs.npy", Npy("|u1", "(2, 1)", Bytes({0x38, 0x40})));
  const std::string ws = Write(
      "ws.safetensors", St("fc.weight_scale", "F8_E4M3", "[3, 1]", Bytes({0x30, 0x38, 0x40})));
  const std::string wg = Write("wg.npy", Npy("<f4", "(1,)", F32Bits({0x3e800000})));  // 0.25
  auto req =
      Build({"verify", "--input", x, "--weight", w + ":fc.weight", "--dtype", "input=fp4e2m1",
             "--input-scale", xs, "--dtype", "input-scale=fp8e4m3", "--weight-scale",
             ws + ":fc.weight_scale", "--input-global-scale", "0.5", "--weight-global-scale", wg});
  ASSERT_THAT(req, IsOk());
  const pb::LinearOp& op = req->op();
  EXPECT_EQ(op.input().dtype(), pb::DTYPE_FLOAT4_E2M1FN);
  EXPECT_THAT(op.input().shape(), ElementsAre(2, 16));
  EXPECT_EQ(op.input().data(), xq);
  EXPECT_EQ(op.weight().dtype(), pb::DTYPE_FLOAT4_E2M1FN);
  EXPECT_THAT(op.weight().shape(), ElementsAre(3, 16));
  EXPECT_EQ(op.weight().data(), wq);
  EXPECT_EQ(op.input_scale().dtype(), pb::DTYPE_FLOAT8_E4M3FN);
  EXPECT_THAT(op.input_scale().shape(), ElementsAre(2, 1));
  EXPECT_EQ(op.input_scale().data(), Bytes({0x38, 0x40}));
  EXPECT_EQ(op.weight_scale().dtype(), pb::DTYPE_FLOAT8_E4M3FN);
  EXPECT_EQ(op.weight_scale().data(), Bytes({0x30, 0x38, 0x40}));
  EXPECT_EQ(op.input_global_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(op.input_global_scale().shape(), IsEmpty());
  EXPECT_EQ(op.input_global_scale().data(), F32Bits({0x3f000000}));
  EXPECT_EQ(op.weight_global_scale().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(op.weight_global_scale().shape(), ElementsAre(1));
  EXPECT_EQ(op.weight_global_scale().data(), F32Bits({0x3e800000}));
}

// MXFP8: float8_e8m0fnu block scales [M, K/32] from a '|u1' .npy named by
// --dtype, or from safetensors' F8_E8M0 (UE8M0 by hand: 127 = 1.0, 128 =
// 2.0, 126 = 0.5).
TEST_F(VerifyRequestTest, Mxfp8E8m0BlockScalesLandAsTheirBytes) {
  const std::string xs = Write("xs8.npy", Npy("|u1", "(2, 1)", Bytes({127, 128})));
  const std::string ws =
      Write("ws8.safetensors", St("s", "F8_E8M0", "[4, 1]", Bytes({126, 127, 128, 129})));
  auto req = Build(Plus(Fp8Flags(), {"--input-scale", xs, "--dtype", "input-scale=e8m0",
                                     "--weight-scale", ws + ":s"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->op().input_scale().dtype(), pb::DTYPE_FLOAT8_E8M0FNU);
  EXPECT_EQ(req->op().input_scale().data(), Bytes({127, 128}));
  EXPECT_EQ(req->op().weight_scale().dtype(), pb::DTYPE_FLOAT8_E8M0FNU);
  EXPECT_THAT(req->op().weight_scale().shape(), ElementsAre(4, 1));
  EXPECT_EQ(req->op().weight_scale().data(), Bytes({126, 127, 128, 129}));
  EXPECT_FALSE(req->op().has_input_global_scale());
  EXPECT_FALSE(req->op().has_weight_global_scale());
  // Without --dtype, a '|u1' scale is refused as float32's is.
  EXPECT_THAT(
      Build(Plus(Fp8Flags(), {"--input-scale", xs, "--weight-scale", "1"})),
      StatusIs(kInvalid, AllOf(HasSubstr("--input-scale: "), HasSubstr("float32 expected"))));
  // --dtype for a scale that is not given.
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--dtype", "weight-scale=e8m0", "--input-scale", "1"})),
              StatusIs(kInvalid, HasSubstr("--dtype weight-scale=... without --weight-scale")));
}

TEST_F(VerifyRequestTest, GlobalScaleThatIsNotAFinitePositiveNumberIsAnErrorNamingTheFlag) {
  for (const char* flag : {"--input-global-scale", "--weight-global-scale"}) {
    for (const char* bad : {"0", "-1", "nan", "inf", "1e39"}) {
      EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", "1", flag, bad})),
                  StatusIs(kInvalid, absl::StrCat(flag,
                                                  ": a finite, positive float32 "
                                                  "scale expected, got '",
                                                  bad, "'")))
          << flag << " " << bad;
    }
    EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", "1", flag, "x"})),
                StatusIs(kInvalid, HasSubstr(absl::StrCat(flag, ": a number"))));
  }
  // A global scale file is float32, whatever --dtype says of the block scales.
  const std::string e4 = Write("g.npy", Npy("|u1", "(1,)", Bytes({0x38})));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", "1",
                                      "--input-global-scale", e4})),
              StatusIs(kInvalid,
                       AllOf(HasSubstr("--input-global-scale: "), HasSubstr("float32 expected"))));
}

TEST_F(VerifyRequestTest, Fp8OperandsWithoutAScaleNameTheMissingFlag) {
  EXPECT_THAT(Build(Fp8Flags()), StatusIs(kInvalid, HasSubstr("--input-scale is required")));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--input-scale", "0.5"})),
              StatusIs(kInvalid,
                       AllOf(HasSubstr("--weight-scale is required"), HasSubstr("float8_e4m3fn"))));
}

TEST_F(VerifyRequestTest, Fp8ConfigOptionsKeepTheirCommas) {
  auto req = Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", "1", "--config",
                                     "cpu:fp8e4m3:fused@scaling=tensor,fast_accum,cpu:fp64",
                                     "--config", "cpu:fp8e4m3:none@scaling=tensor"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_THAT(req->configs(), ElementsAre("cpu:fp8e4m3:fused@scaling=tensor,fast_accum", "cpu:fp64",
                                          "cpu:fp8e4m3:none@scaling=tensor"));
}

TEST_F(VerifyRequestTest, AlgorithmSweepAndBatchInvarianceLandInTheRequest) {
  auto req = Build(
      Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", "1", "--algorithm-sweep", "3",
                        "--batch-invariance", "--batch-sizes", "4,16", "--batch-sizes", "2"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->algorithm_sweep(), 3);
  EXPECT_TRUE(req->batch_invariance().enabled());
  EXPECT_THAT(req->batch_invariance().batch_sizes(), ElementsAre(4, 16, 2));
}

TEST_F(VerifyRequestTest, NoBatchInvarianceFlagLeavesItUnset) {
  auto req = Build(Plus(Fp8Flags(), {"--input-scale", "1", "--weight-scale", "1"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->algorithm_sweep(), 0);
  EXPECT_FALSE(req->has_batch_invariance());
}

TEST_F(VerifyRequestTest, BatchSizesWithoutBatchInvarianceIsAnErrorNamingTheFlag) {
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--batch-sizes", "4"})),
              StatusIs(kInvalid, HasSubstr("--batch-sizes applies only with --batch-invariance")));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--batch-invariance", "--batch-sizes", "4,x"})),
              StatusIs(kInvalid, HasSubstr("--batch-sizes")));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--batch-invariance", "--batch-sizes", "0"})),
              StatusIs(kInvalid, HasSubstr("--batch-sizes")));
  EXPECT_THAT(Build(Plus(Fp8Flags(), {"--algorithm-sweep", "17"})),
              StatusIs(kInvalid, HasSubstr("--algorithm-sweep")));
  EXPECT_THAT(Parse({"sweep", "--batch-invariance"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --batch-invariance for 'sweep'")));
}

TEST_F(VerifyRequestTest, ScaleFlagsBelongToVerifyAndDiagnoseOnly) {
  EXPECT_THAT(Parse({"sweep", "--input-scale", "1"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --input-scale for 'sweep'")));
  EXPECT_THAT(Parse({"upload", "--weight-scale", "1"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --weight-scale for 'upload'")));
  EXPECT_THAT(Parse({"diagnose", "--input-scale", "1", "--weight-scale", "2"}), IsOk());
  EXPECT_THAT(Parse({"compare", "--input-global-scale", "1", "--weight-global-scale", "2"}),
              IsOk());
  EXPECT_THAT(Parse({"sweep", "--input-global-scale", "1"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --input-global-scale for 'sweep'")));
}

// ---- --accept, diagnose's candidates, compare (float32 files: x [2, 3],
// w [4, 3], two outputs [2, 4]).

class LayerFilesTest : public VerifyRequestTest {
 protected:
  void SetUp() override {
    VerifyRequestTest::SetUp();
    fx_ = Write("fx.npy", Npy("<f4", "(2, 3)", std::string(24, '\0')));
    fw_ = Write("fw.npy", Npy("<f4", "(4, 3)", std::string(48, '\0')));
    torch_ = Write("torch_y.npy", Npy("<f4", "(2, 4)", F32Bits({0x3f800000, 0, 0, 0, 0, 0, 0, 0})));
    flax_ = Write("flax_y.npy", Npy("<f4", "(2, 4)", F32Bits({0x40000000, 0, 0, 0, 0, 0, 0, 0})));
  }
  std::vector<std::string> Layer(const char* command) const {
    return {command, "--input", fx_, "--weight", fw_};
  }
  static absl::StatusOr<pb::CompareRequest> BuildCompare(const std::vector<std::string>& flags) {
    auto cl = Parse(flags);
    if (!cl.ok()) return cl.status();
    return BuildCompareRequest(*cl);
  }
  std::string fx_, fw_, torch_, flax_;
};

TEST_F(LayerFilesTest, AcceptIsRepeatableAndLandsInTheRequest) {
  for (const char* command : {"verify", "diagnose"}) {
    auto req = Build(Plus(Layer(command), {"--observed", torch_, "--accept", "tf32", "--accept",
                                           "cpu:bf16:unfused,fp32"}));
    ASSERT_THAT(req, IsOk()) << command;
    EXPECT_THAT(req->accept(), ElementsAre("tf32", "cpu:bf16:unfused", "fp32")) << command;
  }
  EXPECT_THAT(Build(Plus(Layer("verify"), {"--accept", "tf32"})),
              StatusIs(kInvalid, HasSubstr("--accept needs --observed")));
  EXPECT_THAT(Build(Plus(Layer("verify"), {"--observed", torch_, "--accept", ","})),
              StatusIs(kInvalid, HasSubstr("--accept: a configuration")));
  EXPECT_THAT(Parse({"sweep", "--accept", "tf32"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --accept for 'sweep'")));
}

// --gpu is sent as given (the server judges the name, case-insensitively),
// on verify and diagnose only; absent, the field stays empty.
TEST_F(LayerFilesTest, GpuLandsInTheRequestAsGiven) {
  for (const char* command : {"verify", "diagnose"}) {
    auto req = Build(Plus(Layer(command), {"--observed", torch_, "--gpu", "H100"}));
    ASSERT_THAT(req, IsOk()) << command;
    EXPECT_EQ(req->gpu(), "H100") << command;
  }
  auto unknown = Build(Plus(Layer("diagnose"), {"--observed", torch_, "--gpu=tpu"}));
  ASSERT_THAT(unknown, IsOk());
  EXPECT_EQ(unknown->gpu(), "tpu");
  auto none = Build(Plus(Layer("diagnose"), {"--observed", torch_}));
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->gpu(), "");
  EXPECT_THAT(Build(Plus(Layer("diagnose"), {"--observed", torch_, "--gpu", ""})),
              StatusIs(kInvalid, HasSubstr("--gpu: a GPU")));
  EXPECT_THAT(Parse({"diagnose", "--gpu"}), StatusIs(kInvalid, HasSubstr("--gpu needs a value")));
  for (const char* command : {"sweep", "compare"}) {
    EXPECT_THAT(Parse({command, "--gpu", "h100"}),
                StatusIs(kInvalid, HasSubstr(absl::StrCat("unknown flag --gpu for '", command))))
        << command;
  }
}

TEST_F(LayerFilesTest, DiagnoseCandidatesAreConfigAndItsOlderNameCandidates) {
  auto req = Build(Plus(Layer("diagnose"), {"--observed", torch_, "--config", "cpu:fp32",
                                            "--candidates", "cpu:tf32:unfused,cpu:bf16"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_THAT(req->configs(), ElementsAre("cpu:fp32", "cpu:tf32:unfused", "cpu:bf16"));
  // A bad one is named by --config, the one documented name.
  EXPECT_THAT(Build(Plus(Layer("diagnose"), {"--observed", torch_, "--candidates", "cpu:fp33"})),
              StatusIs(kInvalid, HasSubstr("--config")));
  EXPECT_THAT(Parse({"verify", "--candidates", "cpu:fp32"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --candidates for 'verify'")));
}

TEST_F(LayerFilesTest, VerboseAndTargetAreFlags) {
  EXPECT_THAT(Parse({"diagnose", "--verbose"}), IsOk());
  EXPECT_THAT(Parse({"compare", "--verbose"}), IsOk());
  EXPECT_THAT(Parse({"--target", "h:1", "capabilities"}), IsOk());
  EXPECT_THAT(Parse({"sweep", "--verbose"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --verbose for 'sweep'")));
  EXPECT_THAT(Parse({"compare", "--tolerance", "bound"}),
              StatusIs(kInvalid, HasSubstr("unknown flag --tolerance for 'compare'")));
}

TEST_F(LayerFilesTest, CompareNamesOutputsByStemOrNameAndSendsBoth) {
  auto req = BuildCompare(Plus(Layer("compare"), {"--observed", torch_, "--observed", flax_,
                                                  "--config", "cpu:fp32", "--accept", "tf32"}));
  ASSERT_THAT(req, IsOk());
  ASSERT_EQ(req->observed_size(), 2);
  EXPECT_EQ(req->observed(0).name(), "torch_y");
  EXPECT_EQ(req->observed(1).name(), "flax_y");
  EXPECT_EQ(req->observed(0).tensor().data(), F32Bits({0x3f800000, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(req->observed(1).tensor().data(), F32Bits({0x40000000, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_THAT(req->observed(1).tensor().shape(), ElementsAre(2, 4));
  EXPECT_THAT(req->configs(), ElementsAre("cpu:fp32"));
  EXPECT_THAT(req->accept(), ElementsAre("tf32"));
  EXPECT_EQ(req->op().weight().dtype(), pb::DTYPE_FLOAT32);

  req = BuildCompare(
      Plus(Layer("compare"), {"--observed", "torch=" + torch_, "--observed", "flax=" + flax_}));
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->observed(0).name(), "torch");
  EXPECT_EQ(req->observed(1).name(), "flax");
}

TEST_F(LayerFilesTest, CompareNeedsExactlyTwoDistinctlyNamedOutputs) {
  EXPECT_THAT(BuildCompare(Plus(Layer("compare"), {"--observed", torch_})),
              StatusIs(kInvalid, HasSubstr("exactly two --observed outputs")));
  EXPECT_THAT(BuildCompare(Plus(Layer("compare"),
                                {"--observed", torch_, "--observed", flax_, "--observed", torch_})),
              StatusIs(kInvalid, HasSubstr("got 3")));
  EXPECT_THAT(BuildCompare(Plus(Layer("compare"), {"--observed", torch_, "--observed", torch_})),
              StatusIs(kInvalid, HasSubstr("both outputs are called 'torch_y'")));
  EXPECT_THAT(BuildCompare(Plus(Layer("compare"), {"--observed", torch_, "--observed",
                                                   "sha256:" + std::string(64, 'a') + ":f32:2x4"})),
              StatusIs(kInvalid, HasSubstr("write NAME=sha256:")));
}

TEST_F(LayerFilesTest, CompareDTypeByOutputName) {
  // bf16 bits in a <u2 file, named by --dtype flax=bf16.
  const std::string bf = Write("flax_bf16.npy", Npy("<u2", "(2, 4)", std::string(16, '\0')));
  auto req = BuildCompare(Plus(Layer("compare"), {"--observed", torch_, "--observed", "flax=" + bf,
                                                  "--dtype", "flax=bf16"}));
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->observed(1).tensor().dtype(), pb::DTYPE_BFLOAT16);
  EXPECT_EQ(req->observed(0).tensor().dtype(), pb::DTYPE_FLOAT32);
  EXPECT_THAT(
      BuildCompare(Plus(Layer("compare"), {"--observed", torch_, "--observed", "flax=" + bf})),
      StatusIs(kInvalid, HasSubstr("--dtype NAME=bf16")));
  EXPECT_THAT(BuildCompare(Plus(Layer("compare"), {"--observed", torch_, "--observed", flax_,
                                                   "--dtype", "jax=bf16"})),
              StatusIs(kInvalid, HasSubstr("torch_y, flax_y")));
}

TEST(ObservedNameAndFileTest, StemsSafetensorsNamesAndExplicitNames) {
  EXPECT_EQ(*ObservedNameAndFile("out/torch_y.npy"),
            std::make_pair(std::string("torch_y"), std::string("out/torch_y.npy")));
  EXPECT_EQ(*ObservedNameAndFile("caps.safetensors:flax.out"),
            std::make_pair(std::string("flax.out"), std::string("caps.safetensors:flax.out")));
  EXPECT_EQ(*ObservedNameAndFile("jax=dir/a=b.npy"),
            std::make_pair(std::string("jax"), std::string("dir/a=b.npy")));
  // What precedes '=' in a path is no name, and a stem that cannot be one
  // asks for NAME=.
  EXPECT_THAT(ObservedNameAndFile("dir/a=b.npy"),
              StatusIs(kInvalid, HasSubstr("'a=b' cannot name the output")));
}

}  // namespace
}  // namespace tensorcheck::cli::internal
