#include "tokenizer/chat_template.h"

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/unicode.h"

namespace kvstrata::tokenizer {
namespace {

constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kBeginOfText = "<|begin_of_text|>";
constexpr std::string_view kStartHeader = "<|start_header_id|>";
constexpr std::string_view kEndHeader = "<|end_header_id|>";
constexpr std::string_view kEotId = "<|eot_id|>";

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

// The value of a Jinja (Python-style) string literal body: the common backslash escapes are
// decoded, any other backslash is kept as written (as Python does).
std::string UnescapeLiteral(std::string_view body) {
  std::string value;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      value.push_back(body[i]);
      continue;
    }
    const char c = body[++i];
    switch (c) {
      case 'n':
        value.push_back('\n');
        break;
      case 't':
        value.push_back('\t');
        break;
      case 'r':
        value.push_back('\r');
        break;
      case '\\':
      case '\'':
      case '"':
        value.push_back(c);
        break;
      default:
        value.push_back('\\');
        value.push_back(c);
    }
  }
  return value;
}

// The string literals inside the {{ ... }} and {% ... %} tags of a Jinja source, decoded.
// Literal text outside tags and {# comments #} are not code, so their quotes are skipped.
std::vector<std::string> StringLiterals(std::string_view source) {
  std::vector<std::string> literals;
  size_t pos = 0;
  while (pos < source.size()) {
    const size_t open = source.find('{', pos);
    if (open == std::string_view::npos || open + 1 >= source.size()) break;
    const char kind = source[open + 1];
    if (kind == '#') {
      const size_t close = source.find("#}", open + 2);
      if (close == std::string_view::npos) break;
      pos = close + 2;
      continue;
    }
    if (kind != '{' && kind != '%') {
      pos = open + 1;
      continue;
    }
    const char closer = kind == '{' ? '}' : '%';
    size_t i = open + 2;
    while (i < source.size()) {
      const char c = source[i];
      if (c == '\'' || c == '"') {
        size_t end = i + 1;
        while (end < source.size() && source[end] != c) end += source[end] == '\\' ? 2 : 1;
        if (end >= source.size()) return literals;  // unterminated: stop looking
        literals.push_back(UnescapeLiteral(source.substr(i + 1, end - i - 1)));
        i = end + 1;
      } else if (c == closer && i + 1 < source.size() && source[i + 1] == '}') {
        i += 2;
        break;
      } else {
        ++i;
      }
    }
    pos = i;
  }
  return literals;
}

// The system prompt a template writes as one literal that opens a system turn with
// `header` and closes it with `end`, e.g. "<|im_start|>system\n...<|im_end|>\n".
std::optional<std::string> DefaultSystemPrompt(std::string_view source, std::string_view header,
                                               std::string_view end) {
  for (const std::string& literal : StringLiterals(source)) {
    const std::string_view text = literal;
    if (!text.starts_with(header)) continue;
    const size_t close = text.find(end, header.size());
    if (close == std::string_view::npos) continue;
    return std::string(text.substr(header.size(), close - header.size()));
  }
  return std::nullopt;
}

// Whether the source pipes something through Jinja's `trim` filter ("| trim", "|trim").
bool UsesTrimFilter(std::string_view source) {
  for (size_t bar = source.find('|'); bar != std::string_view::npos;
       bar = source.find('|', bar + 1)) {
    size_t i = bar + 1;
    while (i < source.size() && source[i] == ' ') ++i;
    if (source.substr(i).starts_with("trim")) return true;
  }
  return false;
}

// Jinja's trim is Python's str.strip(): white space as str.isspace() defines it, which adds the
// information separators U+001C..U+001F to Unicode's White_Space.
std::string_view Trim(std::string_view s) {
  size_t begin = s.size();
  size_t end = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Step step = DecodeUtf8Step(s.substr(pos));
    const bool space = step.kind == Utf8Step::Kind::kValid &&
                       (ClassifyCodePoint(step.code_point) == CodePointClass::kWhitespace ||
                        (step.code_point >= 0x1C && step.code_point <= 0x1F));
    if (!space) {
      if (begin == s.size()) begin = pos;
      end = pos + step.length;
    }
    pos += step.length;
  }
  return begin < end ? s.substr(begin, end - begin) : std::string_view();
}

absl::Status CheckRole(const ChatMessage& message, size_t index) {
  if (message.role == "system" || message.role == "user" || message.role == "assistant") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("messages[", index, "].role is '",
                                                 absl::CHexEscape(message.role),
                                                 "'; expected system, user or assistant"));
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromJinja(std::string_view source) {
  if (source.empty()) return absl::InvalidArgumentError("chat_template is empty");
  if (Contains(source, kImStart) && Contains(source, kImEnd)) {
    return ChatTemplate(ChatTemplateKind::kChatMl,
                        DefaultSystemPrompt(source, "<|im_start|>system\n", kImEnd));
  }
  if (Contains(source, kStartHeader) && Contains(source, kEndHeader) && Contains(source, kEotId)) {
    return ChatTemplate(
        ChatTemplateKind::kLlama3,
        DefaultSystemPrompt(
            source, absl::StrCat(AsAbsl(kStartHeader), "system", AsAbsl(kEndHeader), "\n\n"),
            kEotId),
        UsesTrimFilter(source));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("chat_template is neither ChatML (<|im_start|>, <|im_end|>) nor Llama-3 "
                   "(<|start_header_id|>, <|end_header_id|>, <|eot_id|>); it begins '",
                   absl::CHexEscape(AsAbsl(source.substr(0, 60))), "'"));
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                  bool add_generation_prompt) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  for (size_t i = 0; i < messages.size(); ++i) {
    if (absl::Status status = CheckRole(messages[i], i); !status.ok()) return status;
  }
  RenderedChat chat;
  auto append_turn = [&](std::string_view role, std::string_view content) {
    switch (kind_) {
      case ChatTemplateKind::kChatMl:
        absl::StrAppend(&chat.text, AsAbsl(kImStart), AsAbsl(role), "\n", AsAbsl(content),
                        AsAbsl(kImEnd), "\n");
        break;
      case ChatTemplateKind::kLlama3:
        absl::StrAppend(&chat.text, AsAbsl(kStartHeader), AsAbsl(role), AsAbsl(kEndHeader), "\n\n",
                        AsAbsl(trim_content_ ? Trim(content) : content), AsAbsl(kEotId));
        break;
    }
  };

  switch (kind_) {
    case ChatTemplateKind::kChatMl:
      break;
    case ChatTemplateKind::kLlama3:
      chat.text += kBeginOfText;
      break;
  }
  if (default_system_prompt_.has_value() && messages[0].role != "system") {
    append_turn("system", *default_system_prompt_);
    chat.inserted_system_end = chat.text.size();
  }
  chat.message_ends.reserve(messages.size());
  for (const ChatMessage& message : messages) {
    append_turn(message.role, message.content);
    chat.message_ends.push_back(chat.text.size());
  }
  if (add_generation_prompt) {
    switch (kind_) {
      case ChatTemplateKind::kChatMl:
        absl::StrAppend(&chat.text, AsAbsl(kImStart), "assistant\n");
        break;
      case ChatTemplateKind::kLlama3:
        absl::StrAppend(&chat.text, AsAbsl(kStartHeader), "assistant", AsAbsl(kEndHeader), "\n\n");
        break;
    }
  }
  return chat;
}

}  // namespace kvstrata::tokenizer
