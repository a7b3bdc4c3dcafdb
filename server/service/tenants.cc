#include "server/service/tenants.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace tensorcheck {

namespace {

using Json = nlohmann::json;

std::array<unsigned char, 32> Sha256(absl::string_view bytes) {
  std::array<unsigned char, 32> out{};
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), out.data(), &n, EVP_sha256(), nullptr);
  return out;
}

absl::Status Bad(const std::string& field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokens file: ", field, ": ", what));
}

// Every key of `object` is one of `known`.
absl::Status OnlyKnownKeys(const Json& object, const std::string& field,
                           const std::set<std::string>& known) {
  std::vector<std::string> extra;
  for (const auto& [key, value] : object.items()) {
    if (known.count(key) == 0) extra.push_back(key);
  }
  if (extra.empty()) return absl::OkStatus();
  return Bad(field, absl::StrCat("unknown key(s) ", absl::StrJoin(extra, ", "),
                                 "; expected: ", absl::StrJoin(known, ", ")));
}

absl::StatusOr<int64_t> NonNegative(const Json& quota, const char* key, const std::string& field,
                                    int64_t max) {
  if (!quota.contains(key)) return 0;
  const Json& v = quota.at(key);
  const std::string name = absl::StrCat(field, ".", key);
  if (!v.is_number_integer()) return Bad(name, "an integer expected");
  const int64_t n = v.get<int64_t>();
  if (n < 0 || n > max) return Bad(name, absl::StrCat("0..", max, " expected, got ", n));
  return n;
}

bool ValidName(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

constexpr std::pair<const char*, Right> kRights[] = {{"verify", Right::kVerify},
                                                     {"diagnose", Right::kDiagnose},
                                                     {"store", Right::kStore},
                                                     {"reflection", Right::kReflection}};

}  // namespace

std::string TokenSha256Hex(absl::string_view token) {
  const std::array<unsigned char, 32> h = Sha256(token);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
}

absl::StatusOr<std::shared_ptr<const Tenants>> Tenants::Parse(absl::string_view text) {
  Json root;
  try {
    root = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokens file: not JSON: ", e.what()));
  }
  if (!root.is_object()) return Bad("(root)", "an object {\"tenants\": [...]} expected");
  if (absl::Status s = OnlyKnownKeys(root, "(root)", {"tenants"}); !s.ok()) return s;
  if (!root.contains("tenants") || !root["tenants"].is_array()) {
    return Bad("tenants", "an array of tenants expected");
  }
  auto out = std::make_shared<Tenants>();
  std::set<std::string> names;
  std::map<std::array<unsigned char, 32>, std::string> owner_of_hash;
  for (size_t i = 0; i < root["tenants"].size(); ++i) {
    const Json& t = root["tenants"][i];
    const std::string field = absl::StrCat("tenants[", i, "]");
    if (!t.is_object()) return Bad(field, "an object expected");
    if (absl::Status s = OnlyKnownKeys(t, field, {"name", "token_sha256", "rights", "quota"});
        !s.ok()) {
      return s;
    }
    auto tenant = std::make_shared<Tenant>();
    if (!t.contains("name") || !t["name"].is_string() ||
        !ValidName(tenant->name = t["name"].get<std::string>())) {
      return Bad(field + ".name", "1 to 64 characters of [A-Za-z0-9._-] expected");
    }
    if (!names.insert(tenant->name).second) {
      return Bad(field + ".name", absl::StrCat("'", tenant->name, "' is named twice"));
    }
    if (!t.contains("token_sha256") || !t["token_sha256"].is_array() || t["token_sha256"].empty()) {
      return Bad(field + ".token_sha256",
                 "a non-empty array of SHA-256 hashes of tokens expected (printf %s \"$TOKEN\" | "
                 "sha256sum)");
    }
    for (size_t j = 0; j < t["token_sha256"].size(); ++j) {
      const Json& h = t["token_sha256"][j];
      const std::string hfield = absl::StrCat(field, ".token_sha256[", j, "]");
      std::string hex = h.is_string() ? absl::AsciiStrToLower(h.get<std::string>()) : "";
      if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
        return Bad(hfield, "64 hexadecimal digits expected");
      }
      const std::string raw = absl::HexStringToBytes(hex);
      std::array<unsigned char, 32> hash{};
      std::memcpy(hash.data(), raw.data(), hash.size());
      auto [it, fresh] = owner_of_hash.emplace(hash, tenant->name);
      if (!fresh) {
        return Bad(hfield, absl::StrCat("the same token is also tenant '", it->second, "''s"));
      }
      tenant->token_hashes.push_back(hash);
    }
    if (!t.contains("rights")) {
      for (const auto& [name, right] : kRights) tenant->rights |= static_cast<uint32_t>(right);
    } else {
      if (!t["rights"].is_array()) return Bad(field + ".rights", "an array of rights expected");
      for (size_t j = 0; j < t["rights"].size(); ++j) {
        const Json& r = t["rights"][j];
        const std::string name = r.is_string() ? r.get<std::string>() : "";
        const auto* found = std::find_if(std::begin(kRights), std::end(kRights),
                                         [&](const auto& k) { return name == k.first; });
        if (found == std::end(kRights)) {
          return Bad(absl::StrCat(field, ".rights[", j, "]"),
                     "verify, diagnose, store or reflection expected");
        }
        tenant->rights |= static_cast<uint32_t>(found->second);
      }
    }
    if (t.contains("quota")) {
      const Json& q = t["quota"];
      const std::string qfield = field + ".quota";
      if (!q.is_object()) return Bad(qfield, "an object expected");
      if (absl::Status s = OnlyKnownKeys(
              q, qfield, {"stored_bytes", "concurrent_requests", "requests_per_minute"});
          !s.ok()) {
        return s;
      }
      absl::StatusOr<int64_t> v = NonNegative(q, "stored_bytes", qfield, int64_t{1} << 50);
      if (!v.ok()) return v.status();
      tenant->quota.stored_bytes = *v;
      v = NonNegative(q, "concurrent_requests", qfield, 1 << 20);
      if (!v.ok()) return v.status();
      tenant->quota.concurrent_requests = static_cast<int>(*v);
      v = NonNegative(q, "requests_per_minute", qfield, 1 << 24);
      if (!v.ok()) return v.status();
      tenant->quota.requests_per_minute = static_cast<int>(*v);
    }
    for (const auto& hash : tenant->token_hashes) {
      out->hashes_.emplace_back(hash, out->tenants_.size());
    }
    out->tenants_.push_back(std::move(tenant));
  }
  return std::shared_ptr<const Tenants>(std::move(out));
}

namespace {
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("tokens file ", path, ": cannot be read (", std::strerror(errno), ")"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

absl::StatusOr<std::shared_ptr<const Tenants>> Tenants::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<std::shared_ptr<const Tenants>> parsed = Parse(*text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", parsed.status().message()));
  }
  return parsed;
}

absl::StatusOr<std::unique_ptr<TokensFile>> TokensFile::Open(const std::string& path) {
  auto file = std::unique_ptr<TokensFile>(new TokensFile(path));
  bool changed = false;
  if (absl::Status s = file->Reload(&changed); !s.ok()) return s;
  return file;
}

std::shared_ptr<const Tenants> TokensFile::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return tenants_;
}

absl::Status TokensFile::Reload(bool* changed) {
  if (changed != nullptr) *changed = false;
  absl::StatusOr<std::string> text = ReadFile(path_);
  if (!text.ok()) return text.status();
  const std::string hash = TokenSha256Hex(*text);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tenants_ != nullptr && hash == content_hash_) return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<const Tenants>> parsed = Tenants::Parse(*text);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", parsed.status().message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  tenants_ = *std::move(parsed);
  content_hash_ = hash;
  if (changed != nullptr) *changed = true;
  return absl::OkStatus();
}

std::shared_ptr<const Tenant> Tenants::FindByToken(absl::string_view token) const {
  const std::array<unsigned char, 32> hash = Sha256(token);
  // Every hash is compared, whatever matched: no early exit, no branch on
  // the bytes (CRYPTO_memcmp), an arithmetic select of the index.
  size_t found = tenants_.size();
  for (const auto& [known, index] : hashes_) {
    const size_t equal = static_cast<size_t>(CRYPTO_memcmp(known.data(), hash.data(), 32) == 0);
    found = equal * index + (1 - equal) * found;
  }
  return found < tenants_.size() ? tenants_[found] : nullptr;
}

RequestQuotas::Slot& RequestQuotas::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->Release(tenant_);
    owner_ = other.owner_;
    tenant_ = std::move(other.tenant_);
    other.owner_ = nullptr;
  }
  return *this;
}

RequestQuotas::Slot::~Slot() {
  if (owner_ != nullptr) owner_->Release(tenant_);
}

absl::StatusOr<RequestQuotas::Slot> RequestQuotas::Admit(const Tenant& tenant, absl::Time now,
                                                         int64_t* retry_after_ms,
                                                         int64_t concurrency_retry_ms) {
  *retry_after_ms = 0;
  std::lock_guard<std::mutex> lock(mu_);
  State& s = states_[tenant.name];
  const TenantQuota& q = tenant.quota;
  if (q.concurrent_requests > 0 && s.running >= q.concurrent_requests) {
    *retry_after_ms = concurrency_retry_ms;
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant '", tenant.name, "' already runs ", s.running,
                     " requests, its quota of concurrent_requests; retry when one ends"));
  }
  if (q.requests_per_minute > 0) {
    const double capacity = q.requests_per_minute;
    const double per_second = capacity / 60.0;
    if (s.tokens < 0) {
      s.tokens = capacity;
    } else {
      s.tokens =
          std::min(capacity, s.tokens + per_second * absl::ToDoubleSeconds(now - s.refilled));
    }
    s.refilled = now;
    if (s.tokens < 1) {
      // Rounded up (less a rounding error's worth): a retry at the hint passes.
      *retry_after_ms = static_cast<int64_t>(std::ceil((1 - s.tokens) / per_second * 1000 - 1e-6));
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant '", tenant.name, "' is over its quota of ", q.requests_per_minute,
                       " requests per minute; retry in ", *retry_after_ms, " ms"));
    }
    s.tokens -= 1;
  }
  ++s.running;
  return Slot(this, tenant.name);
}

int RequestQuotas::running(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find(tenant);
  return it == states_.end() ? 0 : it->second.running;
}

void RequestQuotas::Release(const std::string& tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  --states_[tenant].running;
}

}  // namespace tensorcheck
