// Chat templates and conversations: the input is a Jinja template source, then a NUL, then
// message contents separated by NULs. Any template must be recognised or refused, and any
// conversation rendered (or refused) with message ends inside the text and in order.

#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/chat_template.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t at; (at = input.find('\0', from)) != std::string::npos; from = at + 1) {
    parts.push_back(input.substr(from, at - from));
  }
  parts.push_back(input.substr(from));
  absl::StatusOr<tokenizer::ChatTemplate> t = tokenizer::ChatTemplate::FromJinja(parts[0]);
  if (!t.ok()) return 0;
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  std::vector<tokenizer::ChatMessage> messages;
  for (size_t i = 1; i < parts.size() && messages.size() < 16; ++i) {
    messages.push_back({kRoles[i % 4], parts[i]});
  }
  if (messages.empty()) messages.push_back({"user", "Hello"});
  for (bool generation_prompt : {false, true}) {
    absl::StatusOr<tokenizer::RenderedChat> r = t->Render(messages, generation_prompt);
    if (!r.ok()) continue;
    FUZZ_CHECK(r->message_ends.size() == messages.size());
    size_t last = r->inserted_system_end;
    FUZZ_CHECK(last <= r->text.size());
    for (size_t end : r->message_ends) {
      FUZZ_CHECK(end >= last && end <= r->text.size());
      last = end;
    }
  }
  return 0;
}

}  // namespace kvstrata
