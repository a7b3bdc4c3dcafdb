// UploadTensor throughput against a raw gRPC client-streaming echo of the
// same bytes in the same chunking (docs/performance.md, "Tensor store").
//
// Two in-process servers on loopback: the real one (its store hashes every
// chunk and writes it into the tensor's buffer) and an echo that reads the
// same UploadTensorRequest messages and drops them. One client streams
// 64 MiB, 256 MiB and 1 GiB through each, alternating, with the server's
// chunk size; digests are computed before the clock starts (that is the
// client's work in both cases). Prints MB/s of each and the ratio
// echo time / upload time (1.0: the store costs nothing on the wire).
//
//   build/bench/upload_bench [repeats]      # default 3; median of repeats
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/digest.h"
#include "grpcpp/grpcpp.h"
#include "server/service/server.h"
#include "server/service/upload_session.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck {
namespace {

// The baseline: reads every message of the stream, keeps nothing.
class EchoService final : public v1::TensorCheck::CallbackService {
  grpc::ServerReadReactor<v1::UploadTensorRequest>* UploadTensor(
      grpc::CallbackServerContext*, v1::UploadTensorResponse* response) override {
    class Reader final : public grpc::ServerReadReactor<v1::UploadTensorRequest> {
     public:
      explicit Reader(v1::UploadTensorResponse* response) : response_(response) {
        StartRead(&request_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          response_->set_committed_size(bytes_);
          Finish(grpc::Status::OK);
          return;
        }
        bytes_ += static_cast<int64_t>(request_.data().size());
        StartRead(&request_);
      }
      void OnDone() override { delete this; }

     private:
      v1::UploadTensorResponse* response_;
      v1::UploadTensorRequest request_;
      int64_t bytes_ = 0;
    };
    return new Reader(response);
  }
};

double CpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// Streams `bytes` (digest `d`) in chunks; seconds taken. Adds the CPU
// seconds the process (client and server) used to `*cpu`.
double Stream(v1::TensorCheck::Stub& stub, const std::string& bytes, const Digest& d,
              const std::string& id, double* cpu) {
  const double cpu_start = CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  grpc::ClientContext ctx;
  v1::UploadTensorResponse response;
  auto writer = stub.UploadTensor(&ctx, &response);
  v1::UploadTensorRequest m;
  m.mutable_digest()->set_hash(d.ToString());
  m.mutable_digest()->set_size_bytes(d.size);
  m.set_upload_id(id);
  writer->Write(m);
  m.Clear();
  for (int64_t off = 0; off < d.size; off += kStoreChunkBytes) {
    m.set_offset(off);
    m.set_data(bytes.data() + off,
               static_cast<size_t>(std::min<int64_t>(kStoreChunkBytes, d.size - off)));
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  const grpc::Status s = writer->Finish();
  if (!s.ok() || response.committed_size() != d.size) {
    std::fprintf(stderr, "upload failed: %s (%lld bytes)\n", s.error_message().c_str(),
                 static_cast<long long>(response.committed_size()));
    std::exit(1);
  }
  *cpu += CpuSeconds() - cpu_start;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main(int repeats) {
  ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.store_bytes = int64_t{3} << 30;
  options.max_stored_tensor_bytes = int64_t{2} << 30;
  auto server = TensorCheckServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  EchoService echo;
  int echo_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &echo_port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.RegisterService(&echo);
  std::unique_ptr<grpc::Server> echo_server = builder.BuildAndStart();

  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto real = v1::TensorCheck::NewStub(
      grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(), args));
  auto base = v1::TensorCheck::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(echo_port), grpc::InsecureChannelCredentials(), args));

  std::printf("UploadTensor vs a client-streaming echo, %lld-byte chunks, median of %d\n",
              static_cast<long long>(kStoreChunkBytes), repeats);
  // cores: CPU seconds of the whole process (client and server) per
  // second of the stream; this machine's count bounds what can overlap.
  std::printf("%10s %14s %14s %8s %10s %10s\n", "size", "echo MB/s", "upload MB/s", "ratio",
              "echo cores", "up. cores");
  std::mt19937_64 rng(1);
  for (int64_t mib : {64, 256, 1024}) {
    std::string bytes(static_cast<size_t>(mib << 20), '\0');
    for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
      const uint64_t r = rng();
      std::memcpy(&bytes[i], &r, 8);
    }
    std::vector<double> echo_s, upload_s;
    double echo_cpu = 0, upload_cpu = 0;
    for (int r = 0; r < repeats; ++r) {
      // A new tensor each time (an upload of a stored one ends at once).
      std::memcpy(&bytes[0], &r, sizeof(r));
      bytes[8] = static_cast<char>(mib);
      const Digest d = DigestOf(bytes);
      echo_s.push_back(Stream(*base, bytes, d, "echo", &echo_cpu));
      upload_s.push_back(Stream(*real, bytes, d, "bench-" + std::to_string(r), &upload_cpu));
    }
    const double mb = static_cast<double>(mib << 20) / 1e6;
    const double e = Median(echo_s), u = Median(upload_s);
    double echo_wall = 0, upload_wall = 0;
    for (double t : echo_s) echo_wall += t;
    for (double t : upload_s) upload_wall += t;
    std::printf("%7lld MiB %14.0f %14.0f %8.2f %10.2f %10.2f\n", static_cast<long long>(mib),
                mb / e, mb / u, e / u, echo_cpu / echo_wall, upload_cpu / upload_wall);
  }
  echo_server->Shutdown();
  (*server)->Shutdown(absl::Seconds(1));
  (*server)->Wait();
  return 0;
}

}  // namespace
}  // namespace tensorcheck

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  return tensorcheck::Main(repeats);
}
