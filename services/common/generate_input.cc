#include "services/common/generate_input.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvstrata {

absl::Status ValidateRequestEnvelope(const v1::GenerateRequest& r) {
  if (r.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most ", kMaxRequestIdBytes, " bytes"));
  }
  for (char c : r.request_id()) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError("request_id: must be printable ASCII");
    }
  }
  if (r.input_case() == v1::GenerateRequest::INPUT_NOT_SET) {
    return absl::InvalidArgumentError("input: one of text, token_ids or chat is required");
  }
  if (r.cache_salt().size() > kMaxCacheSaltBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt: at most ", kMaxCacheSaltBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status ValidateRoutingHints(const v1::RoutingHints& routing) {
  for (int i = 0; i < routing.prefix_page_keys_size(); ++i) {
    if (routing.prefix_page_keys(i).size() != 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("routing.prefix_page_keys[", i, "]: must be 16 bytes"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckContextLimit(int64_t prompt_tokens, int64_t max_tokens,
                               int64_t max_context_tokens) {
  if (max_tokens == 0) {
    if (prompt_tokens < max_context_tokens) return absl::OkStatus();
    return absl::OutOfRangeError(absl::StrCat("prompt tokens ", prompt_tokens,
                                              " leave no room to generate within "
                                              "max_context_tokens=",
                                              max_context_tokens));
  }
  if (prompt_tokens + max_tokens <= max_context_tokens) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("prompt tokens ", prompt_tokens, " + stop.max_tokens ",
                                            max_tokens, " exceed max_context_tokens=",
                                            max_context_tokens));
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& request,
                                                  const tokenizer::PromptEncoder& encoder,
                                                  int vocab_size) {
  std::vector<int32_t> prompt;
  switch (request.input_case()) {
    case v1::GenerateRequest::kText:
      if (!request.text().empty()) prompt = encoder.EncodeText(request.text());
      break;
    case v1::GenerateRequest::kTokenIds:
      for (int i = 0; i < request.token_ids().ids_size(); ++i) {
        const uint32_t id = request.token_ids().ids(i);
        if (id >= static_cast<uint32_t>(vocab_size)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "token_ids.ids[", i, "]=", id, " is outside the vocabulary [0, ", vocab_size, ")"));
        }
        prompt.push_back(static_cast<int32_t>(id));
      }
      break;
    case v1::GenerateRequest::kChat: {
      const v1::ChatInput& chat = request.chat();
      if (chat.messages_size() == 0) {
        return absl::InvalidArgumentError("chat.messages: empty conversation");
      }
      if (!chat.apply_chat_template()) {
        std::string text;
        for (const v1::ChatMessage& m : chat.messages()) text += m.content();
        if (!text.empty()) prompt = encoder.EncodeText(text);
        break;
      }
      if (encoder.chat_template() == nullptr) {
        return absl::FailedPreconditionError(
            "chat.apply_chat_template: the model has no chat template");
      }
      std::vector<tokenizer::ChatMessage> messages;
      for (const v1::ChatMessage& m : chat.messages()) messages.push_back({m.role(), m.content()});
      absl::StatusOr<std::vector<int32_t>> ids =
          encoder.EncodeChat(messages, chat.add_generation_prompt());
      if (!ids.ok()) {
        return absl::Status(ids.status().code(),
                            absl::StrCat("chat.messages: ", ids.status().message()));
      }
      prompt = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  if (prompt.empty()) return absl::InvalidArgumentError("input: the prompt is empty");
  return prompt;
}

}  // namespace kvstrata
