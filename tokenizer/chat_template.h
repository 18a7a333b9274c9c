#pragma once

// Chat templates: a conversation -> the prompt text a chat model was trained on.
//
// Rather than run Jinja, the two template families in use are recognised from their source
// (TokenizerSpec::chat_template) and rendered natively:
//
//   kChatMl  <|im_start|>{role}\n{content}<|im_end|>\n ...    prompt: <|im_start|>assistant\n
//   kLlama3  <|begin_of_text|> once, then
//            <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
//                                 prompt: <|start_header_id|>assistant<|end_header_id|>\n\n
//
// A template that writes a system turn as one string literal (SmolLM2's "<|im_start|>system\nYou
// are a helpful AI assistant named SmolLM, ...<|im_end|>\n") inserts that text as the system
// prompt when the first message is not a system message; the text is taken from the source,
// never assumed. A Llama-3 template that pipes the content through `trim` gets it trimmed.
//
// The rendered text holds control tokens as text: encode it with parse_special, and add no BOS
// for kLlama3 (the text starts with one). Content is pasted verbatim, so a client that writes
// "<|im_end|>" in a message writes a control token; callers that must prevent that encode
// content without parse_special.
//
// Thread-safety: a ChatTemplate is immutable; Render may be called concurrently.

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvstrata::tokenizer {

enum class ChatTemplateKind { kChatMl, kLlama3 };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

struct RenderedChat {
  std::string text;
  // message_ends[i] is the byte offset in `text` just past message i's block: after its end
  // marker and, for kChatMl, the newline that follows. One entry per input message.
  std::vector<size_t> message_ends;
  // The byte offset just past the system block the template inserted; 0 when none was.
  size_t inserted_system_end = 0;
};

class ChatTemplate {
 public:
  // Recognises the family of a Jinja chat template and extracts its default system prompt.
  // InvalidArgument naming chat_template when the source is empty or of an unknown family.
  static absl::StatusOr<ChatTemplate> FromJinja(std::string_view source);

  // A template of a known family, for callers without a Jinja source.
  ChatTemplate(ChatTemplateKind kind, std::optional<std::string> default_system_prompt,
               bool trim_content = false)
      : kind_(kind),
        default_system_prompt_(std::move(default_system_prompt)),
        trim_content_(trim_content) {}

  // Renders `messages` (at least one; roles system, user or assistant, else InvalidArgument
  // naming the message index) and, with add_generation_prompt, the header of the assistant turn
  // the model is to write.
  absl::StatusOr<RenderedChat> Render(std::span<const ChatMessage> messages,
                                      bool add_generation_prompt) const;

  ChatTemplateKind kind() const { return kind_; }
  const std::optional<std::string>& default_system_prompt() const { return default_system_prompt_; }
  bool trims_content() const { return trim_content_; }

 private:
  ChatTemplateKind kind_;
  std::optional<std::string> default_system_prompt_;
  bool trim_content_;
};

}  // namespace kvstrata::tokenizer
