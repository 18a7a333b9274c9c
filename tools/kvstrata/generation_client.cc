#include "tools/kvstrata/generation_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstdlib>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "rpc/security_flags.h"
#include "rpc/status.h"

ABSL_FLAG(std::string, api_key, "",
          "API key sent to the router as \"authorization: Bearer <key>\" (default: "
          "$KVSTRATA_API_KEY). With --tls_ca (and --tls_cert, --tls_key) the tool speaks TLS.");

namespace kvstrata::cli {
namespace {

// A channel per the TLS flags (plaintext without --tls_ca).
absl::StatusOr<std::shared_ptr<grpc::Channel>> Dial(const std::string& target) {
  absl::StatusOr<rpc::TransportSecurity> security = rpc::ClientSecurityFromFlags();
  if (!security.ok()) return security.status();
  return security->Dial(target);
}

std::string ApiKey() {
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (key.empty()) {
    if (const char* env = std::getenv("KVSTRATA_API_KEY")) key = env;
  }
  return key;
}

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// FINISH_REASON_STOP_TOKEN -> "stop_token".
std::string FinishName(v1::FinishReason reason) {
  absl::string_view name = v1::FinishReason_Name(reason);
  absl::ConsumePrefix(&name, "FINISH_REASON_");
  return absl::AsciiStrToLower(name);
}

}  // namespace

absl::StatusOr<ClientResult> Generate(const std::string& target, const ClientRequest& request,
                                      const std::function<void(const std::string&)>& on_text) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial(target);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Generation::NewStub(*channel);

  v1::GenerateRequest proto;
  proto.set_request_id(request.request_id);
  if (request.messages.empty()) {
    proto.set_text(request.text);
  } else {
    v1::ChatInput* chat = proto.mutable_chat();
    chat->set_apply_chat_template(true);
    chat->set_add_generation_prompt(true);
    for (const auto& [role, content] : request.messages) {
      v1::ChatMessage* m = chat->add_messages();
      m->set_role(role);
      m->set_content(content);
    }
  }
  proto.mutable_sampling()->set_temperature(request.temperature);
  proto.mutable_sampling()->set_seed(request.seed);
  proto.mutable_stop()->set_max_tokens(request.max_tokens);

  grpc::ClientContext context;
  if (const std::string key = ApiKey(); !key.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", key));
  }
  if (request.deadline_ms > 0) {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(request.deadline_ms));
  }
  const Clock::time_point start = Clock::now();
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&context, proto);

  ClientResult result;
  v1::GenerateResponse response;
  bool first_token_seen = false;
  while (reader->Read(&response)) {
    if (!response.request_id().empty()) result.request_id = response.request_id();
    if (!response.worker_id().empty()) result.worker_id = response.worker_id();
    if (response.token_ids_size() > 0 || !response.text().empty()) {
      result.last_token_ms = MsSince(start);
      if (!first_token_seen) {
        first_token_seen = true;
        result.ttft_ms = result.last_token_ms;
      }
    }
    if (!response.text().empty()) {
      result.text += response.text();
      on_text(response.text());
    }
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      result.finish_reason = FinishName(response.finish_reason());
    }
    if (response.has_usage()) {
      const v1::Usage& u = response.usage();
      result.prompt_tokens = u.prompt_tokens();
      result.completion_tokens = u.completion_tokens();
      result.cached_local_tokens = u.cached_local_tokens();
      result.cached_kvstore_tokens = u.cached_kvstore_tokens();
      result.uncached_tokens = u.uncached_tokens();
      result.recomputed_tokens = u.recomputed_tokens();
      result.predicted_cached_tokens = u.predicted_cached_tokens();
    }
    if (response.has_timings()) {
      result.server_ttft_ms = response.timings().time_to_first_token_us() / 1000.0;
    }
  }
  const grpc::Status status = reader->Finish();
  result.total_ms = MsSince(start);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  return result;
}

absl::Status CheckHealth(const std::string& target, const std::string& service,
                         int64_t timeout_ms) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Dial(target);
  if (!channel.ok()) return channel.status();
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
  // Wait for the port to open within the deadline rather than failing on the first refusal.
  context.set_wait_for_ready(true);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) return rpc::FromGrpcStatus(status);
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        "health: ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())));
  }
  return absl::OkStatus();
}

std::string DescribeRpcError(const absl::Status& status) {
  return absl::StrCat("code ", static_cast<int>(status.code()), " ",
                      absl::StatusCodeToString(status.code()), ": ", status.message());
}

}  // namespace kvstrata::cli
