#pragma once

// The transport-security flags every kvstrata service shares (--insecure, --tls_cert,
// --tls_key, --tls_ca, --tls_server_name, --tls_reload_s, --tls_worker_names,
// --tls_router_names, --health_listen), folded into a TransportSecurity and a PeerPolicy. Parsed by
// each service's main after absl::ParseCommandLine; docs/operations.md ("Security") explains them.
//
// Plaintext is never a default: a service started with neither --insecure nor the TLS files
// refuses to start and says which flags to pass.

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "rpc/peer_auth.h"
#include "rpc/tls.h"

namespace kvstrata::rpc {

struct SecurityConfig {
  TransportSecurity transport = TransportSecurity::Insecure();
  PeerPolicy peers;  // enforce == !transport.insecure()
  // --health_listen: grpc.health.v1 alone, in plaintext (rpc::ServerOptions).
  std::string health_listen;
};

// INVALID_ARGUMENT naming the flag: none or both of --insecure and --tls_*, a certificate
// without its key, or files that cannot be read or do not match (TransportSecurity::Tls).
absl::StatusOr<SecurityConfig> SecurityFromFlags();

// For clients (the kvstrata tool): TLS when --tls_ca is given (with --tls_cert and --tls_key
// when the server wants a client certificate), plaintext otherwise.
absl::StatusOr<TransportSecurity> ClientSecurityFromFlags();

// For absl::FlagsUsageConfig::contains_help_flags, so --help lists these flags too.
bool IsSecurityFlagsFile(absl::string_view file);

}  // namespace kvstrata::rpc
