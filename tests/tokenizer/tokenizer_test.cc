#include "tokenizer/tokenizer.h"

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/test_vocab.h"
#include "tokenizer/unicode.h"

namespace kvstrata::tokenizer {
namespace {

using ::kvstrata::tokenizer::testing::IdOf;
using ::kvstrata::tokenizer::testing::IdOfBytes;
using ::kvstrata::tokenizer::testing::MakeSpec;
using ::kvstrata::tokenizer::testing::Spell;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Escape(std::string_view s) {
  return absl::CHexEscape(absl::string_view(s.data(), s.size()));
}

Tokenizer CreateOrDie(const TokenizerSpec& spec) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(spec);
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return *std::move(tokenizer);
}

std::vector<int32_t> ByteIds(std::string_view bytes) {
  std::vector<int32_t> ids;
  for (const char c : bytes) ids.push_back(static_cast<uint8_t>(c));
  return ids;
}

// --- BPE merges -------------------------------------------------------------------------------

TEST(TokenizerTest, MergesApplyByRankNotByPosition) {
  // "b c" outranks "a b": the right pair merges first, and "a" is left alone.
  const TokenizerSpec spec = MakeSpec({{"b", "c"}, {"a", "b"}});
  EXPECT_THAT(CreateOrDie(spec).Encode("abc", /*parse_special=*/false),
              ElementsAre('a', IdOfBytes(spec, "bc")));
  // The same merges in the other order give the other split.
  const TokenizerSpec swapped = MakeSpec({{"a", "b"}, {"b", "c"}});
  EXPECT_THAT(CreateOrDie(swapped).Encode("abc", /*parse_special=*/false),
              ElementsAre(IdOfBytes(swapped, "ab"), 'c'));
}

TEST(TokenizerTest, EqualRanksMergeLeftmostFirst) {
  const TokenizerSpec spec = MakeSpec({{"a", "a"}});
  EXPECT_THAT(CreateOrDie(spec).Encode("aaa", false), ElementsAre(IdOfBytes(spec, "aa"), 'a'));
  EXPECT_THAT(CreateOrDie(spec).Encode("aaaa", false),
              ElementsAre(IdOfBytes(spec, "aa"), IdOfBytes(spec, "aa")));
}

TEST(TokenizerTest, MergesChainIntoLongerTokens) {
  const TokenizerSpec spec =
      MakeSpec({{"h", "e"}, {" ", "t"}, {" t", "he"}, {"c", "d"}, {"a", "b"}, {"ab", "cd"}});
  const Tokenizer tokenizer = CreateOrDie(spec);
  EXPECT_THAT(tokenizer.Encode(" the", false), ElementsAre(IdOfBytes(spec, " the")));
  EXPECT_THAT(tokenizer.Encode("abcd", false), ElementsAre(IdOfBytes(spec, "abcd")));
  // Merges never cross words: " the" and "abcd" are separate words of "x the abcd".
  EXPECT_THAT(tokenizer.Encode("x the abcd", false),
              ElementsAre('x', IdOfBytes(spec, " the"), ' ', IdOfBytes(spec, "abcd")));
  EXPECT_EQ(tokenizer.TokenBytes(IdOfBytes(spec, " the")), " the");
  EXPECT_EQ(tokenizer.Decode(tokenizer.Encode("x the abcd", false)), "x the abcd");
}

TEST(TokenizerTest, LlamaBpeTakesAWholeWordTokenWithoutMerging) {
  // "abc" is a token no merge reaches; Llama 3 (ignore_merges) uses it, GPT-2 cannot.
  TokenizerSpec spec = MakeSpec({{"a", "b"}});
  spec.tokens.push_back(Spell("abc"));
  spec.token_types.push_back(1);
  const int32_t abc = static_cast<int32_t>(spec.tokens.size()) - 1;
  EXPECT_THAT(CreateOrDie(spec).Encode("abc", false), ElementsAre(IdOfBytes(spec, "ab"), 'c'));
  spec.pre = "llama-bpe";
  EXPECT_THAT(CreateOrDie(spec).Encode("abc", false), ElementsAre(abc));
  spec.pre = "qwen2";
  EXPECT_THAT(CreateOrDie(spec).Encode("abc", false), ElementsAre(IdOfBytes(spec, "ab"), 'c'));
}

// --- Any bytes encode ---------------------------------------------------------------------------

TEST(TokenizerTest, EveryByteEncodesAndDecodesBack) {
  const Tokenizer tokenizer = CreateOrDie(MakeSpec({}));
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes.push_back(static_cast<char>(b));
  const std::vector<int32_t> ids = tokenizer.Encode(all_bytes, false);
  EXPECT_EQ(ids, ByteIds(all_bytes));  // no merges: one token per byte, in order
  EXPECT_EQ(tokenizer.Decode(ids), all_bytes);
}

TEST(TokenizerTest, InvalidUtf8EncodesAsItsBytes) {
  const Tokenizer tokenizer = CreateOrDie(MakeSpec({{"a", "b"}}));
  for (const std::string_view text :
       {std::string_view("\xff\xfe"), std::string_view("ab\xc3"), std::string_view("\xe2\x82"),
        std::string_view("\xc0\xaf overlong"), std::string_view("\xed\xa0\x80 surrogate"),
        std::string_view("\xf4\x90\x80\x80 too big"), std::string_view("x\x80\x80y")}) {
    const std::vector<int32_t> ids = tokenizer.Encode(text, /*parse_special=*/true);
    EXPECT_EQ(tokenizer.Decode(ids), text) << Escape(text);
  }
  EXPECT_THAT(tokenizer.Encode("ab\xff", false), ElementsAre(256, 0xFF));
}

TEST(TokenizerTest, BytesWithoutASymbolAreDroppedBeforeMerging) {
  // Like SmolLM2's vocabulary, which has no token for byte 0x04.
  TokenizerSpec spec = MakeSpec({{"(", ")"}});
  spec.tokens[0x04] = "unused";
  spec.token_types[0x04] = 5;
  const Tokenizer tokenizer = CreateOrDie(spec);
  EXPECT_THAT(tokenizer.unencodable_bytes(), ElementsAre(0x04));
  // Dropped, and the bytes around it merge as if it had never been there (as `tokenizers`).
  EXPECT_THAT(tokenizer.Encode("(\x04)", false), ElementsAre(IdOfBytes(spec, "()")));
  EXPECT_THAT(tokenizer.Encode("\x04", false), ElementsAre());
}

// --- Special tokens ------------------------------------------------------------------------------

TEST(TokenizerTest, ControlTokensAreMatchedOnlyWhenParsingSpecials) {
  const TokenizerSpec spec = MakeSpec({{"h", "i"}}, {"<|im_start|>", "<|im_end|>"});
  const Tokenizer tokenizer = CreateOrDie(spec);
  const int32_t start = IdOf(spec, "<|im_start|>");
  const int32_t end = IdOf(spec, "<|im_end|>");
  const int32_t hi = IdOfBytes(spec, "hi");
  EXPECT_THAT(tokenizer.Encode("<|im_start|>hi<|im_end|>", /*parse_special=*/true),
              ElementsAre(start, hi, end));
  // Without parse_special the same text is plain bytes: "<|" ... "|>".
  const std::vector<int32_t> plain = tokenizer.Encode("<|im_start|>hi", /*parse_special=*/false);
  EXPECT_EQ(plain.size(), 13u);
  EXPECT_EQ(plain.front(), '<');
  EXPECT_EQ(plain.back(), hi);
  EXPECT_TRUE(tokenizer.IsControl(start));
  EXPECT_FALSE(tokenizer.IsControl(hi));
  EXPECT_EQ(tokenizer.Decode(std::vector<int32_t>{start, hi, end}), "<|im_start|>hi<|im_end|>");
  EXPECT_EQ(tokenizer.Decode(std::vector<int32_t>{start, hi, end}, /*skip_control=*/true), "hi");
}

TEST(TokenizerTest, SpecialsSplitTextBeforePreTokenizing) {
  const TokenizerSpec spec = MakeSpec({{" ", "x"}}, {"<s>"});
  const Tokenizer tokenizer = CreateOrDie(spec);
  // " x" would be one word, but the special between them separates " " from "x".
  EXPECT_THAT(tokenizer.Encode(" x", true), ElementsAre(IdOfBytes(spec, " x")));
  EXPECT_THAT(tokenizer.Encode(" <s>x", true), ElementsAre(' ', IdOf(spec, "<s>"), 'x'));
}

TEST(TokenizerTest, SpecialsMatchLeftmostThenLongest) {
  const TokenizerSpec spec = MakeSpec({}, {"<a>", "<a><b>", "a><"});
  const Tokenizer tokenizer = CreateOrDie(spec);
  EXPECT_THAT(tokenizer.Encode("<a><b>", true), ElementsAre(IdOf(spec, "<a><b>")));
  EXPECT_THAT(tokenizer.Encode("<a><c>", true), ElementsAre(IdOf(spec, "<a>"), '<', 'c', '>'));
  EXPECT_THAT(tokenizer.Encode("x<a><", true), ElementsAre('x', IdOf(spec, "<a>"), '<'));
}

TEST(TokenizerTest, UserDefinedTokensAreAlwaysMatched) {
  const TokenizerSpec spec = MakeSpec({}, {}, {"<tool>"});
  const Tokenizer tokenizer = CreateOrDie(spec);
  EXPECT_THAT(tokenizer.Encode("a<tool>", /*parse_special=*/false),
              ElementsAre('a', IdOf(spec, "<tool>")));
  EXPECT_FALSE(tokenizer.IsControl(IdOf(spec, "<tool>")));
}

TEST(TokenizerTest, LooksUpTokensByTheirText) {
  TokenizerSpec spec = MakeSpec({{"\n", "\n"}}, {"<|im_end|>"});
  // A normal token with the same bytes as the control token loses the lookup.
  spec.tokens.push_back("<|im_end|>");
  spec.token_types.push_back(1);
  const Tokenizer tokenizer = CreateOrDie(spec);
  EXPECT_EQ(tokenizer.TokenIdForText("<|im_end|>"), IdOf(spec, "<|im_end|>"));
  EXPECT_EQ(tokenizer.TokenIdForText("\n\n"), IdOfBytes(spec, "\n\n"));
  EXPECT_EQ(tokenizer.TokenIdForText(" "), ' ');
  EXPECT_EQ(tokenizer.TokenIdForText("no such token"), std::nullopt);
}

TEST(TokenizerTest, KnowsItsSpecialIds) {
  TokenizerSpec spec = MakeSpec({}, {"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  spec.bos_id = IdOf(spec, "<|im_start|>");
  spec.eos_id = IdOf(spec, "<|endoftext|>");
  spec.end_of_generation_ids = {IdOf(spec, "<|im_end|>")};
  spec.add_bos = true;
  const Tokenizer tokenizer = CreateOrDie(spec);
  EXPECT_EQ(tokenizer.bos_id(), IdOf(spec, "<|im_start|>"));
  EXPECT_EQ(tokenizer.eos_id(), IdOf(spec, "<|endoftext|>"));
  EXPECT_TRUE(tokenizer.add_bos());
  EXPECT_TRUE(tokenizer.IsEndOfGeneration(IdOf(spec, "<|endoftext|>")));
  EXPECT_TRUE(tokenizer.IsEndOfGeneration(IdOf(spec, "<|im_end|>")));
  EXPECT_FALSE(tokenizer.IsEndOfGeneration(IdOf(spec, "<|im_start|>")));
  EXPECT_FALSE(tokenizer.IsEndOfGeneration(-1));
  EXPECT_FALSE(tokenizer.IsEndOfGeneration(100000));
  EXPECT_EQ(tokenizer.vocab_size(), 259);
  EXPECT_EQ(tokenizer.pre_tokenizer_rule(), PreTokenizerRule::kGpt2);

  const Tokenizer no_specials = CreateOrDie(MakeSpec({}));
  EXPECT_EQ(no_specials.bos_id(), std::nullopt);
  EXPECT_EQ(no_specials.eos_id(), std::nullopt);
}

TEST(TokenizerTest, DecodeShowsOutOfRangeIds) {
  const Tokenizer tokenizer = CreateOrDie(MakeSpec({}));
  EXPECT_EQ(tokenizer.Decode(std::vector<int32_t>{'a', -5, 'b', 1000}),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(tokenizer.TokenBytes(-1), "");
  EXPECT_EQ(tokenizer.TokenBytes(256), "");
}

TEST(TokenizerTest, ByteTokensInAngleBracketFormDecodeToTheirByte) {
  TokenizerSpec spec = MakeSpec({});
  spec.tokens.push_back("<0x0A>");
  spec.token_types.push_back(6);
  EXPECT_EQ(CreateOrDie(spec).TokenBytes(256), "\n");
}

// --- Round trips ---------------------------------------------------------------------------------

// Random text: Unicode scalar values from every plane, weighted toward ASCII and white space so
// that words, runs and contractions all occur.
std::string RandomUnicode(std::mt19937& rng, int length) {
  std::string text;
  std::uniform_int_distribution<int> kind(0, 9);
  for (int i = 0; i < length; ++i) {
    char32_t cp = 0;
    switch (kind(rng)) {
      case 0:
      case 1:
        cp = std::uniform_int_distribution<char32_t>(0x20, 0x7E)(rng);
        break;
      case 2:
        cp = U" \t\n\r'0123456789"[std::uniform_int_distribution<int>(0, 15)(rng)];
        break;
      case 3:
        cp = std::uniform_int_distribution<char32_t>(0x80, 0x7FF)(rng);
        break;
      case 4:
      case 5:
        cp = std::uniform_int_distribution<char32_t>(0x800, 0xFFFF)(rng);
        break;
      case 6:
        cp = std::uniform_int_distribution<char32_t>(0x1F300, 0x1FAFF)(rng);  // emoji
        break;
      case 7:
        cp = std::uniform_int_distribution<char32_t>(0x10000, 0x10FFFF)(rng);
        break;
      default:
        cp = std::uniform_int_distribution<char32_t>(0x0300, 0x036F)(rng);  // combining marks
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // not a scalar value
    AppendUtf8(cp, text);
  }
  return text;
}

TEST(TokenizerTest, EncodeThenDecodeIsIdentityOnRandomUnicode) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {" ", "t"}, {"h", "e"}, {" t", "he"}, {"\xc3", "\xa9"}, {"1", "2"}, {"\n", "\n"}, {" ", " "}};
  std::mt19937 rng(7);
  for (const char* pre : {"gpt2", "smollm", "llama-bpe", "qwen2"}) {
    const Tokenizer tokenizer = CreateOrDie(MakeSpec(merges, {"<|im_end|>"}, {}, pre));
    for (int i = 0; i < 300; ++i) {
      std::string text = RandomUnicode(rng, i % 40);
      if (i % 7 == 0) text += "<|im_end|> the";
      for (const bool parse_special : {false, true}) {
        EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text, parse_special)), text)
            << pre << ": " << Escape(text);
      }
    }
  }
}

TEST(TokenizerTest, EncodeThenDecodeIsIdentityOnRandomBytes) {
  std::mt19937 rng(11);
  const Tokenizer tokenizer = CreateOrDie(MakeSpec({{" ", "t"}, {"\xc3", "\xa9"}}));
  for (int i = 0; i < 300; ++i) {
    std::string text;
    for (int j = 0; j < i % 50; ++j) text.push_back(static_cast<char>(rng()));
    EXPECT_EQ(tokenizer.Decode(tokenizer.Encode(text, true)), text) << Escape(text);
  }
}

// --- Streaming decode ----------------------------------------------------------------------------

TEST(StreamingDecoderTest, HoldsBackPartialCharacters) {
  const Tokenizer tokenizer = CreateOrDie(MakeSpec({}));
  StreamingDecoder decoder(tokenizer);
  // "é" is C3 A9, "😀" is F0 9F 98 80: one byte token each.
  EXPECT_EQ(decoder.Feed('a'), "a");
  EXPECT_EQ(decoder.Feed(0xC3), "");
  EXPECT_EQ(decoder.Feed(0xA9), "\xC3\xA9");
  EXPECT_EQ(decoder.Feed(0xF0), "");
  EXPECT_EQ(decoder.Feed(0x9F), "");
  EXPECT_EQ(decoder.Feed(0x98), "");
  EXPECT_EQ(decoder.Feed(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(decoder.Flush(), "");
}

TEST(StreamingDecoderTest, TokensEndingMidCharacterJoinUp) {
  // A token holding the end of one character and the start of the next.
  const TokenizerSpec spec = MakeSpec({{"\xA9", "\xC3"}});
  const Tokenizer tokenizer = CreateOrDie(spec);
  StreamingDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.Feed(0xC3), "");
  EXPECT_EQ(decoder.Feed(IdOfBytes(spec, "\xA9\xC3")), "\xC3\xA9");
  EXPECT_EQ(decoder.Feed(0xA9), "\xC3\xA9");
}

TEST(StreamingDecoderTest, ReplacesInvalidAndUnfinishedSequences) {
  const Tokenizer tokenizer = CreateOrDie(MakeSpec({}, {"<|im_end|>"}));
  StreamingDecoder decoder(tokenizer);
  EXPECT_EQ(decoder.Feed(0xFF), "\xEF\xBF\xBD");  // never valid
  EXPECT_EQ(decoder.Feed(0xE2), "");              // may become valid
  EXPECT_EQ(decoder.Feed('x'), "\xEF\xBF\xBDx");  // did not
  EXPECT_EQ(decoder.Feed(0xE2), "");
  EXPECT_EQ(decoder.Feed(0x82), "");
  EXPECT_EQ(decoder.Flush(), "\xEF\xBF\xBD");  // unfinished at the end
  EXPECT_EQ(decoder.Flush(), "");
  EXPECT_EQ(decoder.Feed(5000), "\xEF\xBF\xBD");  // out-of-range id
  EXPECT_EQ(decoder.Feed(256), "<|im_end|>");

  StreamingDecoder skipping(tokenizer, /*skip_control=*/true);
  EXPECT_EQ(skipping.Feed(256), "");
  EXPECT_EQ(skipping.Feed('y'), "y");
}

TEST(StreamingDecoderTest, MatchesDecodeOnRandomUnicode) {
  const Tokenizer tokenizer =
      CreateOrDie(MakeSpec({{"\xC3", "\xA9"}, {"\xA9", "\xC3"}, {"\xF0", "\x9F"}, {" ", "t"}}));
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const std::string text = RandomUnicode(rng, 30);
    StreamingDecoder decoder(tokenizer);
    std::string streamed;
    for (const int32_t id : tokenizer.Encode(text, false)) {
      const std::string piece = decoder.Feed(id);
      // Every piece is whole characters.
      for (size_t pos = 0; pos < piece.size();) {
        const Utf8Step step = DecodeUtf8Step(std::string_view(piece).substr(pos));
        ASSERT_EQ(step.kind, Utf8Step::Kind::kValid) << Escape(piece);
        pos += step.length;
      }
      streamed += piece;
    }
    streamed += decoder.Flush();
    EXPECT_EQ(streamed, text);
  }
}

// --- Validation ----------------------------------------------------------------------------------

MATCHER_P(IsInvalidArgumentWith, substring, "") {
  return arg.status().code() == absl::StatusCode::kInvalidArgument &&
         std::string(arg.status().message()).find(substring) != std::string::npos;
}

TEST(TokenizerCreateTest, RejectsUnsupportedModelAndRule) {
  TokenizerSpec spec = MakeSpec({});
  spec.model = "llama";
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.model is 'llama'"));
  spec = MakeSpec({});
  spec.pre = "falcon";
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.pre"));
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("'falcon'"));
}

TEST(TokenizerCreateTest, RejectsBadTokensAndTypes) {
  TokenizerSpec spec = MakeSpec({});
  spec.token_types.pop_back();
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.token_types has 255"));

  spec = MakeSpec({});
  spec.token_types[7] = 9;
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.token_types[7] is 9"));

  spec = MakeSpec({});
  spec.tokens.push_back("a b");  // a real space is not in the byte-level alphabet
  spec.token_types.push_back(1);
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.tokens[256] 'a b'"));

  spec = MakeSpec({});
  spec.tokens.clear();
  spec.token_types.clear();
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.tokens has 0"));
}

TEST(TokenizerCreateTest, RejectsBadMerges) {
  TokenizerSpec spec = MakeSpec({{"a", "b"}});
  spec.merges.push_back("ab");
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.merges[1] 'ab'"));
  spec.merges.back() = "a b c";
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("one space"));
  spec.merges.back() = "a xyz";
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("'xyz' is not a token"));
  spec.merges.back() = "b c";
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("'bc' is not a token"));
}

TEST(TokenizerCreateTest, RejectsSpecialIdsOutOfRange) {
  TokenizerSpec spec = MakeSpec({});
  spec.bos_id = 256;
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.bos_id is 256"));
  spec = MakeSpec({});
  spec.eos_id = -2;
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.eos_id is -2"));
  spec = MakeSpec({});
  spec.padding_id = 999;
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("TokenizerSpec.padding_id"));
  spec = MakeSpec({});
  spec.end_of_generation_ids = {3, 300};
  EXPECT_THAT(Tokenizer::Create(spec),
              IsInvalidArgumentWith("TokenizerSpec.end_of_generation_ids[1] is 300"));
}

TEST(TokenizerCreateTest, RejectsAVocabularyWithoutByteSymbols) {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = "gpt2";
  spec.tokens = {"<unk>"};
  spec.token_types = {2};
  EXPECT_THAT(Tokenizer::Create(spec), IsInvalidArgumentWith("no single-symbol token"));
}

}  // namespace
}  // namespace kvstrata::tokenizer
