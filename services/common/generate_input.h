#pragma once

// What every kvstrata.v1.Generation server does first with a GenerateRequest, whichever side of
// the router it is on: check the fields that need no model, and turn the input (text, token ids
// or a chat) into prompt token ids. The router and the decode workers share it, so a prompt the
// router tokenises and forwards is exactly the one a worker would have made.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstrata/v1/generate.pb.h"
#include "tokenizer/prompt_encoder.h"

namespace kvstrata {

inline constexpr int kMaxRequestIdBytes = 128;
inline constexpr int kMaxCacheSaltBytes = 256;

// request_id (length, printable ASCII), an input present and cache_salt length.
// InvalidArgument naming the field. The routing hints are not checked: the router overwrites a
// client's, and a worker checks the router's with ValidateRoutingHints.
absl::Status ValidateRequestEnvelope(const v1::GenerateRequest& request);

// Each routing.prefix_page_keys entry 16 bytes; InvalidArgument naming the entry.
absl::Status ValidateRoutingHints(const v1::RoutingHints& routing);

// OK when a prompt of `prompt_tokens` with stop.max_tokens = `max_tokens` (0: up to the limit)
// fits `max_context_tokens`; OutOfRange with the figures otherwise. Router and workers give the
// same answer in the same words.
absl::Status CheckContextLimit(int64_t prompt_tokens, int64_t max_tokens,
                               int64_t max_context_tokens);

// The prompt's token ids: text encoded (with BOS where the model wants one), token ids checked
// against [0, vocab_size), or the chat rendered with the template (or its contents
// concatenated when apply_chat_template is off). InvalidArgument naming the field for an id out
// of range, an empty conversation or an empty prompt; FailedPrecondition for a template asked
// of a model without one.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& request,
                                                  const tokenizer::PromptEncoder& encoder,
                                                  int vocab_size);

}  // namespace kvstrata
