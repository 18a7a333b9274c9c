// POST /v1/completions and /v1/chat/completions: parse, call Generate, answer whole or stream.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "rpc/status.h"
#include "services/openai/front_internal.h"
#include "services/openai/openai_front.h"
#include "services/openai/openai_request.h"
#include "services/openai/openai_response.h"

namespace kvstrata::openai {

// One Generate call. Shared by the handler, the streamed body and the client-gone callback, so
// that it outlives whichever of them ends last; ending it early cancels it. Counted in the
// front's in-flight requests while it exists.
struct Call {
  explicit Call(OpenAiFront* f) : front(f) {
    std::lock_guard<std::mutex> lock(front->in_flight_mu_);
    ++front->in_flight_;
  }
  ~Call() {
    if (reader != nullptr && !finished) {
      context.TryCancel();
      v1::GenerateResponse rest;
      while (reader->Read(&rest)) {
      }
      reader->Finish();
    }
    std::lock_guard<std::mutex> lock(front->in_flight_mu_);
    if (--front->in_flight_ == 0) front->idle_cv_.notify_all();
  }
  grpc::Status Finish() {
    finished = true;
    return reader->Finish();
  }

  OpenAiFront* const front;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  std::atomic<bool> finished{false};
  std::atomic<bool> client_gone{false};
};

namespace {

constexpr char kTimeoutHeader[] = "X-Kvstrata-Timeout-Ms";

std::string NewRequestId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("%016x%08x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint32_t>(gen));
}

// The server-sent events of one streamed response, produced as the Generate stream arrives.
class SseStream final : public http::ChunkSource {
 public:
  SseStream(std::shared_ptr<Call> call, v1::GenerateResponse first, ResponseBuilder builder,
            Endpoint endpoint, FrontMetrics* metrics)
      : call_(std::move(call)),
        first_(std::move(first)),
        builder_(std::move(builder)),
        endpoint_(endpoint),
        metrics_(metrics) {
    metrics_->streams.Get().Increment();
  }
  ~SseStream() override { metrics_->streams.Get().Decrement(); }

  bool Next(std::string* chunk, bool* aborted) override {
    if (done_) return false;
    if (!first_sent_) {
      first_sent_ = true;
      *chunk = builder_.Events(first_);
      if (!chunk->empty()) return true;
    }
    v1::GenerateResponse message;
    while (call_->reader->Read(&message)) {
      *chunk = builder_.Events(message);
      if (!chunk->empty()) return true;
    }
    done_ = true;
    const grpc::Status status = call_->Finish();
    if (status.ok()) {
      *chunk = ResponseBuilder::Done();
      return true;
    }
    if (call_->client_gone) {  // nobody left to read an error
      *aborted = true;
      return false;
    }
    // Headers are sent: the error goes in the stream, as OpenAI's API does it (no [DONE]).
    fprintf(stderr, "kvstrata-router: http: request %s: stream failed: %s\n",
            first_.request_id().c_str(), status.error_message().c_str());
    *chunk = absl::StrCat(
        "data: ", ErrorBody(ErrorFromStatus(rpc::FromGrpcStatus(status), endpoint_)), "\n\n");
    return true;
  }

 private:
  const std::shared_ptr<Call> call_;
  const v1::GenerateResponse first_;
  ResponseBuilder builder_;
  const Endpoint endpoint_;
  FrontMetrics* const metrics_;
  bool first_sent_ = false;
  bool done_ = false;
};

}  // namespace

http::HttpResponse OpenAiFront::Generate(http::HttpRequest& request, bool chat) {
  const Endpoint endpoint = chat ? Endpoint::kChatCompletions : Endpoint::kCompletions;
  if (request.body_too_large()) {
    return ErrorResponse(HttpError(
        413, absl::StrCat("body: larger than this server accepts (--http_max_body_bytes)"),
        "request_too_large"));
  }
  if (!serving_) {
    return ErrorResponse(HttpError(503, "the router is shutting down; retry", "unavailable"));
  }
  absl::StatusOr<OpenAiRequest> parsed = ParseRequest(endpoint, request.body());
  if (!parsed.ok()) return ErrorResponse(ErrorFromStatus(parsed.status(), endpoint));

  absl::Duration timeout = options_.timeout;
  if (std::optional<std::string> t = request.Header(kTimeoutHeader)) {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(*t, &ms) || ms <= 0) {
      ApiError e = HttpError(400, absl::StrCat(kTimeoutHeader, ": must be a positive integer"));
      e.param = kTimeoutHeader;
      return ErrorResponse(e);
    }
    timeout = std::min(timeout, absl::Milliseconds(ms));
  }
  v1::GenerateRequest& generate = parsed->generate;
  generate.set_request_id(request.Header("X-Request-Id").value_or(NewRequestId()));

  auto call = std::make_shared<Call>(this);
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // The router maps the API key to a tenant (core/tenant_keys.h); the front only passes it on.
  if (std::optional<std::string> auth = request.Header("Authorization")) {
    call->context.AddMetadata("authorization", *auth);
  }
  FrontMetrics* metrics = metrics_.get();
  request.OnClientGone([call, metrics] {
    if (call->finished) return;  // the whole answer is out; the client just left afterwards
    call->client_gone = true;
    metrics->client_gone.Get().Increment();
    call->context.TryCancel();
  });
  v1::Generation::Stub stub(channel_);
  call->reader = stub.Generate(&call->context, generate);

  // Nothing is sent before the first message, so that an error gets its own HTTP status.
  v1::GenerateResponse first;
  if (!call->reader->Read(&first)) {
    grpc::Status status = call->Finish();
    if (status.ok()) {
      status = grpc::Status(grpc::StatusCode::INTERNAL, "the stream ended without a message");
    }
    const ApiError e = ErrorFromStatus(rpc::FromGrpcStatus(status), endpoint);
    if (e.http_status >= 500 && !call->client_gone) {
      fprintf(stderr, "kvstrata-router: http: request %s: %d %s\n", generate.request_id().c_str(),
              e.http_status, e.message.c_str());
    }
    return ErrorResponse(e);
  }

  std::string model = parsed->model;
  std::string fingerprint;
  if (std::optional<ServedModel> served = Served(/*fresh=*/false)) {
    if (model.empty()) model = served->name;
    fingerprint = "fp_" + served->fingerprint.substr(0, 12);
  }
  ResponseBuilder builder({.endpoint = endpoint,
                           .id = absl::StrCat(chat ? "chatcmpl-" : "cmpl-", generate.request_id()),
                           .model = model,
                           .created = absl::ToUnixSeconds(absl::Now()),
                           .system_fingerprint = fingerprint,
                           .logprobs = parsed->logprobs,
                           .include_usage = parsed->include_usage,
                           .tokenizer = &tokenizer_});
  std::vector<std::pair<std::string, std::string>> headers = {
      {"X-Request-Id", generate.request_id()}};
  if (!first.worker_id().empty()) headers.emplace_back("X-Kvstrata-Worker", first.worker_id());

  if (parsed->stream) {
    headers.emplace_back("Cache-Control", "no-cache");
    headers.emplace_back("X-Accel-Buffering", "no");  // proxies: do not hold events back
    return {.status = 200,
            .content_type = "text/event-stream",
            .headers = std::move(headers),
            .stream = std::make_unique<SseStream>(call, std::move(first), std::move(builder),
                                                  endpoint, metrics)};
  }
  builder.Add(first);
  v1::GenerateResponse message;
  while (call->reader->Read(&message)) builder.Add(message);
  const grpc::Status status = call->Finish();
  if (!status.ok()) {  // failed after output began: a partial answer is no answer
    const ApiError e = ErrorFromStatus(rpc::FromGrpcStatus(status), endpoint);
    if (!call->client_gone)
      fprintf(stderr, "kvstrata-router: http: request %s: %d %s\n", generate.request_id().c_str(),
              e.http_status, e.message.c_str());
    return ErrorResponse(e);
  }
  http::HttpResponse response = JsonResponse(200, builder.Body());
  response.headers = std::move(headers);
  return response;
}

}  // namespace kvstrata::openai
