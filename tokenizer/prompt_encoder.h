#pragma once

// Prompt token ids from what a client sends: plain text, or a conversation rendered with the
// model's chat template. The decode workers and the router both use it, so a prompt the router
// tokenises and forwards as token ids is exactly the prompt a worker would have made itself.
//
// Thread-safety: immutable after Create; every method may be called concurrently.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::tokenizer {

class PromptEncoder {
 public:
  // The tokenizer's errors for a bad spec. A chat template of an unknown family is not an
  // error: the encoder then has none (EncodeChat answers FailedPrecondition).
  static absl::StatusOr<PromptEncoder> Create(const TokenizerSpec& spec);

  // Token ids of plain text (control-token text stays text), with BOS when the model wants one.
  std::vector<int32_t> EncodeText(std::string_view text) const;

  // Token ids of a conversation rendered with the chat template (ending with the assistant
  // header when add_generation_prompt). Only the template's own text may yield control tokens:
  // message content is encoded as plain text, so a user who types "<|im_end|>" gets the
  // characters, not the token. The ids equal those of encoding the rendered text with
  // parse_special whenever the content holds no control-token text. FailedPrecondition when
  // there is no chat template; the template's InvalidArgument for bad roles or no messages.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(std::span<const ChatMessage> messages,
                                                  bool add_generation_prompt = true) const;

  // "<pre-tokenizer>:<16 hex digits>", a digest of everything that decides the token ids of a
  // prompt: pre-tokenizer, vocabulary, token types, merges, BOS and unknown ids, BOS handling
  // and the chat template (not the EOS ids, which only end generation). Two processes with
  // equal identities tokenise every prompt alike.
  const std::string& identity() const { return identity_; }

  const Tokenizer& tokenizer() const { return tokenizer_; }
  // nullptr when the model ships no (recognised) chat template.
  const ChatTemplate* chat_template() const {
    return chat_template_ ? &*chat_template_ : nullptr;
  }

 private:
  explicit PromptEncoder(Tokenizer tokenizer) : tokenizer_(std::move(tokenizer)) {}

  Tokenizer tokenizer_;
  std::string identity_;
  std::optional<ChatTemplate> chat_template_;
  std::vector<std::pair<std::string, int32_t>> control_tokens_;  // text, id; longest first
};

}  // namespace kvstrata::tokenizer
