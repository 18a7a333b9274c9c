#include "tokenizer/pre_tokenizer.h"

#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/unicode.h"

namespace kvstrata::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr PreTokenizerRule kAllRules[] = {PreTokenizerRule::kGpt2, PreTokenizerRule::kSmolLm,
                                          PreTokenizerRule::kLlama3, PreTokenizerRule::kQwen2};

std::vector<std::string> Words(PreTokenizerRule rule, std::string_view text) {
  std::vector<std::string_view> views;
  PreTokenize(rule, text, views);
  return std::vector<std::string>(views.begin(), views.end());
}

std::vector<std::string> Gpt2(std::string_view text) {
  return Words(PreTokenizerRule::kGpt2, text);
}
std::vector<std::string> SmolLm(std::string_view text) {
  return Words(PreTokenizerRule::kSmolLm, text);
}
std::vector<std::string> Llama3(std::string_view text) {
  return Words(PreTokenizerRule::kLlama3, text);
}
std::vector<std::string> Qwen2(std::string_view text) {
  return Words(PreTokenizerRule::kQwen2, text);
}

TEST(PreTokenizerTest, ParsesRuleNames) {
  for (const PreTokenizerRule rule : kAllRules) {
    absl::StatusOr<PreTokenizerRule> parsed = ParsePreTokenizerRule(PreTokenizerRuleName(rule));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, rule);
  }
  EXPECT_EQ(PreTokenizerRuleName(PreTokenizerRule::kLlama3), "llama-bpe");
  absl::StatusOr<PreTokenizerRule> unknown = ParsePreTokenizerRule("deepseek-llm");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'deepseek-llm'"));
}

TEST(PreTokenizerTest, Gpt2WordsCarryTheirLeadingSpace) {
  EXPECT_THAT(Gpt2("Hello world, again!"), ElementsAre("Hello", " world", ",", " again", "!"));
  EXPECT_THAT(Gpt2("x += 42;"), ElementsAre("x", " +=", " 42", ";"));
}

TEST(PreTokenizerTest, Gpt2ContractionsAreLowercaseOnly) {
  EXPECT_THAT(Gpt2("it's we'll they've I'd"),
              ElementsAre("it", "'s", " we", "'ll", " they", "'ve", " I", "'d"));
  EXPECT_THAT(Gpt2("IT'S"), ElementsAre("IT", "'", "S"));
  // A contraction is taken even inside a longer word, and a spaced apostrophe is punctuation.
  EXPECT_THAT(Gpt2("'sun 'x"), ElementsAre("'s", "un", " '", "x"));
}

TEST(PreTokenizerTest, WhitespaceRunsLeaveTheirLastSpaceToTheNextWord) {
  EXPECT_THAT(Gpt2("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Gpt2("   a"), ElementsAre("  ", " a"));
  // At the end of the text the run is whole.
  EXPECT_THAT(Gpt2("a   "), ElementsAre("a", "   "));
  // Only U+0020 joins a word: a tab or newline before a word stands alone.
  EXPECT_THAT(Gpt2("a\tb"), ElementsAre("a", "\t", "b"));
  EXPECT_THAT(Gpt2("a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(Gpt2("a \t b"), ElementsAre("a", " \t", " b"));
  // Unicode white space counts (U+3000 ideographic space, U+00A0 no-break space).
  EXPECT_THAT(Gpt2("a\u3000\u3000b"), ElementsAre("a", "\u3000", "\u3000", "b"));
  EXPECT_THAT(Gpt2("a\u00a0 b"), ElementsAre("a", "\u00a0", " b"));
}

TEST(PreTokenizerTest, DigitRulesDiffer) {
  EXPECT_THAT(Gpt2("abc 12345"), ElementsAre("abc", " 12345"));
  EXPECT_THAT(SmolLm("abc 12345"), ElementsAre("abc", " ", "1", "2", "3", "4", "5"));
  EXPECT_THAT(Llama3("abc 12345"), ElementsAre("abc", " ", "123", "45"));
  EXPECT_THAT(Qwen2("abc 12345"), ElementsAre("abc", " ", "1", "2", "3", "4", "5"));
  EXPECT_THAT(SmolLm("3.14"), ElementsAre("3", ".", "1", "4"));
  EXPECT_THAT(Llama3("1234567"), ElementsAre("123", "456", "7"));
  // Any \p{N}, not only ASCII digits: Arabic-Indic digits, superscripts, fractions.
  EXPECT_THAT(SmolLm("\u0663\u00b2\u00bd"), ElementsAre("\u0663", "\u00b2", "\u00bd"));
  EXPECT_THAT(Llama3("a\u0663\u0664\u0665\u0666"),
              ElementsAre("a", "\u0663\u0664\u0665", "\u0666"));
}

TEST(PreTokenizerTest, SmolLmRunsTheGpt2RuleBetweenDigits) {
  // The digit ends the stretch, so the spaces before it are a run at the end of input and stay
  // whole; GPT-2 alone would give one space to " 1".
  EXPECT_THAT(SmolLm("a  1"), ElementsAre("a", "  ", "1"));
  EXPECT_THAT(Gpt2("a  1"), ElementsAre("a", " ", " 1"));
  EXPECT_THAT(SmolLm("x1y"), ElementsAre("x", "1", "y"));
}

TEST(PreTokenizerTest, Llama3AttachesOnePrecedingCharacterToLetters) {
  EXPECT_THAT(Llama3("Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Llama3("a\tb"), ElementsAre("a", "\tb"));
  EXPECT_THAT(Llama3("(hello)"), ElementsAre("(hello", ")"));
  EXPECT_THAT(Llama3("a\nb"), ElementsAre("a", "\n", "b"));  // but never a newline
  EXPECT_THAT(Llama3("1st"), ElementsAre("1", "st"));        // nor a digit
}

TEST(PreTokenizerTest, Llama3ContractionsIgnoreCase) {
  EXPECT_THAT(Llama3("I'M SURE HE'S"), ElementsAre("I", "'M", " SURE", " HE", "'S"));
  EXPECT_THAT(Llama3("we'LL"), ElementsAre("we", "'LL"));
  // U+017F LATIN SMALL LETTER LONG S case-folds to 's', as in Oniguruma.
  EXPECT_THAT(Llama3("x'\u017fx"), ElementsAre("x", "'\u017f", "x"));
  // Not a contraction: the apostrophe joins the letters.
  EXPECT_THAT(Llama3("x'Kx"), ElementsAre("x", "'Kx"));
}

TEST(PreTokenizerTest, Llama3KeepsNewlinesWithWhatPrecedesThem) {
  EXPECT_THAT(Llama3("Hello\n\nworld"), ElementsAre("Hello", "\n\n", "world"));
  EXPECT_THAT(Llama3("a  \n b"), ElementsAre("a", "  \n", " b"));
  EXPECT_THAT(Llama3("end.\n\nNext"), ElementsAre("end", ".\n\n", "Next"));
  EXPECT_THAT(Llama3("x \n \n  y"), ElementsAre("x", " \n \n", " ", " y"));
  EXPECT_THAT(Llama3("a\r\n"), ElementsAre("a", "\r\n"));
  EXPECT_THAT(Llama3("a   "), ElementsAre("a", "   "));
}

TEST(PreTokenizerTest, EmojiCjkAndCombiningMarks) {
  // Emoji are neither letters nor numbers: they gather with punctuation.
  EXPECT_THAT(Gpt2("hi \U0001F600\U0001F680!"), ElementsAre("hi", " \U0001F600\U0001F680!"));
  EXPECT_THAT(Llama3("hi \U0001F600"), ElementsAre("hi", " \U0001F600"));
  // CJK ideographs and kana are letters.
  EXPECT_THAT(Gpt2("\u4eca\u65e5\u306f \u6674\u308c"),
              ElementsAre("\u4eca\u65e5\u306f", " \u6674\u308c"));
  // A combining mark (Mn) is not a letter and splits the word it decorates.
  EXPECT_THAT(Gpt2("cafe\u0301s"), ElementsAre("cafe", "\u0301", "s"));
  EXPECT_THAT(Llama3("cafe\u0301s"), ElementsAre("cafe", "\u0301s"));
  // Right-to-left scripts are letters like any other.
  EXPECT_THAT(Gpt2("\u05e9\u05dc\u05d5\u05dd \u05e2"),
              ElementsAre("\u05e9\u05dc\u05d5\u05dd", " \u05e2"));
}

TEST(PreTokenizerTest, IllFormedUtf8IsPunctuation) {
  EXPECT_THAT(Gpt2("ab\xff\xfe"
                   "cd"),
              ElementsAre("ab", "\xff\xfe", "cd"));
  EXPECT_THAT(Gpt2("ab \xc3"), ElementsAre("ab", " \xc3"));  // truncated at the end
  EXPECT_THAT(Llama3("\xe2\x82x"), ElementsAre("\xe2\x82x"));
}

TEST(PreTokenizerTest, EmptyTextHasNoWords) {
  for (const PreTokenizerRule rule : kAllRules) EXPECT_THAT(Words(rule, ""), ElementsAre());
}

TEST(PreTokenizerTest, WordsConcatenateToTheTextOnRandomBytes) {
  std::mt19937 rng(5);
  const std::string alphabet = std::string("ab '\n\r\t 1.\xc3\xa9\xe4\xb8\xad\xff\x80", 18);
  for (const PreTokenizerRule rule : kAllRules) {
    for (int i = 0; i < 500; ++i) {
      std::string text;
      for (int j = 0; j < i % 30; ++j) text.push_back(alphabet[rng() % alphabet.size()]);
      std::vector<std::string_view> words;
      PreTokenize(rule, text, words);
      std::string joined;
      for (const std::string_view word : words) {
        EXPECT_FALSE(word.empty());
        joined += word;
      }
      EXPECT_EQ(joined, text);
    }
  }
}

TEST(UnicodeTest, ClassifiesCodePoints) {
  EXPECT_STREQ(UnicodeTablesVersion(), "16.0.0");
  EXPECT_EQ(ClassifyCodePoint('a'), CodePointClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint(0x4E2D), CodePointClass::kLetter);  // 中
  EXPECT_EQ(ClassifyCodePoint(0x1C89), CodePointClass::kLetter);  // new in Unicode 16.0
  EXPECT_EQ(ClassifyCodePoint('7'), CodePointClass::kNumber);
  EXPECT_EQ(ClassifyCodePoint(0x2167), CodePointClass::kNumber);  // Ⅷ (Nl)
  EXPECT_EQ(ClassifyCodePoint(0x0085), CodePointClass::kWhitespace);
  EXPECT_EQ(ClassifyCodePoint(0x2028), CodePointClass::kWhitespace);
  EXPECT_EQ(ClassifyCodePoint(0x001C), CodePointClass::kOther);   // not White_Space
  EXPECT_EQ(ClassifyCodePoint(0x200B), CodePointClass::kOther);   // zero width space (Cf)
  EXPECT_EQ(ClassifyCodePoint(0x0301), CodePointClass::kOther);   // combining acute (Mn)
  EXPECT_EQ(ClassifyCodePoint(0x1F600), CodePointClass::kOther);  // emoji (So)
  EXPECT_EQ(ClassifyCodePoint(0x10FFFF), CodePointClass::kOther);
}

TEST(UnicodeTest, DecodesUtf8StepByStep) {
  auto step = [](std::string_view s) { return DecodeUtf8Step(s); };
  EXPECT_EQ(step("\xc3\xa9").kind, Utf8Step::Kind::kValid);
  EXPECT_EQ(step("\xc3\xa9").code_point, 0xE9u);
  EXPECT_EQ(step("\xf0\x9f\x98\x80").code_point, 0x1F600u);
  EXPECT_EQ(step("\xf0\x9f").kind, Utf8Step::Kind::kTruncated);
  EXPECT_EQ(step("\xf0\x9f").length, 2);
  EXPECT_EQ(step("\xc0\xaf").kind, Utf8Step::Kind::kInvalid);  // overlong
  EXPECT_EQ(step("\xc0\xaf").length, 1);
  EXPECT_EQ(step("\xed\xa0\x80").kind, Utf8Step::Kind::kInvalid);  // surrogate
  EXPECT_EQ(step("\xe2\x82x").kind, Utf8Step::Kind::kInvalid);     // maximal subpart E2 82
  EXPECT_EQ(step("\xe2\x82x").length, 2);
  EXPECT_EQ(step("\xf4\x90\x80\x80").kind, Utf8Step::Kind::kInvalid);  // above U+10FFFF
}

}  // namespace
}  // namespace kvstrata::tokenizer
