// Fuzz target: the request path of Verify and Diagnose, in process.
//
//   bytes -> v1::VerifyRequest::ParseFromArray -> FromProto (validation)
//         -> Engine::Verify and Engine::Diagnose (cpu backend) -> ToProto
//
// The engine runs under tiny RequestLimits so that every input is cheap;
// whatever the bytes, the result is a response or a status with one of the
// codes docs/architecture.md's error table promises for a request
// (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, NOT_FOUND, FAILED_PRECONDITION).
// Another code, a crash, a leak or undefined behaviour is a bug.
//
//   scripts/fuzz.sh 60     # builds build-fuzz, runs every target
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/stubs/logging.h"
#include "server/engine/engine.h"
#include "server/service/proto_convert.h"
#include "tensorcheck/v1/tensorcheck.pb.h"

namespace tensorcheck {
namespace {

// Small enough that one input runs in milliseconds, large enough that every
// path (16 default candidates, repeat, top-k) is reachable.
RequestLimits TinyLimits() {
  RequestLimits limits;
  limits.max_message_bytes = int64_t{1} << 20;
  limits.max_tensor_bytes = int64_t{64} << 10;
  limits.max_output_elements = int64_t{1} << 14;
  limits.max_macs = 1'000'000;
  limits.max_configs = 16;  // Diagnose's default candidate set on the cpu backend
  limits.max_top_k = 16;
  limits.max_top_groups = 8;
  limits.max_repeat = 2;
  return limits;
}

// One registry and engine for the whole run, as in the server.
class Fixture {
 public:
  Fixture() {
    // Invalid UTF-8 in a string field is a parse failure protobuf also
    // logs; at thousands of inputs a second the log would drown the report.
    google::protobuf::SetLogHandler(nullptr);
    BuiltinBackendOptions backends;
    backends.cpu_threads = 1;  // deterministic and cheap: one fuzzing process per core
    Check(RegisterBuiltinBackends(&registry_, backends));
    EngineOptions options;
    options.limits = TinyLimits();
    auto engine = Engine::Create(options, &registry_);
    Check(engine.status());
    engine_ = std::move(*engine);
  }

  const Engine& engine() const { return *engine_; }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "request_fuzzer: set-up failed: %s\n", s.ToString().c_str());
      std::abort();
    }
  }

  BackendRegistry registry_;
  std::unique_ptr<Engine> engine_;
};

// A status a hostile request may get; anything else is a server bug.
void CheckRequestStatus(const absl::Status& s, const char* stage) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return;
    default:
      std::fprintf(stderr, "request_fuzzer: %s answered an unexpected status: %s\n", stage,
                   s.ToString().c_str());
      std::abort();
  }
}

}  // namespace
}  // namespace tensorcheck

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tensorcheck;                    // NOLINT(build/namespaces): a C entry point
  static const Fixture* fixture = new Fixture();  // never destroyed, as in a server
  const Engine& engine = fixture->engine();

  v1::VerifyRequest proto;
  if (!proto.ParseFromArray(data, static_cast<int>(size))) return 0;
  absl::StatusOr<LinearRequest> request = FromProto(proto, engine.options().limits);
  if (!request.ok()) {
    CheckRequestStatus(request.status(), "FromProto");
    return 0;
  }
  for (const bool diagnose : {false, true}) {
    absl::StatusOr<VerifyOutcome> outcome =
        diagnose ? engine.Diagnose(*request) : engine.Verify(*request);
    if (!outcome.ok()) {
      CheckRequestStatus(outcome.status(), diagnose ? "Diagnose" : "Verify");
      continue;
    }
    v1::VerifyResponse response;
    ToProto(*outcome, &response);
    std::string wire;
    if (!response.SerializeToString(&wire)) {
      std::fprintf(stderr, "request_fuzzer: a response failed to serialise\n");
      std::abort();
    }
  }
  return 0;
}
