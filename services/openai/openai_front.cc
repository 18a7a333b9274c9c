// The HTTP routes of the OpenAI front: /v1/models, /health, and the dispatch to the generation
// relay (openai_generate.cc).

#include "services/openai/openai_front.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "services/openai/front_internal.h"
#include "services/openai/openai_errors.h"

namespace kvstrata::openai {

using json = nlohmann::json;

http::HttpResponse JsonResponse(int status, const std::string& body) {
  return {.status = status, .content_type = "application/json", .body = body};
}

http::HttpResponse ErrorResponse(const ApiError& error) {
  return JsonResponse(error.http_status, ErrorBody(error));
}

OpenAiFront::OpenAiFront(std::shared_ptr<grpc::ChannelInterface> channel,
                         tokenizer::Tokenizer tokenizer, const FrontOptions& options,
                         MetricsRegistry* metrics)
    : channel_(std::move(channel)),
      tokenizer_(std::move(tokenizer)),
      options_(options),
      started_unix_(absl::ToUnixSeconds(absl::Now())),
      metrics_(std::make_unique<FrontMetrics>(metrics)) {}

OpenAiFront::~OpenAiFront() = default;

bool OpenAiFront::WaitIdle(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(in_flight_mu_);
  return idle_cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + timeout),
                             [&] { return in_flight_ == 0; });
}

http::HttpResponse OpenAiFront::Handle(http::HttpRequest& request) {
  const std::string& path = request.path();
  const std::string& method = request.method();
  std::string endpoint = "other";
  http::HttpResponse response;
  auto allow = [&](const char* allowed) {
    if (method == allowed) return true;
    response = ErrorResponse(HttpError(
        405, absl::StrCat(method, " ", path, ": method not allowed (use ", allowed, ")")));
    response.headers.emplace_back("Allow", allowed);
    return false;
  };
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    const bool chat = path == "/v1/chat/completions";
    endpoint = chat ? "chat_completions" : "completions";
    if (allow("POST")) response = Generate(request, chat);
  } else if (path == "/v1/models" || absl::StartsWith(path, "/v1/models/")) {
    endpoint = "models";
    if (allow("GET")) response = Models(path);
  } else if (path == "/health") {
    endpoint = "health";
    if (allow("GET")) response = Health();
  } else {
    response = ErrorResponse(
        HttpError(404, absl::StrCat("no such path: ", method, " ", path), "not_found"));
  }
  metrics_->requests.With({endpoint, absl::StrCat(response.status)}).Increment();
  return response;
}

std::optional<OpenAiFront::ServedModel> OpenAiFront::Served(bool fresh) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (served_ && !fresh) return served_;
  }
  v1::Generation::Stub stub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ServerInfo info;
  if (!stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok()) return std::nullopt;
  ServedModel m{.name = info.model(),
                .fingerprint = info.model_fingerprint(),
                .workers = info.available_workers()};
  std::lock_guard<std::mutex> lock(mu_);
  if (!m.name.empty()) served_ = m;  // the pool's model never changes once known
  return m;
}

http::HttpResponse OpenAiFront::Models(const std::string& path) {
  const std::optional<ServedModel> served = Served(/*fresh=*/false);
  if (!served) {
    return ErrorResponse(HttpError(503, "the router does not answer; retry", "unavailable"));
  }
  json models = json::array();
  if (!served->name.empty()) {
    models.push_back({{"id", served->name},
                      {"object", "model"},
                      {"created", started_unix_},
                      {"owned_by", "kvstrata"}});
  }
  if (path == "/v1/models") {
    return JsonResponse(200, json{{"object", "list"}, {"data", models}}.dump());
  }
  const std::string id = path.substr(std::string("/v1/models/").size());
  if (!models.empty() && id == served->name) return JsonResponse(200, models[0].dump());
  ApiError e =
      HttpError(404, absl::StrCat("model '", id, "' is not served here"), "model_not_found");
  e.param = "model";
  return ErrorResponse(e);
}

http::HttpResponse OpenAiFront::Health() {
  const std::optional<ServedModel> served = serving_ ? Served(/*fresh=*/true) : std::nullopt;
  if (!served) {
    return JsonResponse(503, json{{"status", "not serving"}}.dump());
  }
  return JsonResponse(
      200,
      json{{"status", "serving"}, {"model", served->name}, {"available_workers", served->workers}}
          .dump());
}

}  // namespace kvstrata::openai
