#include "tokenizer/chat_template.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// SmolLM2-135M-Instruct's template as its GGUF ships it: the newlines inside the string literals
// are real newline characters.
constexpr char kSmolLmTemplate[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";

constexpr char kSmolLmSystem[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// A Llama-3-style template (written for this test): BOS once, headers, trimmed content.
constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

ChatTemplate FromJinjaOrDie(std::string_view source) {
  absl::StatusOr<ChatTemplate> chat_template = ChatTemplate::FromJinja(source);
  EXPECT_TRUE(chat_template.ok()) << chat_template.status();
  return *std::move(chat_template);
}

RenderedChat RenderOrDie(const ChatTemplate& chat_template,
                         const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  absl::StatusOr<RenderedChat> rendered = chat_template.Render(messages, add_generation_prompt);
  EXPECT_TRUE(rendered.ok()) << rendered.status();
  return *std::move(rendered);
}

TEST(ChatTemplateTest, RecognisesSmolLmAndItsDefaultSystemPrompt) {
  const ChatTemplate chat_template = FromJinjaOrDie(kSmolLmTemplate);
  EXPECT_EQ(chat_template.kind(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(chat_template.default_system_prompt(), kSmolLmSystem);
}

TEST(ChatTemplateTest, ReadsEscapedNewlinesInLiterals) {
  // The same template with "\n" escapes in its literals, as some tokenizer_config.json have it.
  const std::string escaped = absl::StrReplaceAll(kSmolLmTemplate, {{"\n", "\\n"}});
  const ChatTemplate chat_template = FromJinjaOrDie(escaped);
  EXPECT_EQ(chat_template.default_system_prompt(), kSmolLmSystem);
}

TEST(ChatTemplateTest, ChatMlInsertsTheDefaultSystemPrompt) {
  const ChatTemplate chat_template = FromJinjaOrDie(kSmolLmTemplate);
  const RenderedChat chat = RenderOrDie(chat_template, {{"user", "Hi!"}},
                                        /*add_generation_prompt=*/true);
  const std::string system = std::string("<|im_start|>system\n") + kSmolLmSystem + "<|im_end|>\n";
  const std::string user = "<|im_start|>user\nHi!<|im_end|>\n";
  EXPECT_EQ(chat.text, system + user + "<|im_start|>assistant\n");
  EXPECT_EQ(chat.inserted_system_end, system.size());
  EXPECT_THAT(chat.message_ends, ElementsAre(system.size() + user.size()));
}

TEST(ChatTemplateTest, ChatMlKeepsTheCallersSystemPrompt) {
  const ChatTemplate chat_template = FromJinjaOrDie(kSmolLmTemplate);
  const RenderedChat chat =
      RenderOrDie(chat_template, {{"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}},
                  /*add_generation_prompt=*/false);
  const std::string turns[] = {"<|im_start|>system\nBe brief.<|im_end|>\n",
                               "<|im_start|>user\n2+2?<|im_end|>\n",
                               "<|im_start|>assistant\n4<|im_end|>\n"};
  EXPECT_EQ(chat.text, turns[0] + turns[1] + turns[2]);
  EXPECT_EQ(chat.inserted_system_end, 0u);
  EXPECT_THAT(chat.message_ends,
              ElementsAre(turns[0].size(), turns[0].size() + turns[1].size(), chat.text.size()));
}

TEST(ChatTemplateTest, ChatMlWithoutADefaultSystemPrompt) {
  const ChatTemplate chat_template = FromJinjaOrDie(
      "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
      "'<|im_end|>\\n'}}{% endfor %}");
  EXPECT_EQ(chat_template.default_system_prompt(), std::nullopt);
  EXPECT_EQ(RenderOrDie(chat_template, {{"user", "x"}}, false).text,
            "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, RendersLlama3) {
  const ChatTemplate chat_template = FromJinjaOrDie(kLlama3Template);
  EXPECT_EQ(chat_template.kind(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(chat_template.default_system_prompt(), std::nullopt);
  EXPECT_TRUE(chat_template.trims_content());
  const RenderedChat chat =
      RenderOrDie(chat_template, {{"system", "Be brief. "}, {"user", "\n Hello\t"}},
                  /*add_generation_prompt=*/true);
  const std::string bos = "<|begin_of_text|>";
  const std::string system = "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>";
  const std::string user = "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>";
  EXPECT_EQ(chat.text, bos + system + user + "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_THAT(chat.message_ends,
              ElementsAre(bos.size() + system.size(), bos.size() + system.size() + user.size()));
}

TEST(ChatTemplateTest, Llama3WithADefaultSystemPrompt) {
  const ChatTemplate chat_template(ChatTemplateKind::kLlama3, "You are terse.");
  const RenderedChat chat = RenderOrDie(chat_template, {{"user", " hi "}}, false);
  const std::string system =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>";
  EXPECT_EQ(chat.text, system + "<|start_header_id|>user<|end_header_id|>\n\n hi <|eot_id|>");
  EXPECT_EQ(chat.inserted_system_end, system.size());

  const ChatTemplate from_source = FromJinjaOrDie(
      "{% if messages[0]['role'] != 'system' %}{{ '<|start_header_id|>system<|end_header_id|>"
      "\\n\\nYou are terse.<|eot_id|>' }}{% endif %}{% for m in messages %}"
      "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] + "
      "'<|eot_id|>' }}{% endfor %}");
  EXPECT_EQ(from_source.default_system_prompt(), "You are terse.");
  EXPECT_FALSE(from_source.trims_content());
}

TEST(ChatTemplateTest, RenderedTextEncodesWithControlTokens) {
  const TokenizerSpec spec = testing::MakeSpec({}, {"<|im_start|>", "<|im_end|>"});
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(spec);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const RenderedChat chat =
      RenderOrDie(FromJinjaOrDie(kSmolLmTemplate), {{"system", "S"}, {"user", "U"}}, true);
  const int32_t start = testing::IdOf(spec, "<|im_start|>");
  const int32_t end = testing::IdOf(spec, "<|im_end|>");
  std::vector<int32_t> want;
  for (const char* turn : {"system\nS", "user\nU"}) {
    want.push_back(start);
    for (const char* c = turn; *c != '\0'; ++c) want.push_back(static_cast<uint8_t>(*c));
    want.push_back(end);
    want.push_back('\n');
  }
  want.push_back(start);
  for (const char c : std::string("assistant\n")) want.push_back(c);
  EXPECT_EQ(tokenizer->Encode(chat.text, /*parse_special=*/true), want);
}

TEST(ChatTemplateTest, RejectsUnknownTemplates) {
  absl::StatusOr<ChatTemplate> empty = ChatTemplate::FromJinja("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("chat_template is empty"));
  absl::StatusOr<ChatTemplate> gemma = ChatTemplate::FromJinja(
      "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>"
      "{% endfor %}");
  EXPECT_EQ(gemma.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(gemma.status().message(), HasSubstr("chat_template is neither ChatML"));
}

TEST(ChatTemplateTest, RejectsBadMessages) {
  const ChatTemplate chat_template = FromJinjaOrDie(kSmolLmTemplate);
  absl::StatusOr<RenderedChat> tool =
      chat_template.Render(std::vector<ChatMessage>{{"user", "a"}, {"tool", "b"}}, true);
  EXPECT_EQ(tool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tool.status().message(), HasSubstr("messages[1].role is 'tool'"));
  absl::StatusOr<RenderedChat> none = chat_template.Render({}, true);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(), HasSubstr("messages is empty"));
}

}  // namespace
}  // namespace kvstrata::tokenizer
