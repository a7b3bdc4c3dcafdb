// TensorCheckServiceImpl: the gRPC face of the engine. The only layer that
// includes gRPC headers.
//
// Each method validates and converts the request (proto_convert.h), hands
// the work to a bounded worker pool (so gRPC's callback threads never run a
// GEMM), and finishes the reactor from the worker. A full queue, or a server
// that is draining, answers UNAVAILABLE.
//
//   TensorCheckServiceImpl service(engine.get(), ServiceOptions{});
//   builder.RegisterService(&service);
//   ...
//   service.StartDraining();   // on SIGTERM: refuse new work
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/engine.h"
#include "server/service/proto_convert.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck {

// Maps an absl::Status to a grpc::Status once, at the boundary, bounding
// the message length.
grpc::Status ToGrpcStatus(const absl::Status& status);

// A fixed set of threads draining a bounded queue of tasks.
class WorkerPool {
 public:
  WorkerPool(int threads, int max_queue);
  ~WorkerPool();  // runs what is queued, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False when the queue is full or the pool is closed.
  bool TrySubmit(std::function<void()> task);
  // Stops accepting work; queued tasks still run.
  void Close();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t max_queue_;
  bool closed_ = false;
  std::vector<std::thread> threads_;
};

struct ServiceOptions {
  int workers = 2;
  int max_queue = 64;
  std::string server_version;
  // Called (once) when a request fails with an error that leaves the device
  // unusable (marked with MarkFatalDeviceError, core/status_macros.h): the
  // server goes NOT_SERVING and exits.
  std::function<void(const absl::Status&)> on_fatal;
};

class TensorCheckServiceImpl final : public v1::TensorCheck::CallbackService {
 public:
  // `engine` must outlive the service.
  TensorCheckServiceImpl(const Engine* engine, ServiceOptions options);
  ~TensorCheckServiceImpl() override;

  grpc::ServerUnaryReactor* Verify(grpc::CallbackServerContext* context,
                                   const v1::VerifyRequest* request,
                                   v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* Diagnose(grpc::CallbackServerContext* context,
                                     const v1::VerifyRequest* request,
                                     v1::VerifyResponse* response) override;
  grpc::ServerUnaryReactor* GetCapabilities(grpc::CallbackServerContext* context,
                                            const v1::GetCapabilitiesRequest* request,
                                            v1::GetCapabilitiesResponse* response) override;

  // New requests are answered UNAVAILABLE; in-flight ones finish.
  void StartDraining();

  // Blocks until no request is queued or running, or until `deadline`;
  // true when idle.
  bool WaitForIdle(absl::Time deadline);

  // The capabilities answer (also used by tests and the start-up log).
  void FillCapabilities(v1::GetCapabilitiesResponse* response) const;

 private:
  grpc::ServerUnaryReactor* RunLinear(grpc::CallbackServerContext* context,
                                      const v1::VerifyRequest* request,
                                      v1::VerifyResponse* response, bool diagnose);
  void LogRequest(absl::string_view method, const v1::VerifyRequest* request, double elapsed_ms,
                  const absl::Status& status) const;

  const Engine* engine_;
  ServiceOptions options_;
  std::atomic<bool> draining_{false};
  // Requests accepted and not yet finished.
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;
  int in_flight_ = 0;
  std::atomic<bool> fatal_reported_{false};
  WorkerPool pool_;
};

}  // namespace tensorcheck
