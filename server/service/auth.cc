// Who calls: bearer tokens to tenants (tenants.h), at the start of every
// call of the TensorCheck service (docs/operations.md, "Tenants and
// tokens"). The health service answers without a token.
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/service/service.h"

namespace tensorcheck {

namespace {

constexpr absl::string_view kBearer = "bearer ";

// The token of the first "authorization: Bearer <token>" metadata entry;
// empty when there is none.
std::string BearerToken(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return "";
  const absl::string_view value(it->second.data(), it->second.size());
  if (value.size() <= kBearer.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kBearer.size()), kBearer)) {
    return "";
  }
  return std::string(absl::StripAsciiWhitespace(value.substr(kBearer.size())));
}

std::string RightName(Right right) {
  switch (right) {
    case Right::kVerify:
      return "verify";
    case Right::kDiagnose:
      return "diagnose";
    case Right::kStore:
      return "store";
    case Right::kReflection:
      return "reflection";
  }
  return "?";
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Tenant>> AuthenticateCall(
    const TokensFile& tokens, const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
    std::optional<Right> right, absl::string_view method) {
  const std::string token = BearerToken(metadata);
  if (token.empty()) {
    return absl::UnauthenticatedError(
        "no bearer token: this server needs metadata 'authorization: Bearer <token>' (the "
        "clients' --token or TENSORCHECK_TOKEN)");
  }
  std::shared_ptr<const Tenant> tenant = tokens.current()->FindByToken(token);
  if (tenant == nullptr) {
    return absl::UnauthenticatedError("the bearer token is not one this server knows");
  }
  if (right.has_value() && !tenant->Allows(*right)) {
    return absl::PermissionDeniedError(absl::StrCat("tenant '", tenant->name, "' may not call ",
                                                    method, " (it needs the '", RightName(*right),
                                                    "' right)"));
  }
  return tenant;
}

absl::StatusOr<TensorCheckServiceImpl::Caller> TensorCheckServiceImpl::Authenticate(
    const grpc::CallbackServerContext& context, std::optional<Right> right,
    absl::string_view method) const {
  Caller caller;
  if (options_.tokens == nullptr) {
    caller.store = StoreView{tenant_store_.get(), StoreNamespace{}};
    return caller;
  }
  absl::StatusOr<std::shared_ptr<const Tenant>> tenant =
      AuthenticateCall(*options_.tokens, context.client_metadata(), right, method);
  if (!tenant.ok()) return tenant.status();
  caller.tenant = *std::move(tenant);
  caller.store = StoreView{tenant_store_.get(),
                           StoreNamespace{caller.tenant->name, caller.tenant->quota.stored_bytes}};
  return caller;
}

}  // namespace tensorcheck
