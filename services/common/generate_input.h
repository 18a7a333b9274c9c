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

// request_id (length, printable ASCII), an input present, cache_salt length, and each
// routing.prefix_page_keys entry 16 bytes. InvalidArgument naming the field.
absl::Status ValidateRequestEnvelope(const v1::GenerateRequest& request);

// The prompt's token ids: text encoded (with BOS where the model wants one), token ids checked
// against [0, vocab_size), or the chat rendered with the template (or its contents
// concatenated when apply_chat_template is off). InvalidArgument naming the field for an id out
// of range, an empty conversation or an empty prompt; FailedPrecondition for a template asked
// of a model without one.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& request,
                                                  const tokenizer::PromptEncoder& encoder,
                                                  int vocab_size);

}  // namespace kvstrata
