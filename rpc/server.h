#pragma once

// The one way kvstrata services start a gRPC server, so that every process answers the standard
// health-checking API and server reflection, binds the same way, and reports bind failures as a
// Status rather than a null pointer.
//
//   KvStoreService store(...);
//   KV_ASSIGN_OR_RETURN(std::unique_ptr<rpc::Server> server,
//                       rpc::Server::Start({.listen_address = config.listen_address,
//                                           .services = {&store}}));
//   server->Wait();

#include <grpcpp/impl/service_type.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvstrata::rpc {

struct ServerOptions {
  // Anything gRPC accepts: "0.0.0.0:50051", "[::]:0", "unix:/run/kvstrata.sock". Port 0 lets
  // the kernel choose a free port; Server::port() reports it.
  std::string listen_address;
  // Services to serve. Borrowed: each must outlive the Server.
  std::vector<grpc::Service*> services;
  // Null: plaintext. TLS: rpc::TransportSecurity::ServerCredentials (rpc/tls.h).
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Also serve grpc.health.v1, alone and in plaintext, on this address, with the same statuses
  // as the main server: Kubernetes' gRPC probes cannot speak TLS, and a port that answers only
  // "SERVING or not" gives nothing away. Empty: none.
  std::string health_listen_address;
  // Largest message accepted, in bytes; 0 keeps gRPC's default of 4 MiB. Page data is streamed in
  // chunks, so this bounds a chunk, not a page.
  int max_receive_message_bytes = 0;
};

// A started gRPC server. Thread-safe: any thread may call SetServingStatus, Shutdown and Wait.
// Destroying it shuts it down at once (in-flight RPCs are cancelled) and waits.
class Server {
 public:
  // Builds and starts a server on options.listen_address with health checking and reflection.
  // Errors, each naming the address: INVALID_ARGUMENT for an empty address, a numeric port
  // above 65535 or a null service; UNAVAILABLE when the address cannot be bound (malformed,
  // unresolvable, or already in use: another process on the port is an error, not a shared
  // port).
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);

  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  ~Server();

  // Port actually bound (the chosen one when 0 was asked); 0 for Unix-domain sockets.
  int port() const { return port_; }
  // The health-only port (ServerOptions::health_listen_address); 0 when there is none.
  int health_port() const { return health_port_; }
  // listen_address with port 0 replaced by the bound port, ready to dial ("127.0.0.1:41235").
  const std::string& address() const { return address_; }

  // Health status reported for `service`: "" is the whole process (SERVING from the start), or a
  // full service name such as "kvstrata.v1.KvStore" (unknown until first set). A worker reports
  // NOT_SERVING while draining so that probes and load balancers move traffic away.
  void SetServingStatus(const std::string& service, bool serving);

  // Reports NOT_SERVING for everything, stops accepting RPCs, lets in-flight ones run for
  // `grace`, then cancels them. Only the first call has an effect.
  void Shutdown(absl::Duration grace);

  // Blocks until the server has shut down.
  void Wait();

  // The underlying server, e.g. for grpc::Server::InProcessChannel in tests.
  grpc::Server& grpc_server() { return *server_; }

 private:
  Server(std::unique_ptr<grpc::Server> server, int port, std::string address);

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;  // null without health_listen_address
  int health_port_ = 0;
  int port_;
  std::string address_;
  absl::once_flag shutdown_once_;
};

}  // namespace kvstrata::rpc
