// The tensor store's RPCs end to end in-process (docs/api.md): a server on
// a loopback port with a small store, driven through the generated stub.
// Every bad upload of the contract's error table gets its code, and the
// server keeps serving; tensors by digest give the same answers as inline
// ones; missing digests come back with a machine-readable detail.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/digest.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/grpcpp.h"
#include "server/service/server.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck {
namespace {

using ::testing::HasSubstr;

// The most an upload message may carry, and what the server sends.
constexpr int64_t kChunk = 4 << 20;
constexpr int64_t kReadChunk = (4 << 20) - 1024;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// n fp32 values of a normal distribution, as bytes.
std::string Floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::string s(n * 4, '\0');
  for (size_t i = 0; i < n; ++i) {
    const float f = dist(rng);
    std::memcpy(&s[i * 4], &f, 4);
  }
  return s;
}

v1::TensorDigest DigestProto(const std::string& bytes) {
  const Digest d = DigestOf(bytes);
  v1::TensorDigest p;
  p.set_hash(d.ToString());
  p.set_size_bytes(d.size);
  return p;
}

class StoreCallsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.workers = 2;
    options.store_bytes = 48 << 20;
    options.max_stored_tensor_bytes = 40 << 20;
    options.partial_upload_ttl = absl::Seconds(1);
    options.inline_output_bytes = 1 << 20;
    options.upload_idle = absl::Seconds(2);
    auto server = TensorCheckServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(server).value().release();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    channel_ =
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args);
  }
  static void TearDownTestSuite() {
    channel_.reset();
    server_->Shutdown(absl::Seconds(5));
    server_->Wait();
    delete server_;
  }

  std::unique_ptr<v1::TensorCheck::Stub> Stub() { return v1::TensorCheck::NewStub(channel_); }

  // Sends `messages` as one UploadTensor stream; its status and answer.
  grpc::Status Send(const std::vector<v1::UploadTensorRequest>& messages,
                    v1::UploadTensorResponse* response, bool half_close = true,
                    grpc::ClientContext* context = nullptr) {
    grpc::ClientContext own;
    grpc::ClientContext* ctx = context != nullptr ? context : &own;
    auto stub = Stub();
    auto writer = stub->UploadTensor(ctx, response);
    for (const auto& m : messages) {
      if (!writer->Write(m)) break;  // the server finished early
    }
    if (half_close) writer->WritesDone();
    if (!half_close) ctx->TryCancel();
    return writer->Finish();
  }

  // The messages of an upload of `bytes` from `from`, in `chunk`s.
  static std::vector<v1::UploadTensorRequest> Messages(const std::string& bytes,
                                                       const std::string& id,
                                                       int64_t chunk = kChunk, int64_t from = 0) {
    std::vector<v1::UploadTensorRequest> out;
    v1::UploadTensorRequest first;
    *first.mutable_digest() = DigestProto(bytes);
    first.set_upload_id(id);
    first.set_offset(from);
    out.push_back(first);
    for (int64_t off = from; off < static_cast<int64_t>(bytes.size()); off += chunk) {
      v1::UploadTensorRequest m;
      m.set_offset(off);
      m.set_data(bytes.substr(static_cast<size_t>(off), static_cast<size_t>(chunk)));
      out.push_back(m);
    }
    return out;
  }

  grpc::Status Upload(const std::string& bytes, v1::UploadTensorResponse* response = nullptr) {
    v1::UploadTensorResponse own;
    return Send(Messages(bytes, "id-" + DigestOf(bytes).hash.substr(0, 8)),
                response != nullptr ? response : &own);
  }

  grpc::Status Read(const v1::TensorDigest& d, int64_t offset, int64_t limit, std::string* out,
                    int* chunks = nullptr) {
    auto stub = Stub();
    grpc::ClientContext ctx;
    v1::ReadTensorRequest r;
    *r.mutable_digest() = d;
    r.set_offset(offset);
    r.set_limit(limit);
    auto reader = stub->ReadTensor(&ctx, r);
    v1::ReadTensorResponse m;
    out->clear();
    int n = 0;
    while (reader->Read(&m)) {
      EXPECT_EQ(m.offset(), offset + static_cast<int64_t>(out->size()));
      EXPECT_LE(static_cast<int64_t>(m.data().size()), kReadChunk);
      // Within gRPC's default receive limit, framing included.
      EXPECT_LE(m.ByteSizeLong(), size_t{4} << 20);
      *out += m.data();
      ++n;
    }
    if (chunks != nullptr) *chunks = n;
    return reader->Finish();
  }

  // QueryUploadStatus's committed_size.
  int64_t Committed(const std::string& bytes, const std::string& id) {
    v1::QueryUploadStatusRequest q;
    *q.mutable_digest() = DigestProto(bytes);
    q.set_upload_id(id);
    v1::QueryUploadStatusResponse status;
    grpc::ClientContext ctx;
    EXPECT_TRUE(Stub()->QueryUploadStatus(&ctx, q, &status).ok());
    return status.committed_size();
  }

  v1::StoreInfo Store() {
    auto stub = Stub();
    grpc::ClientContext ctx;
    v1::GetCapabilitiesResponse caps;
    EXPECT_TRUE(stub->GetCapabilities(&ctx, {}, &caps).ok());
    return caps.store();
  }

  std::vector<v1::TensorDigest> Missing(const std::vector<v1::TensorDigest>& digests) {
    auto stub = Stub();
    grpc::ClientContext ctx;
    v1::FindMissingTensorsRequest r;
    for (const auto& d : digests) *r.add_digests() = d;
    v1::FindMissingTensorsResponse resp;
    EXPECT_TRUE(stub->FindMissingTensors(&ctx, r, &resp).ok());
    return {resp.missing_digests().begin(), resp.missing_digests().end()};
  }

  grpc::Status Verify(const v1::VerifyRequest& r, v1::VerifyResponse* resp) {
    auto stub = Stub();
    grpc::ClientContext ctx;
    return stub->Verify(&ctx, r, resp);
  }

  // A good upload still works (the server keeps serving).
  void ExpectStillServing() {
    const std::string b = RandomBytes(1000, 99);
    v1::UploadTensorResponse r;
    const grpc::Status s = Upload(b, &r);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }

  static TensorCheckServer* server_;
  static std::shared_ptr<grpc::Channel> channel_;
};

TensorCheckServer* StoreCallsTest::server_ = nullptr;
std::shared_ptr<grpc::Channel> StoreCallsTest::channel_;

TEST_F(StoreCallsTest, CapabilitiesDescribeTheStore) {
  const v1::StoreInfo s = Store();
  EXPECT_TRUE(s.present());
  EXPECT_EQ(s.budget_bytes(), 48 << 20);
  EXPECT_EQ(s.max_tensor_bytes(), 40 << 20);
  EXPECT_EQ(s.chunk_bytes(), kReadChunk);
  EXPECT_EQ(s.partial_upload_seconds(), 1);
  EXPECT_EQ(s.inline_output_bytes(), 1 << 20);
  EXPECT_FALSE(s.persistent());
}

TEST_F(StoreCallsTest, UploadThenReadRoundTripsEverySize) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4097}, size_t(kChunk), size_t(2 * kChunk + 3)}) {
    const std::string b = RandomBytes(n, static_cast<uint32_t>(n));
    v1::UploadTensorResponse r;
    const grpc::Status s = Upload(b, &r);
    ASSERT_TRUE(s.ok()) << n << ": " << s.error_message();
    EXPECT_EQ(r.committed_size(), static_cast<int64_t>(n));
    EXPECT_EQ(r.digest().hash(), DigestOf(b).ToString());
    std::string back;
    int chunks = 0;
    ASSERT_TRUE(Read(DigestProto(b), 0, 0, &back, &chunks).ok());
    EXPECT_EQ(back, b) << n;
    EXPECT_EQ(chunks, static_cast<int>((n + kReadChunk - 1) / kReadChunk));
    if (n > 10) {
      ASSERT_TRUE(Read(DigestProto(b), 3, 7, &back).ok());
      EXPECT_EQ(back, b.substr(3, 7));
    }
    EXPECT_TRUE(Missing({DigestProto(b)}).empty());
  }
}

TEST_F(StoreCallsTest, FindMissingListsOnlyWhatIsAbsentInOrder) {
  const std::string a = RandomBytes(100, 1), b = RandomBytes(100, 2), c = RandomBytes(100, 3);
  ASSERT_TRUE(Upload(b).ok());
  const auto missing = Missing({DigestProto(a), DigestProto(b), DigestProto(c)});
  ASSERT_EQ(missing.size(), 2u);
  EXPECT_EQ(missing[0].hash(), DigestOf(a).ToString());
  EXPECT_EQ(missing[1].hash(), DigestOf(c).ToString());
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::FindMissingTensorsRequest r;
  r.add_digests()->set_hash("sha256:XYZ");
  v1::FindMissingTensorsResponse resp;
  const grpc::Status s = stub->FindMissingTensors(&ctx, r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("digests[0]"));
}

TEST_F(StoreCallsTest, AnUploadOfATensorPresentEndsAtOnce) {
  const std::string b = RandomBytes(3 * kChunk, 5);
  ASSERT_TRUE(Upload(b).ok());
  const int64_t before = Store().uploaded_bytes();
  v1::UploadTensorResponse r;
  ASSERT_TRUE(Send(Messages(b, "again"), &r).ok());
  EXPECT_TRUE(r.already_present());
  EXPECT_EQ(r.committed_size(), 3 * kChunk);
  EXPECT_EQ(Store().uploaded_bytes(), before);
}

TEST_F(StoreCallsTest, BadUploadsGetTheirCodeAndTheServerKeepsServing) {
  const std::string b = RandomBytes(10000, 7);
  struct Case {
    std::string name;
    std::vector<v1::UploadTensorRequest> messages;
    grpc::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  {
    auto m = Messages(b, "no-digest");
    m[0].clear_digest();
    cases.push_back({"first message without digest", m, grpc::StatusCode::INVALID_ARGUMENT,
                     "first UploadTensor message"});
  }
  {
    auto m = Messages(b, "bad-hash");
    m[0].mutable_digest()->set_hash("sha256:ABC");
    cases.push_back({"malformed digest", m, grpc::StatusCode::INVALID_ARGUMENT, "digest"});
  }
  {
    auto m = Messages(b, "negative");
    m[0].mutable_digest()->set_size_bytes(-1);
    cases.push_back({"negative size", m, grpc::StatusCode::INVALID_ARGUMENT, "size"});
  }
  {
    auto m = Messages(b, std::string(200, 'x'));
    cases.push_back({"long upload_id", m, grpc::StatusCode::INVALID_ARGUMENT, "upload_id"});
  }
  {
    auto m = Messages(b, "order", 1000);
    std::swap(m[2], m[3]);
    cases.push_back({"out of order", m, grpc::StatusCode::INVALID_ARGUMENT, "expected"});
  }
  {
    auto m = Messages(b, "overlap", 1000);
    m[2].set_offset(500);
    m[2].set_data(b.substr(500, 1000));
    cases.push_back({"overlapping", m, grpc::StatusCode::INVALID_ARGUMENT, "got 500"});
  }
  {
    auto m = Messages(b, "past", 1000);
    m.back().set_data(m.back().data() + "tail");
    cases.push_back({"past the size", m, grpc::StatusCode::INVALID_ARGUMENT, "declared size"});
  }
  {
    const std::string big = RandomBytes(kChunk + 1, 8);
    auto m = Messages(big, "oversized", kChunk + 1);
    cases.push_back({"oversized chunk", m, grpc::StatusCode::INVALID_ARGUMENT, "per message"});
  }
  {
    auto m = Messages(b, "early", 1000);
    m.resize(5);
    cases.push_back({"ends early", m, grpc::StatusCode::INVALID_ARGUMENT, "resume at offset 4000"});
  }
  {
    std::string wrong = b;
    wrong[1234] ^= 0x40;
    auto m = Messages(wrong, "mismatch", 1000);
    *m[0].mutable_digest() = DigestProto(b);
    cases.push_back(
        {"hash mismatch", m, grpc::StatusCode::INVALID_ARGUMENT, DigestOf(wrong).ToString()});
  }
  {
    auto m = Messages(b, "other-digest", 1000);
    *m[2].mutable_digest() = DigestProto(RandomBytes(10, 1));
    cases.push_back({"later digest differs", m, grpc::StatusCode::INVALID_ARGUMENT, "later"});
  }
  {
    auto m = Messages(b, "too-big");
    m[0].mutable_digest()->set_size_bytes(int64_t{41} << 20);
    m.resize(1);
    cases.push_back(
        {"over max_tensor_bytes", m, grpc::StatusCode::RESOURCE_EXHAUSTED, "per stored tensor"});
  }
  for (const Case& c : cases) {
    v1::UploadTensorResponse r;
    const grpc::Status s = Send(c.messages, &r);
    EXPECT_EQ(s.error_code(), c.code) << c.name << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.name;
    ExpectStillServing();
  }
  EXPECT_EQ(Missing({DigestProto(b)}).size(), 1u);  // nothing wrong was stored
}

TEST_F(StoreCallsTest, AnInterruptedUploadResumesFromWhatTheServerHolds) {
  const std::string b = RandomBytes(3 * kChunk + 100, 11);
  auto stub = Stub();
  {
    // Two chunks, received by the server, then the client goes away.
    auto m = Messages(b, "resumable");
    grpc::ClientContext ctx;
    v1::UploadTensorResponse r;
    auto writer = stub->UploadTensor(&ctx, &r);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(writer->Write(m[i]));
    for (int i = 0; i < 500 && Store().partial_bytes() < 2 * kChunk; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ctx.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  v1::QueryUploadStatusRequest q;
  *q.mutable_digest() = DigestProto(b);
  q.set_upload_id("resumable");
  v1::QueryUploadStatusResponse status;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->QueryUploadStatus(&ctx, q, &status).ok());
  }
  EXPECT_EQ(status.committed_size(), 2 * kChunk);
  EXPECT_FALSE(status.complete());
  v1::UploadTensorResponse r;
  const grpc::Status s = Send(Messages(b, "resumable", kChunk, status.committed_size()), &r);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(r.committed_size(), static_cast<int64_t>(b.size()));
  std::string back;
  ASSERT_TRUE(Read(DigestProto(b), 0, 0, &back).ok());
  EXPECT_EQ(back, b);
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub->QueryUploadStatus(&ctx, q, &status).ok());
  EXPECT_TRUE(status.complete());
}

TEST_F(StoreCallsTest, AnAbandonedUploadIsFreedAfterItsTimeToLive) {
  const std::string b = RandomBytes(6 << 20, 12);
  auto m = Messages(b, "abandoned");
  {
    grpc::ClientContext ctx;
    v1::UploadTensorResponse r;
    auto stub = Stub();
    auto writer = stub->UploadTensor(&ctx, &r);
    ASSERT_TRUE(writer->Write(m[0]));
    ASSERT_TRUE(writer->Write(m[1]));
    for (int i = 0; i < 500 && Committed(b, "abandoned") < kChunk; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ctx.TryCancel();
    (void)writer->Finish();
  }
  // Kept for resuming at first (unless a slow machine already passed the
  // second)...
  const int64_t kept = Committed(b, "abandoned");
  EXPECT_TRUE(kept == kChunk || kept == 0) << kept;
  v1::StoreInfo s = Store();
  // ... and freed once the second has passed: bytes and reservation.
  for (int i = 0; i < 200 && (s.partial_uploads() > 0 || s.partial_bytes() > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s = Store();
  }
  EXPECT_EQ(s.partial_uploads(), 0);
  EXPECT_EQ(s.partial_bytes(), 0);
  EXPECT_EQ(Committed(b, "abandoned"), 0);
}

TEST_F(StoreCallsTest, AStalledUploadIsCancelledAndKeepsWhatItSent) {
  const std::string b = RandomBytes(3 * kChunk, 17);
  auto m = Messages(b, "stalled");
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::UploadTensorResponse r;
  auto writer = stub->UploadTensor(&ctx, &r);
  ASSERT_TRUE(writer->Write(m[0]));
  ASSERT_TRUE(writer->Write(m[1]));
  // Then nothing: after the 2 s idle limit the server cuts the stream
  // (Finish returns once it has), without the client's help.
  const grpc::Status s = writer->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  const int64_t kept = Committed(b, "stalled");
  // Kept for resuming (unless the 1 s time to live already passed).
  EXPECT_TRUE(kept == kChunk || kept == 0) << kept;
}

TEST_F(StoreCallsTest, AStoreFullOfUploadsInProgressRefusesWithARetryHint) {
  // An upload of 40 MiB in progress reserves 40 of the 48 MiB.
  const std::string big = RandomBytes(40 << 20, 13);
  // The refused upload's messages are made first: while it runs the held
  // upload sends nothing, and must not reach the 2 s idle limit (making
  // 20 MiB of messages took 3 s under ThreadSanitizer).
  const std::string other = RandomBytes(20 << 20, 14);
  const auto refused_messages = Messages(other, "refused");
  auto stub = Stub();
  grpc::ClientContext holding;
  v1::UploadTensorResponse held_response;
  auto writer = stub->UploadTensor(&holding, &held_response);
  auto m = Messages(big, "holding");
  ASSERT_TRUE(writer->Write(m[0]));
  ASSERT_TRUE(writer->Write(m[1]));
  // Wait until the server took the first message (it has reserved).
  for (int i = 0; i < 200 && Store().partial_uploads() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  grpc::ClientContext ctx;
  v1::UploadTensorResponse r;
  auto w2 = stub->UploadTensor(&ctx, &r);
  for (const auto& msg : refused_messages) {
    if (!w2->Write(msg)) break;
  }
  w2->WritesDone();
  const grpc::Status s = w2->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("retry later"));
  const auto& trailers = ctx.GetServerTrailingMetadata();
  EXPECT_EQ(trailers.count("grpc-retry-pushback-ms"), 1u);
  // The upload in progress was not disturbed: it completes.
  for (size_t i = 2; i < m.size(); ++i) ASSERT_TRUE(writer->Write(m[i]));
  writer->WritesDone();
  const grpc::Status done = writer->Finish();
  EXPECT_TRUE(done.ok()) << done.error_message();
  EXPECT_TRUE(Missing({DigestProto(big)}).empty());
}

TEST_F(StoreCallsTest, ReadingOutsideTheBlobOrAMissingOneFails) {
  const std::string b = RandomBytes(100, 15);
  ASSERT_TRUE(Upload(b).ok());
  std::string out;
  EXPECT_EQ(Read(DigestProto(b), 101, 0, &out).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Read(DigestProto(b), 50, 51, &out).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Read(DigestProto(b), 0, -1, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(DigestProto(RandomBytes(100, 16)), 0, 0, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(StoreCallsTest, TenThousandTinyConcurrentUploadsAreAllStored) {
  constexpr int kThreads = 16, kEach = 625;
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto stub = Stub();
      for (int i = 0; i < kEach; ++i) {
        const std::string b = "tiny-" + std::to_string(t) + "-" + std::to_string(i);
        auto m = Messages(b, "t");
        grpc::ClientContext ctx;
        v1::UploadTensorResponse r;
        auto w = stub->UploadTensor(&ctx, &r);
        for (const auto& msg : m) w->Write(msg);
        w->WritesDone();
        if (!w->Finish().ok()) ++failed;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  std::vector<v1::TensorDigest> digests;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; i += 97) {
      digests.push_back(DigestProto("tiny-" + std::to_string(t) + "-" + std::to_string(i)));
    }
  }
  EXPECT_TRUE(Missing(digests).empty());
  EXPECT_EQ(Store().partial_uploads(), 0);
}

// A 2x8 -> 3 layer in fp32; `by_digest` sends x and W by digest.
v1::VerifyRequest Layer(bool by_digest) {
  v1::VerifyRequest r;
  auto set = [&](v1::Tensor* t, std::vector<int64_t> shape, const std::string& bytes) {
    t->set_dtype(v1::DTYPE_FLOAT32);
    for (int64_t d : shape) t->add_shape(d);
    if (by_digest) {
      t->set_digest(DigestOf(bytes).ToString());
    } else {
      t->set_data(bytes);
    }
  };
  set(r.mutable_op()->mutable_input(), {2, 8}, Floats(16, 1));
  set(r.mutable_op()->mutable_weight(), {3, 8}, Floats(24, 2, 0.35f));
  r.mutable_op()->mutable_bias()->set_dtype(v1::DTYPE_FLOAT32);
  r.mutable_op()->mutable_bias()->add_shape(3);
  r.mutable_op()->mutable_bias()->set_data(Floats(3, 3));
  r.add_configs("cpu:bf16:fused");
  return r;
}

TEST_F(StoreCallsTest, TensorsByDigestGiveTheSameAnswerAsInline) {
  ASSERT_TRUE(Upload(Floats(16, 1)).ok());
  ASSERT_TRUE(Upload(Floats(24, 2, 0.35f)).ok());
  v1::VerifyResponse inline_answer, digest_answer;
  ASSERT_TRUE(Verify(Layer(false), &inline_answer).ok());
  const grpc::Status s = Verify(Layer(true), &digest_answer);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(digest_answer.results_size(), 1);
  EXPECT_EQ(digest_answer.results(0).vs_reference().max_abs(),
            inline_answer.results(0).vs_reference().max_abs());
  EXPECT_EQ(digest_answer.results(0).vs_reference().max_ulp(),
            inline_answer.results(0).vs_reference().max_ulp());
  EXPECT_GT(digest_answer.results(0).vs_reference().max_abs(), 0);  // bf16 differs from fp64
}

TEST_F(StoreCallsTest, MissingDigestsAreFailedPreconditionWithADetailListingThem) {
  v1::VerifyRequest r = Layer(true);
  const std::string absent_w = Floats(24, 77);
  r.mutable_op()->mutable_weight()->set_digest(DigestOf(absent_w).ToString());
  const std::string absent_x = Floats(16, 78);
  r.mutable_op()->mutable_input()->set_digest(DigestOf(absent_x).hash);  // without the prefix
  auto stub = Stub();
  grpc::ClientContext ctx;
  v1::VerifyResponse resp;
  const grpc::Status s = stub->Verify(&ctx, r, &resp);
  ASSERT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("op.weight " + DigestOf(absent_w).ToString()));
  EXPECT_THAT(s.error_message(), HasSubstr("op.input " + DigestOf(absent_x).ToString()));
  google::rpc::Status detail;
  ASSERT_TRUE(detail.ParseFromString(s.error_details()));
  EXPECT_EQ(detail.code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  ASSERT_EQ(detail.details_size(), 1);
  EXPECT_EQ(detail.details(0).type_url(), "type.googleapis.com/tensorcheck.v1.MissingTensors");
  v1::MissingTensors missing;
  ASSERT_TRUE(detail.details(0).UnpackTo(&missing));
  ASSERT_EQ(missing.digests_size(), 2);
  EXPECT_EQ(missing.fields(0), "op.input");
  EXPECT_EQ(missing.digests(0).hash(), DigestOf(absent_x).ToString());
  EXPECT_EQ(missing.digests(0).size_bytes(), 64);
  EXPECT_EQ(missing.fields(1), "op.weight");
  EXPECT_EQ(missing.digests(1).size_bytes(), 96);
  // Uploaded, the same request passes.
  ASSERT_TRUE(Upload(absent_w).ok());
  ASSERT_TRUE(Upload(absent_x).ok());
  v1::VerifyResponse ok;
  EXPECT_TRUE(Verify(r, &ok).ok());
}

// A dequantisation scale sent by digest meets the rule of an inline one
// (docs/numerics.md, "FP8"): a NaN in a stored row-wise weight scale is
// INVALID_ARGUMENT naming the element, and the server keeps serving.
TEST_F(StoreCallsTest, AStoredFp8ScaleHoldingNaNIsInvalidArgumentNamingTheElement) {
  auto floats = [](std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  };
  const std::string bad = floats({0.5f, std::numeric_limits<float>::quiet_NaN(), 2.0f});
  const std::string good = floats({0.5f, 0.25f, 2.0f});
  ASSERT_TRUE(Upload(bad).ok());
  ASSERT_TRUE(Upload(good).ok());
  v1::VerifyRequest r;
  v1::LinearOp* op = r.mutable_op();
  // x [2, 8] and W [3, 8] of float8_e4m3fn 1.0 (0x38), row-wise scales.
  for (auto [t, rows] : {std::pair{op->mutable_input(), 2}, {op->mutable_weight(), 3}}) {
    t->set_dtype(v1::DTYPE_FLOAT8_E4M3FN);
    t->add_shape(rows);
    t->add_shape(8);
    t->set_data(std::string(static_cast<size_t>(rows) * 8, '\x38'));
  }
  op->mutable_input_scale()->set_dtype(v1::DTYPE_FLOAT32);
  op->mutable_input_scale()->add_shape(2);
  op->mutable_input_scale()->set_data(floats({1.0f, 1.0f}));
  op->mutable_weight_scale()->set_dtype(v1::DTYPE_FLOAT32);
  op->mutable_weight_scale()->add_shape(3);
  op->mutable_weight_scale()->set_digest(DigestOf(bad).ToString());
  r.add_configs("cpu:fp8e4m3");
  v1::VerifyResponse resp;
  const grpc::Status s = Verify(r, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_EQ(s.error_message(),
            "op.weight_scale[1]: a finite, positive float32 scale expected, got NaN");
  // The same request with a good stored scale is answered.
  op->mutable_weight_scale()->set_digest(DigestOf(good).ToString());
  const grpc::Status ok = Verify(r, &resp);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(StoreCallsTest, LargeReturnedOutputsComeBackByDigest) {
  v1::VerifyRequest r = Layer(false);
  r.mutable_output()->set_return_outputs(true);
  v1::VerifyResponse inline_answer;
  ASSERT_TRUE(Verify(r, &inline_answer).ok());
  ASSERT_EQ(inline_answer.results(0).output().source_case(), v1::Tensor::kData);
  r.mutable_output()->set_max_inline_output_bytes(8);  // the 2x3 outputs are 12 or 24 bytes
  v1::VerifyResponse by_digest;
  ASSERT_TRUE(Verify(r, &by_digest).ok());
  for (const v1::ConfigResult* c : {&by_digest.results(0), &by_digest.reference()}) {
    ASSERT_EQ(c->output().source_case(), v1::Tensor::kDigest) << c->config();
  }
  const v1::Tensor& out = by_digest.results(0).output();
  v1::TensorDigest d;
  d.set_hash(out.digest());
  d.set_size_bytes(static_cast<int64_t>(inline_answer.results(0).output().data().size()));
  std::string back;
  ASSERT_TRUE(Read(d, 0, 0, &back).ok());
  EXPECT_EQ(back, inline_answer.results(0).output().data());
  EXPECT_EQ(std::vector<int64_t>(out.shape().begin(), out.shape().end()),
            (std::vector<int64_t>{2, 3}));
  r.mutable_output()->set_max_inline_output_bytes(-1);
  v1::VerifyResponse bad;
  EXPECT_EQ(Verify(r, &bad).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(StoreCallsTest, ALargeOutputStaysInlineWhenTheStoreHasNoRoom) {
  // Two uploads being written reserve all 48 MiB of the budget.
  auto stub = Stub();
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::UploadTensorRequest>>> writers;
  v1::UploadTensorResponse r1, r2;
  const std::string a = RandomBytes(40 << 20, 18), b = RandomBytes(8 << 20, 19);
  for (auto [bytes, response] : {std::pair{&a, &r1}, std::pair{&b, &r2}}) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    writers.push_back(stub->UploadTensor(contexts.back().get(), response));
    ASSERT_TRUE(writers.back()->Write(Messages(*bytes, "filling")[0]));
  }
  for (int i = 0; i < 500 && Store().bytes_used() < (48 << 20); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  v1::VerifyRequest req = Layer(false);
  req.mutable_output()->set_return_outputs(true);
  req.mutable_output()->set_max_inline_output_bytes(8);
  v1::VerifyResponse resp;
  const grpc::Status s = Verify(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.results(0).output().source_case(), v1::Tensor::kData);
  EXPECT_EQ(resp.results(0).output().data().size(), 2u * 3u * 4u);
  for (auto& c : contexts) c->TryCancel();
  for (auto& w : writers) (void)w->Finish();
}

TEST(StoreCallsNoStoreTest, WithoutAStoreTheStoreRpcsAreUnimplementedAndDigestsMissing) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.store_bytes = 0;
  auto server = TensorCheckServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::TensorCheck::NewStub(channel);
  {
    grpc::ClientContext ctx;
    v1::FindMissingTensorsResponse resp;
    EXPECT_EQ(stub->FindMissingTensors(&ctx, {}, &resp).error_code(),
              grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    grpc::ClientContext ctx;
    v1::UploadTensorResponse resp;
    auto w = stub->UploadTensor(&ctx, &resp);
    w->WritesDone();
    EXPECT_EQ(w->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  {
    grpc::ClientContext ctx;
    v1::GetCapabilitiesResponse caps;
    ASSERT_TRUE(stub->GetCapabilities(&ctx, {}, &caps).ok());
    EXPECT_FALSE(caps.tensor_store());
    EXPECT_FALSE(caps.store().present());
  }
  {
    grpc::ClientContext ctx;
    v1::VerifyResponse resp;
    const grpc::Status s = stub->Verify(&ctx, Layer(true), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("no store"));
  }
  (*server)->Shutdown(absl::Seconds(1));
  (*server)->Wait();
}

// Draining (docs/operations.md, "Shutting down"): an upload and a read that
// are open when the server starts shutting down get the grace period, as
// requests do; new ones are refused UNAVAILABLE with a retry hint.
class StoreDrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.store_bytes = 96 << 20;
    auto server = TensorCheckServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::TensorCheck::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  // Stores `bytes` with one stream, in 4 MiB chunks.
  void Store(const std::string& bytes) {
    grpc::ClientContext ctx;
    v1::UploadTensorResponse resp;
    auto w = stub_->UploadTensor(&ctx, &resp);
    for (size_t off = 0; off < bytes.size(); off += kChunk) {
      v1::UploadTensorRequest m;
      if (off == 0) *m.mutable_digest() = DigestProto(bytes);
      m.set_offset(static_cast<int64_t>(off));
      m.set_data(bytes.substr(off, kChunk));
      ASSERT_TRUE(w->Write(m));
    }
    w->WritesDone();
    const grpc::Status s = w->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  // A whole ReadTensor of a stored tensor: its status and trailers.
  grpc::Status ReadAll(const std::string& bytes,
                       std::multimap<grpc::string_ref, grpc::string_ref>* trailers) {
    grpc::ClientContext ctx;
    v1::ReadTensorRequest r;
    *r.mutable_digest() = DigestProto(bytes);
    auto reader = stub_->ReadTensor(&ctx, r);
    v1::ReadTensorResponse m;
    while (reader->Read(&m)) {
    }
    const grpc::Status s = reader->Finish();
    *trailers = ctx.GetServerTrailingMetadata();
    return s;
  }

  // An upload of `bytes` with its first chunk sent and held by the server:
  // a stream in flight.
  std::unique_ptr<grpc::ClientWriter<v1::UploadTensorRequest>> OpenUpload(
      const std::string& bytes, const std::string& upload_id, grpc::ClientContext* ctx,
      v1::UploadTensorResponse* response) {
    auto writer = stub_->UploadTensor(ctx, response);
    v1::UploadTensorRequest first;
    *first.mutable_digest() = DigestProto(bytes);
    first.set_upload_id(upload_id);
    first.set_data(bytes.substr(0, kChunk));
    EXPECT_TRUE(writer->Write(first));
    WaitForCommitted(bytes, upload_id, kChunk);
    return writer;
  }

  // Waits until the server holds `committed` bytes of the upload.
  void WaitForCommitted(const std::string& bytes, const std::string& upload_id, int64_t committed) {
    for (;;) {
      grpc::ClientContext ctx;
      v1::QueryUploadStatusRequest q;
      *q.mutable_digest() = DigestProto(bytes);
      q.set_upload_id(upload_id);
      v1::QueryUploadStatusResponse status;
      ASSERT_TRUE(stub_->QueryUploadStatus(&ctx, q, &status).ok());
      if (status.committed_size() == committed) return;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  std::unique_ptr<TensorCheckServer> server_;
  std::unique_ptr<v1::TensorCheck::Stub> stub_;
};

TEST_F(StoreDrainTest, UploadsAndReadsInFlightGetTheGraceAndNewOnesAreRefusedWithAHint) {
  const std::string probe = RandomBytes(1000, 1);
  const std::string stored = RandomBytes(32 << 20, 2);  // more than HTTP/2's windows
  const std::string uploading = RandomBytes(3 * kChunk, 3);
  Store(probe);
  Store(stored);

  // An upload open, one chunk in.
  grpc::ClientContext up_ctx;
  v1::UploadTensorResponse up_resp;
  auto writer = OpenUpload(uploading, "draining", &up_ctx, &up_resp);
  // A read open, one chunk out.
  grpc::ClientContext read_ctx;
  v1::ReadTensorRequest rr;
  *rr.mutable_digest() = DigestProto(stored);
  auto reader = stub_->ReadTensor(&read_ctx, rr);
  v1::ReadTensorResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::string read = m.data();

  std::atomic<bool> stopped{false};
  std::thread shutdown([&] {
    server_->Shutdown(absl::Seconds(120));
    stopped = true;
  });
  // Draining has begun once a new read is refused; it carries the hint.
  std::multimap<grpc::string_ref, grpc::string_ref> trailers;
  grpc::Status refused;
  while ((refused = ReadAll(probe, &trailers)).ok()) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("shutting down"));
  EXPECT_EQ(trailers.count(kRetryPushbackKey), 1u);
  {
    grpc::ClientContext ctx;
    v1::UploadTensorResponse resp;
    auto w = stub_->UploadTensor(&ctx, &resp);
    v1::UploadTensorRequest m2;
    *m2.mutable_digest() = DigestProto(RandomBytes(100, 4));
    w->Write(m2);
    w->WritesDone();
    const grpc::Status s = w->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(ctx.GetServerTrailingMetadata().count(kRetryPushbackKey), 1u);
  }
  // Longer than the second the streams used to get before gRPC cut them
  // (only the code before this fix needed it to fail; the checks below
  // hold however long the pause).
  absl::SleepFor(absl::Milliseconds(1500));
  EXPECT_FALSE(stopped);

  // Both streams finish, whole.
  for (int64_t off = kChunk; off < static_cast<int64_t>(uploading.size()); off += kChunk) {
    v1::UploadTensorRequest c;
    c.set_offset(off);
    c.set_data(uploading.substr(static_cast<size_t>(off), kChunk));
    ASSERT_TRUE(writer->Write(c));
  }
  writer->WritesDone();
  const grpc::Status up = writer->Finish();
  EXPECT_TRUE(up.ok()) << up.error_message();
  EXPECT_EQ(up_resp.committed_size(), static_cast<int64_t>(uploading.size()));
  while (reader->Read(&m)) read += m.data();
  const grpc::Status rs = reader->Finish();
  EXPECT_TRUE(rs.ok()) << rs.error_message();
  EXPECT_TRUE(read == stored);
  shutdown.join();
  server_->Wait();
}

TEST_F(StoreDrainTest, AStreamThatOutlivesTheGraceIsCancelled) {
  const std::string uploading = RandomBytes(2 * kChunk, 5);
  grpc::ClientContext up_ctx;
  v1::UploadTensorResponse up_resp;
  auto writer = OpenUpload(uploading, "never-finished", &up_ctx, &up_resp);
  server_->Shutdown(absl::Milliseconds(200));  // returns: the stream was cancelled
  writer->WritesDone();
  EXPECT_FALSE(writer->Finish().ok());
  server_->Wait();
}

}  // namespace
}  // namespace tensorcheck
