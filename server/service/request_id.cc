#include "server/service/request_id.h"

#include <cstdint>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tensorcheck {

bool UsableRequestId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdLength) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '/' && c != '-') {
      return false;
    }
  }
  return true;
}

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  const uint64_t hi = absl::Uniform<uint64_t>(gen);
  const uint64_t lo = absl::Uniform<uint64_t>(gen);
  return absl::StrFormat("%016x%016x", hi, lo);
}

std::string AttachRequestId(grpc::CallbackServerContext* context) {
  std::string id;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(kRequestIdKey);
  if (it != metadata.end()) {
    const absl::string_view sent(it->second.data(), it->second.size());
    if (UsableRequestId(sent)) id = std::string(sent);
  }
  if (id.empty()) id = NewRequestId();
  context->AddInitialMetadata(kRequestIdKey, id);
  return id;
}

}  // namespace tensorcheck
