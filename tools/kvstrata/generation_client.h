#pragma once

// A small blocking client of kvstrata.v1.Generation (router or decode worker) and of
// grpc.health.v1.Health, for the request, demo-chat and health commands. The generated gRPC
// headers stay inside generation_client.cc, so the commands compile without them.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvstrata::cli {

struct ClientRequest {
  std::string request_id;  // empty: the server assigns one
  // Exactly one of the two inputs: `text` raw, or `messages` (role, content) formatted with the
  // model's chat template and ending with an assistant header.
  std::string text;
  std::vector<std::pair<std::string, std::string>> messages;
  uint32_t max_tokens = 0;   // 0: up to the context limit
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 1;
  int64_t deadline_ms = 0;  // 0: no deadline
};

// What the last message of the stream said, plus times measured here (client side).
struct ClientResult {
  std::string request_id;
  std::string worker_id;
  std::string finish_reason;  // "stop_token", "length", ... ("" if the stream carried none)
  std::string text;
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_local_tokens = 0;
  uint32_t cached_kvstore_tokens = 0;
  uint32_t uncached_tokens = 0;
  uint32_t recomputed_tokens = 0;
  uint32_t predicted_cached_tokens = 0;
  double ttft_ms = 0;         // call start to the first message carrying tokens
  double last_token_ms = 0;   // call start to the last message carrying tokens
  double total_ms = 0;        // call start to the end of the stream
  double server_ttft_ms = 0;  // as the server measured it (Timings), 0 if absent

  // Tokens generated after the first, per second between the first and the last (0 when
  // fewer than two tokens came): the decode speed as the client sees it.
  double decode_tokens_per_second() const {
    return completion_tokens > 1 && last_token_ms > ttft_ms
               ? (completion_tokens - 1) * 1000.0 / (last_token_ms - ttft_ms)
               : 0.0;
  }
};

// Runs one Generate on `target` (HOST:PORT), calling `on_text` with each text delta as it
// arrives. A non-OK RPC status comes back as the same absl code and message; for a stream that
// failed after output began, what arrived is lost with it.
absl::StatusOr<ClientResult> Generate(const std::string& target, const ClientRequest& request,
                                      const std::function<void(const std::string&)>& on_text);

// grpc.health.v1.Health/Check of `service` ("" = the whole server) on `target`, waiting for
// the connection up to `timeout_ms`. OK when SERVING; UNAVAILABLE with the reported state
// otherwise.
absl::Status CheckHealth(const std::string& target, const std::string& service, int64_t timeout_ms);

// "code NAME: message", the form the commands print a failed RPC in.
std::string DescribeRpcError(const absl::Status& status);

}  // namespace kvstrata::cli
