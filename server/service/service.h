// TensorCheckServiceImpl: the gRPC face of the engine. The only layer that
// includes gRPC headers.
//
// Verify, Diagnose and Compare are read by the service itself (a generic
// callback reactor): it admits a request by bytes (admission.h) before it
// reads the message, parses it itself (so a message that is not a
// VerifyRequest is INVALID_ARGUMENT with a reason, not gRPC's empty
// UNIMPLEMENTED), converts and validates it
// (proto_convert.h), and hands the work to a bounded worker pool (gRPC's
// callback threads never run a GEMM). Each request carries a StopSignal:
// its deadline (the client's, capped by max_request_time) and cancellation
// by the client or by a draining server reach the engine and backends,
// which stop between bounded pieces of work. A full queue, a draining
// server or a momentarily full byte budget answers UNAVAILABLE or
// RESOURCE_EXHAUSTED with a retry hint (`grpc-retry-pushback-ms`).
// docs/architecture.md ("Admission and cancellation") has the whole story.
//
//   TensorCheckServiceImpl service(engine.get(), ServiceOptions{});
//   builder.RegisterService(&service);
//   builder.RegisterCallbackGenericService(service.linear_methods());
//   ...
//   service.StartDraining();                 // on SIGTERM: refuse new work
//   if (!service.WaitForIdle(deadline)) service.CancelAll();
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "core/stop_signal.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "server/engine/engine.h"
#include "server/service/admission.h"
#include "server/service/idle_trim.h"
#include "server/service/metrics.h"
#include "server/service/proto_convert.h"
#include "server/service/tenants.h"
#include "server/service/upload_session.h"
#include "server/store/tenant_store.h"
#include "server/store/tensor_store.h"
#include "tensorcheck/v1/tensorcheck.grpc.pb.h"

namespace tensorcheck {

// The request's bytes as `request` (a VerifyRequest, a ReadTensorRequest,
// ...); INVALID_ARGUMENT naming the message when they are not one
// (truncated, corrupt, invalid UTF-8 in a string field).
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* request);

// `message` serialized into `out`; INTERNAL when it cannot be.
absl::Status SerializeResponse(const google::protobuf::Message& message, grpc::ByteBuffer* out);

// Maps an absl::Status to a grpc::Status once, at the boundary, bounding
// the message length.
grpc::Status ToGrpcStatus(const absl::Status& status);

// The tenant whose bearer token the call's metadata carries, for a call of
// `method` needing `right` (none: any tenant): UNAUTHENTICATED without a
// token the tokens file knows, PERMISSION_DENIED without the right
// (auth.cc).
absl::StatusOr<std::shared_ptr<const Tenant>> AuthenticateCall(
    const TokensFile& tokens, const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
    std::optional<Right> right, absl::string_view method);

// The trailing-metadata key of the retry hint on UNAVAILABLE and
// RESOURCE_EXHAUSTED refusals that a later retry can pass (milliseconds,
// decimal). A refusal without it is permanent.
inline constexpr char kRetryPushbackKey[] = "grpc-retry-pushback-ms";
// What a new call gets while the server drains (with a retry hint): the
// client's retry goes to another replica.
inline absl::Status ShuttingDown() {
  return absl::UnavailableError("server is shutting down; retry on another replica");
}

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
  // Tasks waiting for a thread.
  size_t queued();
  size_t max_queue() const { return max_queue_; }

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
  // Host bytes all requests in flight may hold together (admission.h);
  // 0: unlimited.
  int64_t max_inflight_bytes = int64_t{4} << 30;
  // The longest a request may run when its client set no shorter
  // deadline.
  absl::Duration max_request_time = absl::Seconds(300);
  std::string server_version;
  // Called (once) when a request fails with an error that leaves the device
  // unusable (marked with MarkFatalDeviceError, core/status_macros.h): the
  // server goes NOT_SERVING and exits.
  std::function<void(const absl::Status&)> on_fatal;
  // Called with true when a request is refused because the queue is full,
  // and with false when the queue has room again (readiness follows it).
  std::function<void(bool saturated)> on_saturation;
  // The tensor store behind the store RPCs and tensors by digest; null:
  // none (the store RPCs answer UNIMPLEMENTED). Must outlive the service.
  TensorStore* store = nullptr;
  // Returned outputs over this many bytes are answered by digest.
  int64_t inline_output_bytes = int64_t{4} << 20;
  // An upload stream that sends nothing for this long is cancelled (what
  // it sent is kept for resuming), so a stalled client cannot hold the
  // store's budget.
  absl::Duration upload_idle = absl::Seconds(60);
  // Where finished calls are counted (metrics.h); null: nowhere. Must
  // outlive the service.
  ServiceMetrics* metrics = nullptr;
  // Who may call (tenants.h): every call but the health service's needs a
  // bearer token of a tenant with the right for it, and the tenant's
  // quotas and store namespace apply. Null: no tokens, one shared store.
  // Must outlive the service.
  const TokensFile* tokens = nullptr;
  // The heap's free memory goes back to the system once no call has run
  // for this long after one ended (idle_trim.h); zero: never.
  absl::Duration trim_when_idle = absl::Seconds(2);
};

class LinearCall;  // service.cc: one Verify, Diagnose or Compare call
enum class LinearMethod { kVerify, kDiagnose, kCompare };

class TensorCheckServiceImpl final
    : public v1::TensorCheck::WithGenericMethod_Verify<
          v1::TensorCheck::WithGenericMethod_Diagnose<v1::TensorCheck::WithGenericMethod_Compare<
              v1::TensorCheck::WithRawCallbackMethod_GetCapabilities<
                  v1::TensorCheck::WithRawCallbackMethod_GetProgress<
                      v1::TensorCheck::WithRawCallbackMethod_FindMissingTensors<
                          v1::TensorCheck::WithRawCallbackMethod_UploadTensor<
                              v1::TensorCheck::WithRawCallbackMethod_QueryUploadStatus<
                                  v1::TensorCheck::WithRawCallbackMethod_ReadTensor<
                                      v1::TensorCheck::Service>>>>>>>>> {
 public:
  // `engine` must outlive the service.
  TensorCheckServiceImpl(const Engine* engine, ServiceOptions options);
  ~TensorCheckServiceImpl() override;

  // Verify, Diagnose and Compare: served by this generic service, which
  // the server registers beside the service itself
  // (builder.RegisterCallbackGenericService). It reads a call's request
  // only once the byte budget holds room for it, so that requests not yet
  // admitted are not received either: gRPC buffers about a flow-control
  // window of each, not the whole message. A unary call and a stream of
  // one message are the same on the wire. Other methods unknown to the
  // service are UNIMPLEMENTED there.
  grpc::CallbackGenericService* linear_methods() { return linear_methods_.get(); }
  // The metadata key by which a client declares its request's serialized
  // size (decimal bytes), so that it is admitted for that much before it
  // is received; without it, up to the message limit is reserved while it
  // is received. The size received is what counts afterwards.
  static constexpr char kRequestBytesKey[] = "tensorcheck-request-bytes";
  // The unary and server-streaming methods take their request as received
  // bytes, as Verify does: bytes that are not their message get
  // INVALID_ARGUMENT with a reason (ParseRequest), not gRPC's bare
  // UNIMPLEMENTED.
  grpc::ServerUnaryReactor* GetCapabilities(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  // One of the caller's Verify, Diagnose or Compare calls in flight, by its
  // request id: its phase and counts (RequestProgress).
  grpc::ServerUnaryReactor* GetProgress(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;

  // The store RPCs (store_calls.cc, docs/api.md).
  grpc::ServerUnaryReactor* FindMissingTensors(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) override;
  // Its messages arrive as bytes too, each parsed by the upload.
  grpc::ServerReadReactor<grpc::ByteBuffer>* UploadTensor(grpc::CallbackServerContext* context,
                                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* QueryUploadStatus(grpc::CallbackServerContext* context,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ReadTensor(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;

  // Upload and read streams (store_calls.cc) register while they live,
  // so that draining waits for them and CancelAll ends them; an upload
  // also gives the time of its last message (null for a read), so that an
  // idle one can be cancelled.
  void WatchStream(const void* key, grpc::CallbackServerContext* context,
                   const std::atomic<int64_t>* last_activity_ns);
  void UnwatchStream(const void* key);
  // Cancels the uploads idle longer than upload_idle at `now`; how many.
  int CancelIdleUploads(absl::Time now);

  // New requests and streams are answered UNAVAILABLE with a retry hint;
  // those in flight go on.
  void StartDraining();
  bool draining() const { return draining_; }

  // Stops every request in flight or queued (CANCELLED, "the server is
  // shutting down"), which ends at its next stop check, and cancels every
  // upload and read stream.
  void CancelAll();

  // Blocks until no request is queued or running and no upload or read
  // stream is open, or until `deadline`; true when idle.
  bool WaitForIdle(absl::Time deadline);

  // The capabilities answer (also used by tests and the start-up log).
  // With `tenant_store`, the store's figures are the tenant's own.
  void FillCapabilities(v1::GetCapabilitiesResponse* response,
                        const StoreView* tenant_store = nullptr) const;

  // Bytes reserved by requests in flight (admission.h).
  int64_t inflight_bytes() const { return budget_.in_use(); }
  // Requests accepted (queued or running) and not yet finished.
  int requests_in_flight() {
    std::lock_guard<std::mutex> lock(calls_mu_);
    return in_flight_;
  }
  // Requests waiting for a worker.
  size_t requests_queued() { return pool_.queued(); }
  // Null when metrics are off.
  ServiceMetrics* metrics() const { return options_.metrics; }

 private:
  friend class LinearCall;

  // A Verify, Diagnose or Compare call: authenticated, checked against
  // the tenant's quotas and the draining flag, and admitted by the bytes
  // its request may take before it is read.
  grpc::ServerGenericBidiReactor* StartLinear(grpc::GenericCallbackServerContext* context,
                                              LinearMethod method);
  // Its request arrived (`ok`) or the stream ended without one: admitted
  // by the bytes received, then queued.
  void Received(LinearCall* call, bool ok);
  // The worker's part of a call; finishes it.
  void Work(LinearCall* call, ByteBudget::Reservation* reservation);
  // Parses, admits by bytes, runs and serialises; `retry_later` is set
  // when the refusal is one a retry can pass (the byte budget was busy).
  absl::Status Execute(LinearCall* call, ByteBudget::Reservation* reservation, bool* retry_later);
  // Execute's part for a Compare call.
  absl::Status ExecuteCompare(LinearCall* call, ByteBudget::Reservation* reservation,
                              bool* retry_later);
  // Serialises `response` into the call's buffer; RESOURCE_EXHAUSTED over
  // the message limit.
  absl::Status Serialize(const google::protobuf::Message& response, LinearCall* call) const;
  // How long a refused client should wait before retrying: until about
  // `requests_ahead` more requests have finished (100 ms to 30 s).
  int64_t RetryPushbackMs(int64_t requests_ahead) const;
  void Track(LinearCall* call);
  void Untrack(LinearCall* call);
  void NoteSaturation(bool saturated);
  // Returned outputs over the inline limit go to the caller's store
  // namespace, answered by digest.
  absl::Status StoreLargeOutputs(const StoreView& store, int64_t request_limit,
                                 v1::VerifyResponse* response);

  // Who called (auth.cc): the tenant (null when the server has no
  // tenants) and its namespace of the store.
  struct Caller {
    std::shared_ptr<const Tenant> tenant;
    StoreView store;
    std::string name() const { return tenant != nullptr ? tenant->name : ""; }
  };
  // The caller of a call that needs `right` (none: any known tenant);
  // UNAUTHENTICATED without a known bearer token, PERMISSION_DENIED
  // without the right.
  absl::StatusOr<Caller> Authenticate(const grpc::CallbackServerContext& context,
                                      std::optional<Right> right, absl::string_view method) const;
  // Frees interrupted uploads past their time to live and cancels idle
  // upload streams, until destroyed.
  void SweepUploads();

  struct StreamWatch {
    grpc::CallbackServerContext* context;
    const std::atomic<int64_t>* last_activity_ns;  // Unix nanoseconds; null: a read
    bool cancelled;
  };
  std::mutex streams_mu_;
  std::map<const void*, StreamWatch> streams_;  // guarded by streams_mu_
  // streams_.size(), read by WaitForIdle under calls_mu_.
  std::atomic<int> streams_open_{0};

  const Engine* engine_;
  ServiceOptions options_;
  // Each tenant's namespace over options_.store (null without a store).
  std::unique_ptr<TenantStore> tenant_store_;
  // The tenants' concurrent and per-minute request quotas.
  RequestQuotas quotas_;
  std::atomic<bool> draining_{false};
  ByteBudget budget_;
  // Requests accepted and not yet finished, and their calls (to cancel on
  // shutdown).
  std::mutex calls_mu_;
  std::condition_variable idle_cv_;
  int in_flight_ = 0;
  std::set<LinearCall*> calls_;
  std::atomic<bool> saturated_{false};
  class LinearMethods;  // service.cc
  std::unique_ptr<grpc::CallbackGenericService> linear_methods_;
  // Told of every request and stream; null when trim_when_idle is zero.
  std::unique_ptr<IdleTrim> idle_trim_;
  // Moving average of request times, for the retry hint.
  std::atomic<double> mean_request_ms_{1000};
  std::atomic<bool> fatal_reported_{false};
  WorkerPool pool_;
  // Applies upload chunks off gRPC's threads (store_calls.cc), so that
  // receiving overlaps with copying and hashing.
  WorkerPool upload_pool_{2, 1 << 16};
  std::mutex sweeper_mu_;
  std::condition_variable sweeper_cv_;
  bool stopping_ = false;  // guarded by sweeper_mu_
  std::thread sweeper_;
};

}  // namespace tensorcheck
