#include "rpc/server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace kvstrata::rpc {
namespace {

// Both switches are process-wide and not thread-safe in gRPC, and must be set before a
// ServerBuilder is constructed; a function-local static runs them exactly once.
void InitGrpcServerPluginsOnce() {
  static const bool done = [] {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)done;
}

bool IsUnixSocket(const std::string& address) {
  return absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:");
}

// gRPC 1.51 accepts a numeric port above 65535 and starts on some other port, so a typo such as
// "host:99999" would go unnoticed; catch it here.
absl::Status CheckNumericPort(const std::string& address) {
  if (IsUnixSocket(address)) return absl::OkStatus();
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return absl::OkStatus();
  const absl::string_view port = absl::string_view(address).substr(colon + 1);
  if (port.empty() || !std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) {
    return absl::OkStatus();  // Not a number: gRPC judges it.
  }
  uint64_t value = 0;
  if (!absl::SimpleAtoi(port, &value) || value > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC server: cannot listen on \"", address,
                                                   "\": port out of range 0..65535"));
  }
  return absl::OkStatus();
}

// "host:0" -> "host:<port>", so callers (tests above all) can dial what was bound.
std::string DialableAddress(const std::string& listen_address, int port) {
  if (port <= 0 || IsUnixSocket(listen_address)) return listen_address;
  const size_t colon = listen_address.rfind(':');
  if (colon == std::string::npos) return listen_address;
  return absl::StrCat(listen_address.substr(0, colon + 1), port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  if (options.listen_address.empty()) {
    return absl::InvalidArgumentError("gRPC server: empty listen address");
  }
  for (grpc::Service* service : options.services) {
    if (service == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("gRPC server on \"", options.listen_address, "\": null service"));
    }
  }
  if (absl::Status port = CheckNumericPort(options.listen_address); !port.ok()) return port;
  InitGrpcServerPluginsOnce();

  grpc::ServerBuilder builder;
  // gRPC turns SO_REUSEPORT on by default on Linux, so a second server on a busy port would
  // start and silently share the traffic (a stale replica, a port clash in a config). Refusing
  // the bind makes that a start-up error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (options.max_receive_message_bytes > 0) {
    builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureServerCredentials();
  int selected_port = 0;
  builder.AddListeningPort(options.listen_address, credentials, &selected_port);
  for (grpc::Service* service : options.services) builder.RegisterService(service);

  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  // gRPC reports a failed bind only as a null server (or port 0) and logs the reason itself.
  if (server == nullptr || (selected_port == 0 && !IsUnixSocket(options.listen_address))) {
    return absl::UnavailableError(absl::StrCat(
        "gRPC server: cannot listen on \"", options.listen_address,
        "\" (malformed address, unresolvable host, or port already in use; gRPC's log above "
        "says which)"));
  }
  const int port = IsUnixSocket(options.listen_address) ? 0 : selected_port;
  std::unique_ptr<Server> started(
      new Server(std::move(server), port, DialableAddress(options.listen_address, port)));
  if (!options.health_listen_address.empty()) {
    if (absl::Status s = CheckNumericPort(options.health_listen_address); !s.ok()) return s;
    grpc::ServerBuilder health_builder;
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    int health_port = 0;
    health_builder.AddListeningPort(options.health_listen_address,
                                    grpc::InsecureServerCredentials(), &health_port);
    started->health_server_ = health_builder.BuildAndStart();
    if (started->health_server_ == nullptr ||
        (health_port == 0 && !IsUnixSocket(options.health_listen_address))) {
      return absl::UnavailableError(absl::StrCat("gRPC health server: cannot listen on \"",
                                                 options.health_listen_address, "\""));
    }
    started->health_port_ = health_port;
  }
  return started;
}

Server::Server(std::unique_ptr<grpc::Server> server, int port, std::string address)
    : server_(std::move(server)), port_(port), address_(std::move(address)) {}

Server::~Server() {
  Shutdown(absl::ZeroDuration());
  Wait();
}

void Server::SetServingStatus(const std::string& service, bool serving) {
  for (grpc::Server* s : {server_.get(), health_server_.get()}) {
    if (s == nullptr) continue;
    if (grpc::HealthCheckServiceInterface* health = s->GetHealthCheckService()) {
      health->SetServingStatus(service, serving);
    }
  }
}

void Server::Shutdown(absl::Duration grace) {
  absl::call_once(shutdown_once_, [&] {
    // Probes see NOT_SERVING before connections start being refused.
    for (grpc::Server* s : {server_.get(), health_server_.get()}) {
      if (s == nullptr) continue;
      if (grpc::HealthCheckServiceInterface* health = s->GetHealthCheckService()) {
        health->Shutdown();
      }
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    if (health_server_ != nullptr) health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
  });
}

void Server::Wait() {
  server_->Wait();
  if (health_server_ != nullptr) health_server_->Wait();
}

}  // namespace kvstrata::rpc
