#pragma once

// OpenAI request bodies (POST /v1/completions, POST /v1/chat/completions) as a kvstrata.v1
// GenerateRequest. docs/api.md ("OpenAI-compatible HTTP") lists every field and what it maps to.
//
// Unknown fields are ignored, as OpenAI's API does; known fields that kvstrata cannot honour
// (tools, logit_bias, echo, suffix, best_of > n, multi-prompt batches, non-text content,
// response formats other than text) are refused rather than silently dropped, since ignoring them
// would change what the client gets. Range checks are left to the server (the router and its
// workers apply the kvstrata.v1 contract), whose errors openai_errors.h translates back to
// these parameter names.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kvstrata/v1/generate.pb.h"

namespace kvstrata::openai {

enum class Endpoint { kCompletions, kChatCompletions };

// What completions default max_tokens to when the client gives none (OpenAI's default). Chat
// completions default to "up to the context limit".
inline constexpr uint32_t kCompletionsDefaultMaxTokens = 16;

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // Everything but request_id.
  v1::GenerateRequest generate;
  // The model as the client named it; empty when absent (the server's only model).
  std::string model;
  bool stream = false;
  // stream_options.include_usage: a last chunk with `usage` and no choices.
  bool include_usage = false;
  // Report logprobs (chat: logprobs = true; completions: logprobs given), with this many
  // alternatives per token.
  bool logprobs = false;
  uint32_t top_logprobs = 0;
};

// Parses a request body. Errors are InvalidArgument whose message starts with the OpenAI
// parameter at fault ("temperature: must be a number", "messages[2].content[0].type: ..."), or
// with "body" when the body is not a JSON object.
absl::StatusOr<OpenAiRequest> ParseRequest(Endpoint endpoint, std::string_view body);

}  // namespace kvstrata::openai
