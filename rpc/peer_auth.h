#pragma once

// Who may call what between the services. Under TLS every peer of the kvstore and of the
// workers shows a client certificate from the cluster CA (rpc/tls.h); its names (the subject
// alternative names and the common name) give it a role. Handlers ask for the role an RPC needs
// in their first line:
//
//   if (grpc::Status s = authorizer->Require(*context, "Put", PeerRole::kWorker); !s.ok()) {
//     return s;
//   }
//
// A caller without a verified certificate gets UNAUTHENTICATED, one whose certificate lacks the
// role PERMISSION_DENIED; both messages name the RPC, the role wanted and the names seen, and
// every refusal counts in kvstrata_<component>_auth_denied_total{rpc,code}. Under plaintext
// (--insecure) nothing is enforced: there are no identities to check.
//
// Thread-safety: immutable after construction; Require may be called from any thread.

#include <grpcpp/security/auth_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/metrics.h"

namespace kvstrata::rpc {

enum class PeerRole {
  kWorker,  // decode workers: publish and pin pages, open transfers, register with the router
  kRouter,  // the router: sends generation requests to workers
};

const char* PeerRoleName(PeerRole role);

struct PeerPolicy {
  // False under plaintext: every call is allowed.
  bool enforce = false;
  // A peer has a role when one of its certificate names equals one of these.
  std::vector<std::string> worker_names = {"kvstrata-decode"};
  std::vector<std::string> router_names = {"kvstrata-router"};
};

// The names a verified peer certificate carries: subject alternative names, then the common
// name. Empty for a plaintext peer or one that presented no certificate.
std::vector<std::string> PeerNames(const grpc::AuthContext& auth);

class PeerAuthorizer {
 public:
  // `registry` may be null (no metric); otherwise the counter family is added to it, named
  // after `component` ("kvstore" -> kvstrata_kvstore_auth_denied_total).
  PeerAuthorizer(PeerPolicy policy, MetricsRegistry* registry, absl::string_view component);

  // OK when `context`'s peer holds `role` (or nothing is enforced); UNAUTHENTICATED or
  // PERMISSION_DENIED otherwise, counted.
  grpc::Status Require(const grpc::ServerContextBase& context, absl::string_view rpc,
                       PeerRole role) const;
  // The same for an already extracted peer (tests, non-gRPC callers).
  grpc::Status RequireNames(const std::vector<std::string>& names, absl::string_view rpc,
                            PeerRole role) const;

  const PeerPolicy& policy() const { return policy_; }

 private:
  PeerPolicy policy_;
  Family<Counter>* denied_ = nullptr;
};

}  // namespace kvstrata::rpc
