#include "rpc/peer_auth.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvstrata::rpc {

const char* PeerRoleName(PeerRole role) {
  switch (role) {
    case PeerRole::kWorker:
      return "worker";
    case PeerRole::kRouter:
      return "router";
  }
  return "unknown";
}

std::vector<std::string> PeerNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  // gRPC sets these only for a certificate it verified against the CA.
  for (const char* property : {GRPC_X509_SAN_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
    for (const grpc::string_ref& value : auth.FindPropertyValues(property)) {
      std::string name(value.data(), value.size());
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
  }
  return names;
}

PeerAuthorizer::PeerAuthorizer(PeerPolicy policy, MetricsRegistry* registry,
                               absl::string_view component)
    : policy_(std::move(policy)) {
  if (registry != nullptr) {
    denied_ = &registry->AddCounter(
        absl::StrCat("kvstrata_", component, "_auth_denied_total"),
        "Calls refused because the caller's certificate lacks the role the RPC needs, by RPC "
        "and status code.",
        {"rpc", "code"});
  }
}

grpc::Status PeerAuthorizer::Require(const grpc::ServerContextBase& context, absl::string_view rpc,
                                     PeerRole role) const {
  if (!policy_.enforce) return grpc::Status::OK;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return RequireNames(auth ? PeerNames(*auth) : std::vector<std::string>{}, rpc, role);
}

grpc::Status PeerAuthorizer::RequireNames(const std::vector<std::string>& names,
                                          absl::string_view rpc, PeerRole role) const {
  if (!policy_.enforce) return grpc::Status::OK;
  const std::vector<std::string>& allowed =
      role == PeerRole::kWorker ? policy_.worker_names : policy_.router_names;
  for (const std::string& name : names) {
    if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) {
      return grpc::Status::OK;
    }
  }
  const bool anonymous = names.empty();
  const grpc::StatusCode code =
      anonymous ? grpc::StatusCode::UNAUTHENTICATED : grpc::StatusCode::PERMISSION_DENIED;
  const std::string message =
      anonymous
          ? absl::StrCat(rpc, " needs the ", PeerRoleName(role),
                         " role: the caller presented no verified client certificate (wanted a "
                         "certificate naming one of: ",
                         absl::StrJoin(allowed, ", "), ")")
          : absl::StrCat(rpc, " needs the ", PeerRoleName(role),
                         " role: the caller's certificate "
                         "names ",
                         absl::StrJoin(names, ", "), ", none of: ", absl::StrJoin(allowed, ", "));
  if (denied_ != nullptr) {
    denied_->With({std::string(rpc), anonymous ? "UNAUTHENTICATED" : "PERMISSION_DENIED"})
        .Increment();
  }
  fprintf(stderr, "auth: refused %.*s: %s\n", static_cast<int>(rpc.size()), rpc.data(),
          message.c_str());
  return grpc::Status(code, message);
}

}  // namespace kvstrata::rpc
