#pragma once

// The OpenAI-compatible HTTP front of the router: POST /v1/completions, POST
// /v1/chat/completions (whole or streamed as server-sent events), GET /v1/models,
// GET /v1/models/{model}, GET /health.
//
// Each generation request becomes one kvstrata.v1.Generation/Generate call on `channel`, which
// the router opens in process to its own gRPC server (grpc::Server::InProcessChannel): the HTTP
// request takes exactly the path of a gRPC client's (validation, tokenising, routing, retries,
// deadlines, metrics, the request's log line) with no socket in between. The call's deadline is
// the front's timeout (X-Kvstrata-Timeout-Ms may shorten it), and a client that hangs up cancels
// the call, which the router passes on to the worker at once.
//
// Thread-safety: Handle is called concurrently from the HTTP server's connection threads.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "core/http_server.h"
#include "core/metrics.h"
#include "tokenizer/tokenizer.h"

namespace grpc {
class ChannelInterface;
}  // namespace grpc

namespace kvstrata::openai {

struct FrontOptions {
  // Deadline of each generation request; X-Kvstrata-Timeout-Ms may ask for less.
  absl::Duration timeout = absl::Minutes(10);
};

class FrontMetrics;

class OpenAiFront {
 public:
  // `channel` reaches a kvstrata.v1.Generation server (the router's own); `tokenizer` gives the
  // token text of logprobs; `metrics` gets the kvstrata_router_http_* families and must outlive
  // the front.
  OpenAiFront(std::shared_ptr<grpc::ChannelInterface> channel, tokenizer::Tokenizer tokenizer,
              const FrontOptions& options, MetricsRegistry* metrics);
  ~OpenAiFront();

  http::HttpResponse Handle(http::HttpRequest& request);

  // While not serving (shutting down) /health answers 503 and generation requests 503.
  void SetServing(bool serving) { serving_ = serving; }

  // Blocks until no generation request is in flight, or `timeout` passed; true when none is.
  // At shutdown the router waits here before stopping its gRPC server, since stopping it ends
  // the in-process calls at once rather than after the grace period.
  bool WaitIdle(absl::Duration timeout);

 private:
  struct ServedModel {
    std::string name;
    std::string fingerprint;
    uint32_t workers = 0;
  };

  http::HttpResponse Generate(http::HttpRequest& request, bool chat);
  http::HttpResponse Models(const std::string& path);
  http::HttpResponse Health();
  // The pool's model as GetServerInfo reports it (cached once known); nullopt when the router
  // does not answer.
  std::optional<ServedModel> Served(bool fresh);

  const std::shared_ptr<grpc::ChannelInterface> channel_;
  const tokenizer::Tokenizer tokenizer_;
  const FrontOptions options_;
  const int64_t started_unix_;
  std::unique_ptr<FrontMetrics> metrics_;
  std::atomic<bool> serving_{true};

  std::mutex mu_;
  std::optional<ServedModel> served_;  // guarded by mu_; kept once the model is known

  friend struct Call;
  std::mutex in_flight_mu_;
  std::condition_variable idle_cv_;
  int64_t in_flight_ = 0;  // generation calls not yet ended; guarded by in_flight_mu_
};

}  // namespace kvstrata::openai
