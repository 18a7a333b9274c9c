#include "rpc/security_flags.h"

#include <cstdint>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

ABSL_FLAG(bool, insecure, false,
          "Serve and dial plaintext gRPC: no encryption, no peer authentication, no roles. "
          "Local clusters and tests only; otherwise pass --tls_cert, --tls_key and --tls_ca.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain this process serves and presents to its peers (mTLS).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM bundle of the CAs whose certificates peers must present (and servers dialled).");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name expected in the certificates of servers dialled (default: the host dialled).");
ABSL_FLAG(uint32_t, tls_reload_s, 10,
          "How often the certificate, key and CA files are checked for changes, in seconds.");
ABSL_FLAG(std::string, tls_worker_names, "kvstrata-decode",
          "Comma-separated certificate names (SAN or CN) that hold the worker role: Put, Pin, "
          "OpenTransfer on a kvstore, registering with the router.");
ABSL_FLAG(std::string, tls_router_names, "kvstrata-router",
          "Comma-separated certificate names (SAN or CN) that hold the router role: sending "
          "generation requests to workers.");
ABSL_FLAG(std::string, health_listen, "",
          "Also serve grpc.health.v1 alone, in plaintext, on this address (for Kubernetes gRPC "
          "probes, which cannot speak TLS). Empty: none.");

namespace kvstrata::rpc {
namespace {

std::vector<std::string> Names(const std::string& list) {
  return absl::StrSplit(list, ',', absl::SkipWhitespace());
}

}  // namespace

absl::StatusOr<SecurityConfig> SecurityFromFlags() {
  SecurityConfig config;
  config.health_listen = absl::GetFlag(FLAGS_health_listen);
  TlsFiles files{.cert_file = absl::GetFlag(FLAGS_tls_cert),
                 .key_file = absl::GetFlag(FLAGS_tls_key),
                 .ca_file = absl::GetFlag(FLAGS_tls_ca),
                 .reload_interval = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_s)),
                 .server_name = absl::GetFlag(FLAGS_tls_server_name)};
  const bool any_tls =
      !files.cert_file.empty() || !files.key_file.empty() || !files.ca_file.empty();
  if (absl::GetFlag(FLAGS_insecure)) {
    if (any_tls) {
      return absl::InvalidArgumentError(
          "--insecure: cannot be combined with --tls_cert, --tls_key or --tls_ca");
    }
    return config;
  }
  if (files.cert_file.empty() || files.key_file.empty() || files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert, --tls_key and --tls_ca are all required for TLS; pass --insecure to serve "
        "plaintext instead (local clusters and tests only)");
  }
  if (absl::GetFlag(FLAGS_tls_reload_s) == 0) {
    return absl::InvalidArgumentError("--tls_reload_s: must be > 0");
  }
  absl::StatusOr<TransportSecurity> transport = TransportSecurity::Tls(files);
  if (!transport.ok()) return transport.status();
  config.transport = *std::move(transport);
  config.peers.enforce = true;
  config.peers.worker_names = Names(absl::GetFlag(FLAGS_tls_worker_names));
  config.peers.router_names = Names(absl::GetFlag(FLAGS_tls_router_names));
  if (config.peers.worker_names.empty()) {
    return absl::InvalidArgumentError("--tls_worker_names: must name at least one certificate");
  }
  if (config.peers.router_names.empty()) {
    return absl::InvalidArgumentError("--tls_router_names: must name at least one certificate");
  }
  return config;
}

absl::StatusOr<TransportSecurity> ClientSecurityFromFlags() {
  TlsFiles files{.cert_file = absl::GetFlag(FLAGS_tls_cert),
                 .key_file = absl::GetFlag(FLAGS_tls_key),
                 .ca_file = absl::GetFlag(FLAGS_tls_ca),
                 .reload_interval = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_s)),
                 .server_name = absl::GetFlag(FLAGS_tls_server_name)};
  if (files.ca_file.empty()) {
    if (!files.cert_file.empty() || !files.key_file.empty()) {
      return absl::InvalidArgumentError("--tls_cert, --tls_key: need --tls_ca");
    }
    return TransportSecurity::Insecure();
  }
  return TransportSecurity::Tls(files);
}

bool IsSecurityFlagsFile(absl::string_view file) {
  return absl::EndsWith(file, "rpc/security_flags.cc");
}

}  // namespace kvstrata::rpc
