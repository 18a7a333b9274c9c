#pragma once

// Transport security of every kvstrata gRPC endpoint and channel: TLS with a certificate, key
// and CA bundle read from files, or plaintext when asked for explicitly. One TransportSecurity
// per process, built from the flags in main (rpc/security_flags.h), makes both the server
// credentials and the channels to peers, so a process presents one identity everywhere.
//
// The files are watched (gRPC's FileWatcherCertificateProvider): a renewed certificate or CA
// (Kubernetes rewrites a mounted Secret in place) is picked up within the reload interval by
// new handshakes, without a restart; established connections keep the session they have.
// Replace cert and key together (a directory swap, as Kubernetes does): gRPC reads the pair
// atomically and keeps the previous pair while the new files do not match.
//
//   KV_ASSIGN_OR_RETURN(rpc::TransportSecurity security,
//                       rpc::TransportSecurity::Tls({.cert_file = ..., .key_file = ...,
//                                                    .ca_file = ...}));
//   rpc::Server::Start({..., .credentials = security.ServerCredentials(ClientCerts::kRequire)});
//   auto channel = security.Dial("kvstore-0:50061");
//
// Thread-safety: immutable after construction; copies share the certificate watcher.

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvstrata::rpc {

struct TlsFiles {
  // PEM certificate chain and private key this process presents, as a server and as a client.
  // Both or neither; neither makes a client without a certificate (a tool reaching the router).
  std::string cert_file;
  std::string key_file;
  // PEM bundle of the CAs whose certificates this process accepts from its peers. Required.
  std::string ca_file;
  // How often the files are checked for changes. gRPC counts whole seconds (at least 1).
  absl::Duration reload_interval = absl::Seconds(10);
  // The name expected in the server certificates this process dials; empty: the host part of
  // the address dialled. For addresses that are not names in the certificates (an IP, a
  // Kubernetes pod address).
  std::string server_name;
};

// What a server asks of its clients.
enum class ClientCerts {
  // mTLS: a client without a certificate from the CA fails the handshake (kvstore, workers).
  kRequire,
  // A certificate is asked for and verified when given, but a client may come without one and
  // authenticate otherwise, by API key (the router's public API).
  kVerifyIfGiven,
};

class TransportSecurity {
 public:
  // Plaintext: no encryption, no peer identities. For local clusters and tests only.
  static TransportSecurity Insecure();
  // TLS from files. Reads and checks them now, so a wrong path, a certificate that is not PEM,
  // a key that does not belong to the certificate or an expired certificate fail at start-up
  // (INVALID_ARGUMENT / NOT_FOUND naming the file) instead of at the first handshake.
  static absl::StatusOr<TransportSecurity> Tls(const TlsFiles& files);

  bool insecure() const { return provider_ == nullptr; }
  bool has_identity() const { return !files_.cert_file.empty(); }
  const TlsFiles& files() const { return files_; }
  // For the start-up log: "plaintext (--insecure)" or "TLS, cert ..., CA ..., reloaded every
  // 10s"; `client_certs` adds what a server asks of its clients.
  std::string Describe() const;
  std::string Describe(ClientCerts client_certs) const;

  // Server side. Requires has_identity() for TLS (CHECKed: Tls() of a server is validated by
  // the caller's flags).
  std::shared_ptr<grpc::ServerCredentials> ServerCredentials(ClientCerts client_certs) const;
  // Client side: the server's certificate is verified against the CA and its name; this
  // process's certificate, if any, is presented.
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // Arguments every channel to a peer carries (the expected server name, when set).
  grpc::ChannelArguments ChannelArgs() const;
  // A lazily connecting channel to `target` with the above.
  std::shared_ptr<grpc::Channel> Dial(const std::string& target) const;

 private:
  TransportSecurity() = default;

  TlsFiles files_;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider_;
};

}  // namespace kvstrata::rpc
