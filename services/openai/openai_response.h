#pragma once

// The Generate stream of one request as OpenAI response objects: a whole `chat.completion` /
// `text_completion`, or the server-sent events of a streamed one (`chat.completion.chunk` /
// `text_completion` chunks, then `data: [DONE]`).
//
// Finish reasons: STOP_TOKEN and STOP_STRING are "stop"; LENGTH is "length"; DEADLINE (the
// request's time ran out during decoding, the output so far is kept) is "length" too, since the
// output was cut short by a limit; ABORT (a kvstrata Abort by request id) is "stop". ERROR never
// reaches a builder: the caller sends an error instead.
//
// usage: prompt_tokens, completion_tokens, total_tokens and prompt_tokens_details.cached_tokens
// (the prompt tokens whose KV came from a cache: the worker's own pages plus the kvstore's).
//
// Not thread-safe: one builder per request, used by the thread that relays it.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kvstrata/v1/generate.pb.h"
#include "services/openai/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata::openai {

struct ResponseOptions {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;                  // "chatcmpl-..." / "cmpl-..."
  std::string model;               // echoed in every object
  int64_t created = 0;             // Unix seconds
  std::string system_fingerprint;  // empty: omitted
  bool logprobs = false;
  bool include_usage = false;
  // Token text for logprobs; borrowed, may be null when logprobs is false.
  const tokenizer::Tokenizer* tokenizer = nullptr;
};

// OpenAI's name for a kvstrata finish reason ("stop", "length"); "" for UNSPECIFIED and ERROR.
std::string FinishReasonName(v1::FinishReason reason);

class ResponseBuilder {
 public:
  explicit ResponseBuilder(ResponseOptions options) : options_(std::move(options)) {}

  // Streaming: the `data: {...}\n\n` events for one message of the Generate stream (empty when
  // it carries nothing a client sees, e.g. tokens whose text is held back).
  std::string Events(const v1::GenerateResponse& message);
  // The event that ends a stream.
  static std::string Done() { return "data: [DONE]\n\n"; }

  // Whole response: every message goes through Add, then Body gives the object.
  void Add(const v1::GenerateResponse& message);
  std::string Body() const;

 private:
  struct Choice {
    std::string text;
    std::vector<v1::TokenLogprob> logprobs;
    v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
    bool started = false;    // streaming: the first chunk (chat: the role) was sent
    int64_t text_bytes = 0;  // completions logprobs: offset of the next token
  };

  const ResponseOptions options_;
  std::map<uint32_t, Choice> choices_;
  std::optional<v1::Usage> usage_;
};

}  // namespace kvstrata::openai
