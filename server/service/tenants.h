// Tenants: who may call the service and how much (docs/operations.md,
// "Tenants and tokens"). A tokens file maps bearer tokens, kept only as
// their SHA-256, to tenants with rights and quotas:
//
//   {"tenants": [{"name": "team-a",
//                 "token_sha256": ["<64 hex digits>"],
//                 "rights": ["verify", "diagnose", "store", "reflection"],
//                 "quota": {"stored_bytes": 8589934592, "concurrent_requests": 4,
//                           "requests_per_minute": 600}}]}
//
//   TC_ASSIGN_OR_RETURN(auto tenants, Tenants::Parse(json_text));
//   std::shared_ptr<const Tenant> t = tenants->FindByToken(token);  // null: unknown
//   if (!t->Allows(Right::kVerify)) ...                               // PERMISSION_DENIED
//   RequestQuotas quotas;
//   TC_ASSIGN_OR_RETURN(RequestQuotas::Slot slot, quotas.Admit(*t, absl::Now(), &retry_ms));
//
// No gRPC here: the service maps these to its status codes.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tensorcheck {

// What a tenant may call. GetCapabilities needs only a known token; the
// health service needs none.
enum class Right : uint32_t {
  kVerify = 1,      // Verify
  kDiagnose = 2,    // Diagnose
  kStore = 4,       // FindMissingTensors, UploadTensor, QueryUploadStatus, ReadTensor
  kReflection = 8,  // gRPC server reflection
};

struct TenantQuota {
  // 0 in any field: no limit of that kind (the server's own still apply).
  int64_t stored_bytes = 0;     // bytes the tenant's tensors hold in the store
  int concurrent_requests = 0;  // Verify and Diagnose calls running or queued
  int requests_per_minute = 0;  // Verify and Diagnose calls started
};

struct Tenant {
  std::string name;
  uint32_t rights = 0;  // Right bits
  TenantQuota quota;
  std::vector<std::array<unsigned char, 32>> token_hashes;

  bool Allows(Right r) const { return (rights & static_cast<uint32_t>(r)) != 0; }
};

// The parsed tokens file. Immutable; a reload makes a new one.
class Tenants {
 public:
  // INVALID_ARGUMENT naming the offending field (tenants[2].quota.stored_bytes)
  // for anything malformed: unknown keys, a name used twice, a hash that is
  // not 64 hex digits or belongs to two tenants, an unknown right.
  static absl::StatusOr<std::shared_ptr<const Tenants>> Parse(absl::string_view json);
  // Parse of the file's text; NOT_FOUND or PERMISSION_DENIED when it
  // cannot be read.
  static absl::StatusOr<std::shared_ptr<const Tenants>> Load(const std::string& path);

  // The tenant the token belongs to, null when none. The token is hashed
  // and compared with every known hash in constant time, so the time taken
  // tells nothing about which hash, or how much of one, matched.
  std::shared_ptr<const Tenant> FindByToken(absl::string_view token) const;

  const std::vector<std::shared_ptr<const Tenant>>& all() const { return tenants_; }

 private:
  std::vector<std::shared_ptr<const Tenant>> tenants_;
  // Every hash with the index of its tenant, in file order.
  std::vector<std::pair<std::array<unsigned char, 32>, size_t>> hashes_;
};

// The request quotas' running state, per tenant name, kept across reloads
// of the tokens file: concurrent requests and a token bucket of
// requests_per_minute (refilled continuously, so a burst of a minute's
// worth is allowed and then one request per 60/n seconds).
class RequestQuotas {
 public:
  // Holds one concurrent-request place until destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : owner_(other.owner_), tenant_(std::move(other.tenant_)) {
      other.owner_ = nullptr;
    }
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot();

   private:
    friend class RequestQuotas;
    Slot(RequestQuotas* owner, std::string tenant) : owner_(owner), tenant_(std::move(tenant)) {}
    RequestQuotas* owner_ = nullptr;
    std::string tenant_;
  };

  // Admits one request of `tenant` at `now`: a Slot, or RESOURCE_EXHAUSTED
  // naming the quota with `*retry_after_ms` set to when a retry can pass
  // (the next token of the bucket; for concurrency, `concurrency_retry_ms`).
  absl::StatusOr<Slot> Admit(const Tenant& tenant, absl::Time now, int64_t* retry_after_ms,
                             int64_t concurrency_retry_ms = 1000);

  // Requests of `tenant` holding a slot.
  int running(const std::string& tenant);

 private:
  struct State {
    int running = 0;
    double tokens = -1;  // < 0: not started (a full bucket)
    absl::Time refilled;
  };
  void Release(const std::string& tenant);

  std::mutex mu_;
  std::map<std::string, State> states_;  // guarded by mu_
};

// The tokens file as a server holds it: the tenants last read, read again
// on Reload (SIGHUP, and a poll for changed content), so that tokens are
// added, rotated and revoked without a restart. Thread-safe.
class TokensFile {
 public:
  // Reads and parses the file (an error when either fails).
  static absl::StatusOr<std::unique_ptr<TokensFile>> Open(const std::string& path);

  // The tenants in force; calls keep the one they started with.
  std::shared_ptr<const Tenants> current() const;
  // Reads the file again. A file that cannot be read or parsed keeps the
  // tenants in force (and returns why); `*changed` says whether new ones
  // took over (the content differed).
  absl::Status Reload(bool* changed = nullptr);
  const std::string& path() const { return path_; }

 private:
  explicit TokensFile(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable std::mutex mu_;
  std::shared_ptr<const Tenants> tenants_;  // guarded by mu_
  std::string content_hash_;                // guarded by mu_
};

// SHA-256 of the token, as the tokens file keeps it (lowercase hex).
std::string TokenSha256Hex(absl::string_view token);

}  // namespace tensorcheck
