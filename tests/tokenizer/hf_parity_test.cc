// The independent check: token ids identical to Hugging Face `tokenizers` (a separate
// implementation, in Rust with Oniguruma regexes) on the default model's real vocabulary, for
// every pre-tokenizer rule, with special tokens parsed and not.
//
// tests/tokenizer/hf_reference.py reads the vocabulary from the GGUF named by KVSTRATA_MODEL
// (with the `gguf` package, not our loader) and writes it, and the reference ids, as JSON into
// the build directory; this test turns the JSON into a TokenizerSpec and compares.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::tokenizer {
namespace {

constexpr char kCorpusPath[] = "tests/tokenizer/hf_corpus.txt";  // tests run from the repo root
constexpr char kSetupHint[] =
    "run scripts/fetch-model.sh and scripts/python-env.sh (they put the model and the test "
    "Python where CMake points KVSTRATA_MODEL and KVSTRATA_TEST_PYTHON)";

std::string Escape(std::string_view s) {
  return absl::CHexEscape(absl::string_view(s.data(), s.size()));
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// What Decode(Encode(text)) gives back: the text less the bytes the vocabulary cannot spell.
std::string WithoutUnencodableBytes(const Tokenizer& tokenizer, std::string_view text) {
  const std::vector<uint8_t>& dropped = tokenizer.unencodable_bytes();
  std::string kept;
  for (const char c : text) {
    if (!std::binary_search(dropped.begin(), dropped.end(), static_cast<uint8_t>(c))) {
      kept.push_back(c);
    }
  }
  return kept;
}

// Runs hf_reference.py once for the whole suite; its JSON stays in the build directory.
class HfParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    setup_error_ = new std::string;
    vocab_ = new nlohmann::json;
    expected_ = new nlohmann::json;
    const char* python = std::getenv("KVSTRATA_TEST_PYTHON");
    const char* model = std::getenv("KVSTRATA_MODEL");
    if (python == nullptr || model == nullptr || *python == '\0' || *model == '\0') {
      *setup_error_ =
          absl::StrCat("KVSTRATA_TEST_PYTHON or KVSTRATA_MODEL is not set; ", kSetupHint);
      return;
    }
    if (!std::filesystem::exists(python) || !std::filesystem::exists(model)) {
      *setup_error_ = absl::StrCat("missing ", std::filesystem::exists(python) ? model : python,
                                   "; ", kSetupHint);
      return;
    }
    const std::filesystem::path out =
        std::filesystem::path(KVSTRATA_TOKENIZER_TEST_DIR) / "hf_reference";
    const std::filesystem::path log = out.string() + ".log";
    const std::string command = absl::StrCat(
        "'", python, "' tests/tokenizer/hf_reference.py --model '", model, "' --corpus ",
        kCorpusPath, " --out '", out.string(), "' > '", log.string(), "' 2>&1");
    if (std::system(command.c_str()) != 0) {
      *setup_error_ = absl::StrCat("hf_reference.py failed (", kSetupHint, "):\n", ReadFile(log));
      return;
    }
    *vocab_ = nlohmann::json::parse(ReadFile(out / "vocab.json"), /*cb=*/nullptr,
                                    /*allow_exceptions=*/false);
    *expected_ = nlohmann::json::parse(ReadFile(out / "expected.json"), /*cb=*/nullptr,
                                       /*allow_exceptions=*/false);
    if (vocab_->is_discarded() || expected_->is_discarded()) {
      *setup_error_ = absl::StrCat("hf_reference.py wrote unreadable JSON in ", out.string());
    }
  }

  static void TearDownTestSuite() {
    delete setup_error_;
    delete vocab_;
    delete expected_;
  }

  void SetUp() override {
    // Missing prerequisites fail, never skip: this check is the one the project relies on.
    if (!setup_error_->empty()) GTEST_FAIL() << *setup_error_;
  }

  // The real vocabulary with `pre` as its rule.
  static TokenizerSpec Spec(const std::string& pre) {
    const nlohmann::json& v = *vocab_;
    TokenizerSpec spec;
    spec.model = v["model"].get<std::string>();
    spec.pre = pre;
    spec.tokens = v["tokens"].get<std::vector<std::string>>();
    spec.token_types = v["token_types"].get<std::vector<int32_t>>();
    spec.merges = v["merges"].get<std::vector<std::string>>();
    spec.bos_id = v["bos_id"].get<int32_t>();
    spec.eos_id = v["eos_id"].get<int32_t>();
    spec.unknown_id = v["unknown_id"].get<int32_t>();
    spec.padding_id = v["padding_id"].get<int32_t>();
    spec.add_bos = v["add_bos"].get<bool>();
    spec.chat_template = v["chat_template"].get<std::string>();
    return spec;
  }

  // Compares every case under `rule`; reports the first differing position of the first few
  // mismatching cases. Returns the number of cases that differ.
  static int CompareRule(const std::string& rule) {
    absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(Spec(rule));
    EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
    if (!tokenizer.ok()) return -1;
    const nlohmann::json& cases = (*expected_)["cases"];
    const nlohmann::json& ids = (*expected_)["rules"][rule];
    int mismatches = 0;
    for (const bool parse_special : {true, false}) {
      const nlohmann::json& want_all = ids[parse_special ? "special" : "plain"];
      for (size_t c = 0; c < cases.size(); ++c) {
        const std::string text = cases[c]["text"].get<std::string>();
        const std::vector<int32_t> want = want_all[c].get<std::vector<int32_t>>();
        const std::vector<int32_t> got = tokenizer->Encode(text, parse_special);
        EXPECT_EQ(tokenizer->Decode(got), WithoutUnencodableBytes(*tokenizer, text))
            << rule << ": round trip of " << Escape(text);
        if (got == want) continue;
        if (++mismatches > 5) continue;
        size_t at = 0;
        while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
        auto piece = [&](const std::vector<int32_t>& v) {
          if (at >= v.size()) return std::string("(end)");
          return absl::StrCat(v[at], " '", Escape(tokenizer->TokenBytes(v[at])), "'");
        };
        // Where in the text the ids part: the bytes of the ids both agree on.
        size_t offset = 0;
        for (size_t i = 0; i < at; ++i) offset += tokenizer->TokenBytes(got[i]).size();
        const size_t context_begin = offset < 40 ? 0 : offset - 40;
        ADD_FAILURE() << "rule " << rule << ", parse_special=" << parse_special << ", "
                      << cases[c]["name"].get<std::string>() << ": ids differ first at position "
                      << at << " (of " << want.size() << " expected, " << got.size()
                      << " got), text byte " << offset << ": tokenizers has " << piece(want)
                      << ", we have " << piece(got) << "\n  text there: '"
                      << Escape(
                             std::string_view(text).substr(context_begin, offset - context_begin))
                      << "' >>> '" << Escape(std::string_view(text).substr(offset, 40)) << "'";
      }
    }
    return mismatches;
  }

  static std::string* setup_error_;
  static nlohmann::json* vocab_;
  static nlohmann::json* expected_;
};

std::string* HfParityTest::setup_error_ = nullptr;
nlohmann::json* HfParityTest::vocab_ = nullptr;
nlohmann::json* HfParityTest::expected_ = nullptr;

TEST_F(HfParityTest, VocabularyIsTheDefaultModels) {
  EXPECT_EQ((*vocab_)["pre"], "smollm");
  EXPECT_EQ((*vocab_)["tokens"].size(), 49152u);
  EXPECT_EQ((*vocab_)["merges"].size(), 48900u);
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(Spec("smollm"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(tokenizer->TokenIdForText("<|endoftext|>"), 0);
  EXPECT_EQ(tokenizer->TokenIdForText("<|im_start|>"), 1);
  EXPECT_EQ(tokenizer->TokenIdForText("<|im_end|>"), 2);
  EXPECT_TRUE(tokenizer->IsEndOfGeneration(2));
  EXPECT_EQ(tokenizer->vocab_size(), 49152);
  // A surprise of this vocabulary: 21 bytes have no symbol (see tokenizer.h).
  EXPECT_EQ(tokenizer->unencodable_bytes(),
            (std::vector<uint8_t>{0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, 0xF5,
                                  0xF6, 0xF7, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF}));
  // The corpus has what the comparison is meant to exercise.
  ASSERT_GT((*expected_)["cases"].size(), 1000u);
  const std::string corpus = (*expected_)["cases"][0]["text"].get<std::string>();
  for (const char* needle : {"1234567", "3.14159", "    ", "\t", "é", "日本語", "😀", "שלום",
                             "<|im_start|>", "<|im_end|>"}) {
    EXPECT_NE(corpus.find(needle), std::string::npos) << needle;
  }
}

TEST_F(HfParityTest, RecognisesTheModelsChatTemplate) {
  absl::StatusOr<ChatTemplate> chat_template =
      ChatTemplate::FromJinja((*vocab_)["chat_template"].get<std::string>());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  EXPECT_EQ(chat_template->kind(), ChatTemplateKind::kChatMl);
  EXPECT_EQ(chat_template->default_system_prompt(),
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
}

TEST_F(HfParityTest, SmolLmRuleMatchesTokenizers) { EXPECT_EQ(CompareRule("smollm"), 0); }
TEST_F(HfParityTest, Gpt2RuleMatchesTokenizers) { EXPECT_EQ(CompareRule("gpt2"), 0); }
TEST_F(HfParityTest, LlamaBpeRuleMatchesTokenizers) { EXPECT_EQ(CompareRule("llama-bpe"), 0); }
TEST_F(HfParityTest, Qwen2RuleMatchesTokenizers) { EXPECT_EQ(CompareRule("qwen2"), 0); }

// Deterministic English-like prose (common words, capitals, punctuation, numbers, paragraphs).
std::string EnglishLikeText(size_t bytes) {
  static constexpr const char* kWords[] = {"the",
                                           "of",
                                           "and",
                                           "to",
                                           "in",
                                           "is",
                                           "that",
                                           "for",
                                           "it",
                                           "as",
                                           "was",
                                           "with",
                                           "be",
                                           "by",
                                           "on",
                                           "not",
                                           "he",
                                           "this",
                                           "are",
                                           "or",
                                           "his",
                                           "from",
                                           "at",
                                           "which",
                                           "but",
                                           "have",
                                           "an",
                                           "had",
                                           "they",
                                           "you",
                                           "were",
                                           "their",
                                           "one",
                                           "all",
                                           "we",
                                           "can",
                                           "her",
                                           "has",
                                           "there",
                                           "been",
                                           "if",
                                           "more",
                                           "when",
                                           "will",
                                           "would",
                                           "who",
                                           "so",
                                           "no",
                                           "model",
                                           "memory",
                                           "cache",
                                           "request",
                                           "server",
                                           "tokens",
                                           "attention",
                                           "context",
                                           "throughput",
                                           "latency",
                                           "scheduler",
                                           "decode",
                                           "prefill",
                                           "page",
                                           "quantized",
                                           "rotation",
                                           "distributed",
                                           "understanding",
                                           "interesting",
                                           "performance",
                                           "implementation",
                                           "everything",
                                           "nevertheless",
                                           "particularly",
                                           "administration",
                                           "responsibility",
                                           "characteristics"};
  constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);
  std::string text;
  uint64_t state = 12345;
  auto next = [&]() {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<uint32_t>(state >> 33);
  };
  bool sentence_start = true;
  while (text.size() < bytes) {
    // Roughly Zipfian: low indices (frequent words) are picked far more often.
    const size_t index =
        (static_cast<uint64_t>(next() % kNumWords) * (next() % kNumWords)) / kNumWords;
    std::string word = kWords[index];
    if (sentence_start) word[0] = static_cast<char>(word[0] - 'a' + 'A');
    sentence_start = false;
    text += word;
    const uint32_t r = next() % 100;
    if (r < 6) {
      text += ". ";
      sentence_start = true;
    } else if (r < 10) {
      text += ", ";
    } else if (r < 11) {
      absl::StrAppend(&text, " ", next() % 100000, " ");
    } else if (r < 12) {
      text += ".\n\n";
      sentence_start = true;
    } else {
      text += " ";
    }
  }
  return text;
}

TEST_F(HfParityTest, EncodesHundredKilobytesOfEnglishQuickly) {
  absl::StatusOr<Tokenizer> tokenizer = Tokenizer::Create(Spec("smollm"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = EnglishLikeText(100 * 1024);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tokenizer->Encode(text, /*parse_special=*/true);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("encoded %zu bytes into %zu tokens in %.1f ms\n", text.size(), ids.size(),
              1e3 * seconds);
  EXPECT_EQ(tokenizer->Decode(ids), text);
  EXPECT_LT(seconds, 1.0);
}

}  // namespace
}  // namespace kvstrata::tokenizer
