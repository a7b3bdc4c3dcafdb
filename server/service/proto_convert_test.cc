// proto <-> core conversions on their own (no server): what each field
// becomes, and the error that names it.
#include "server/service/proto_convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace tensorcheck {
namespace {

using ::tensorcheck::testing::IsOk;
using ::tensorcheck::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::Tensor Fp32(std::vector<int64_t> shape, std::vector<float> values) {
  v1::Tensor t;
  t.set_dtype(v1::DTYPE_FLOAT32);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4));
  return t;
}

TEST(ProtoConvertTest, TensorKeepsDtypeShapeAndBytes) {
  auto t = TensorFromProto(Fp32({2, 2}, {1.5f, -2.0f, 0.25f, 8.0f}), "op.input", RequestLimits{});
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  EXPECT_THAT(t->shape(), ElementsAre(2, 2));
  EXPECT_EQ(t->GetDouble(1), -2.0);
  EXPECT_EQ(t->GetDouble(3), 8.0);
  v1::Tensor back;
  TensorToProto(*t, &back);
  EXPECT_EQ(back.data(), Fp32({2, 2}, {1.5f, -2.0f, 0.25f, 8.0f}).data());
  EXPECT_THAT(back.shape(), ElementsAre(2, 2));
}

TEST(ProtoConvertTest, ShortDataNamesTheFieldAndBothCounts) {
  v1::Tensor t = Fp32({2, 3}, {1, 2, 3, 4, 5});
  EXPECT_THAT(
      TensorFromProto(t, "op.weight", RequestLimits{}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.weight.data: 24 bytes expected")));
}

TEST(ProtoConvertTest, UnknownDtypeNamesTheField) {
  v1::Tensor t = Fp32({1}, {1});
  t.set_dtype(static_cast<v1::DType>(99));
  EXPECT_THAT(TensorFromProto(t, "observed", RequestLimits{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("observed.dtype")));
}

TEST(ProtoConvertTest, TensorOverTheLimitIsRefusedBeforeAllocating) {
  RequestLimits limits;
  limits.max_tensor_bytes = 16;  // four fp32 values
  v1::Tensor t = Fp32({5}, {1, 2, 3, 4, 5});
  EXPECT_THAT(TensorFromProto(t, "op.input", limits),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("op.input: 20 bytes")));
  EXPECT_THAT(TensorFromProto(Fp32({4}, {1, 2, 3, 4}), "op.input", limits), IsOk());
}

// A shape that does not describe the payload is the error, whatever its
// size: a huge declared shape with a tiny payload is INVALID_ARGUMENT.
TEST(ProtoConvertTest, ShapeNotDescribingTheDataIsInvalidArgumentAtAnySize) {
  RequestLimits limits;
  limits.max_tensor_bytes = 16;
  for (int64_t declared : {int64_t{5}, int64_t{1} << 20, int64_t{1} << 61}) {
    v1::Tensor t;
    t.set_dtype(v1::DTYPE_FLOAT32);
    t.add_shape(declared);
    t.set_data(std::string(16, '\0'));
    EXPECT_THAT(TensorFromProto(t, "op.input", limits),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.input")))
        << declared;
  }
}

TEST(ProtoConvertTest, RequestFieldsBecomeTheLinearRequest) {
  v1::VerifyRequest r;
  *r.mutable_op()->mutable_input() = Fp32({1, 2}, {1, 2});
  *r.mutable_op()->mutable_weight() = Fp32({2, 3}, {1, 2, 3, 4, 5, 6});
  r.mutable_op()->set_weight_layout(v1::WEIGHT_LAYOUT_IN_OUT);
  r.mutable_op()->set_activation(v1::ACTIVATION_RELU);
  r.add_configs("cpu:tf32:unfused");
  r.set_reference("cpu:fp64");
  auto req = FromProto(r, RequestLimits{});
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->layout, WeightLayout::kInOut);
  EXPECT_EQ(req->activation, Activation::kRelu);
  EXPECT_THAT(req->configs, ElementsAre("cpu:tf32:unfused"));
  EXPECT_EQ(req->reference, "cpu:fp64");
  EXPECT_FALSE(req->bias.has_value());
}

TEST(ProtoConvertTest, TooManyConfigurationsUseTheLimitsGiven) {
  v1::VerifyRequest r;
  *r.mutable_op()->mutable_input() = Fp32({1, 1}, {1});
  *r.mutable_op()->mutable_weight() = Fp32({1, 1}, {1});
  for (int i = 0; i < 3; ++i) r.add_configs("cpu:fp32");
  RequestLimits limits;
  limits.max_configs = 2;
  EXPECT_THAT(FromProto(r, limits),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("configs: at most 2")));
}

TEST(ProtoConvertTest, MissingWeightNamesTheField) {
  v1::VerifyRequest r;
  *r.mutable_op()->mutable_input() = Fp32({1, 1}, {1});
  EXPECT_THAT(FromProto(r, RequestLimits{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("op.weight")));
}

TEST(ProtoConvertTest, BoundThresholdIsPositiveAndFiniteOrNamedInTheError) {
  v1::VerifyRequest r;
  *r.mutable_op()->mutable_input() = Fp32({1, 1}, {1});
  *r.mutable_op()->mutable_weight() = Fp32({1, 1}, {1});
  auto unset = FromProto(r, RequestLimits{});
  ASSERT_THAT(unset, IsOk());
  EXPECT_FALSE(unset->bound_threshold.has_value());
  r.mutable_bound_threshold()->set_value(10);
  auto ten = FromProto(r, RequestLimits{});
  ASSERT_THAT(ten, IsOk());
  EXPECT_EQ(ten->bound_threshold, 10.0);
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    r.mutable_bound_threshold()->set_value(bad);
    EXPECT_THAT(FromProto(r, RequestLimits{}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bound_threshold")))
        << bad;
  }
}

TEST(ProtoConvertTest, TheCallDecisionReachesTheResponse) {
  VerifyOutcome outcome;
  outcome.call.explained = true;
  outcome.call.explaining = {"cpu:bf16:none", "cpu:bf16:fused"};
  outcome.call.divergence = "no candidate explains its output";
  outcome.call.bound_threshold = 4;
  outcome.call.bound_exceeded = true;
  outcome.call.bound_reason = "bound_ratio 7.2 exceeds 4";
  v1::VerifyResponse p;
  ToProto(outcome, &p);
  EXPECT_TRUE(p.call().explained());
  EXPECT_THAT(p.call().explaining(), ElementsAre("cpu:bf16:none", "cpu:bf16:fused"));
  EXPECT_EQ(p.call().divergence(), "no candidate explains its output");
  EXPECT_EQ(p.call().bound_threshold(), 4);
  EXPECT_TRUE(p.call().bound_exceeded());
  EXPECT_EQ(p.call().bound_reason(), "bound_ratio 7.2 exceeds 4");
}

TEST(ProtoConvertTest, RankingEvidenceAndSharedComputationReachTheResponse) {
  VerifyOutcome outcome;
  outcome.output_shape = {2, 3};
  ConfigOutcome c;
  c.config = "cpu:tf32:fused";
  c.shared_computation = "cpu:fp32:fused";
  outcome.results.push_back(std::move(c));
  DiagnosisOutcome d;
  d.best = "cpu:bf16:unfused";
  RankedCandidate r;
  r.config = "cpu:fp64:unfused";
  r.disagreements = 187;
  r.expected_disagreements = 5.6e-6;
  r.plausibility_p = 0;
  r.plausible = false;
  r.consistent_fraction = 0.999;
  r.compared_elements = 5901312;
  r.ruled_out = "its accumulation is more precise";
  r.shared_computation = "cpu:fp64:fused";
  d.ranking.push_back(r);
  outcome.diagnosis = d;
  v1::VerifyResponse response;
  ToProto(outcome, &response);
  ASSERT_EQ(response.results_size(), 1);
  EXPECT_EQ(response.results(0).shared_computation(), "cpu:fp32:fused");
  ASSERT_EQ(response.diagnosis().ranking_size(), 1);
  const v1::RankedCandidate& p = response.diagnosis().ranking(0);
  EXPECT_EQ(p.disagreements(), 187);
  EXPECT_EQ(p.expected_disagreements(), 5.6e-6);
  EXPECT_FALSE(p.plausible());
  EXPECT_EQ(p.consistent_fraction(), 0.999);
  EXPECT_EQ(p.compared_elements(), 5901312);
  EXPECT_EQ(p.ruled_out(), "its accumulation is more precise");
  EXPECT_EQ(p.shared_computation(), "cpu:fp64:fused");
  EXPECT_EQ(response.diagnosis().best(), "cpu:bf16:unfused");
}

TEST(ProtoConvertTest, SweepAndBatchInvarianceTravelBothWays) {
  v1::VerifyRequest r;
  *r.mutable_op()->mutable_input() = Fp32({1, 1}, {1});
  *r.mutable_op()->mutable_weight() = Fp32({1, 1}, {1});
  r.set_algorithm_sweep(5);
  r.mutable_batch_invariance()->set_enabled(true);
  r.mutable_batch_invariance()->add_batch_sizes(4);
  r.mutable_batch_invariance()->add_batch_sizes(2);
  auto req = FromProto(r, RequestLimits{});
  ASSERT_THAT(req, IsOk());
  EXPECT_EQ(req->algorithm_sweep, 5);
  EXPECT_TRUE(req->batch_invariance);
  EXPECT_THAT(req->batch_sizes, ElementsAre(4, 2));

  VerifyOutcome outcome;
  outcome.output_shape = {7, 3};
  ConfigOutcome c;
  c.config = "cublaslt:fp32:fused@algo=2";
  BatchInvarianceOutcome b;
  b.invariant = false;
  b.rows = 7;
  b.rows_differing = 3;
  b.max_ulp = 12;
  b.full_batch_details = {{"algo", "21"}};
  SubBatchOutcome sub;
  sub.batch_size = 5;
  sub.runs = 2;
  sub.rows_differing = 3;
  sub.max_ulp = 12;
  sub.details = {{"algo", "21"}};
  sub.tail_rows = 2;
  sub.tail_details = {{"algo", "6"}};
  b.sub_batches.push_back(sub);
  c.batch_invariance = b;
  outcome.results.push_back(std::move(c));
  DiagnosisOutcome d;
  RankedCandidate ranked;
  ranked.config = "cublaslt:fp32:fused@algo=2";
  ranked.exact = true;
  ranked.details = {{"algo_splitk", "4"}};
  d.ranking.push_back(ranked);
  outcome.diagnosis = d;
  v1::VerifyResponse response;
  ToProto(outcome, &response);
  const v1::BatchInvariance& pb = response.results(0).batch_invariance();
  EXPECT_FALSE(pb.invariant());
  EXPECT_EQ(pb.rows(), 7);
  EXPECT_EQ(pb.rows_differing(), 3);
  EXPECT_EQ(pb.max_ulp(), 12u);
  EXPECT_EQ(pb.full_batch_details().at("algo"), "21");
  ASSERT_EQ(pb.sub_batches_size(), 1);
  EXPECT_EQ(pb.sub_batches(0).batch_size(), 5);
  EXPECT_EQ(pb.sub_batches(0).runs(), 2);
  EXPECT_EQ(pb.sub_batches(0).tail_rows(), 2);
  EXPECT_EQ(pb.sub_batches(0).tail_details().at("algo"), "6");
  EXPECT_TRUE(response.diagnosis().ranking(0).exact());
  EXPECT_EQ(response.diagnosis().ranking(0).details().at("algo_splitk"), "4");
  // Without the option, no batch report.
  EXPECT_FALSE(response.reference().has_batch_invariance());
}

}  // namespace
}  // namespace tensorcheck
