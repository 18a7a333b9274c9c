#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/unicode.h"

namespace kvstrata::tokenizer {
namespace {

// Stands for an ill-formed UTF-8 subpart: matches no literal in any rule.
constexpr char32_t kNoCodePoint = 0xFFFFFFFF;

// One code point of the text (or one ill-formed subpart), with where it starts.
struct Unit {
  size_t offset;
  char32_t code_point;
  CodePointClass cls;
};

// The text as code points. units[n] is a sentinel whose offset is the text's length, so unit i
// spans bytes [units[i].offset, units[i + 1].offset).
class Units {
 public:
  explicit Units(std::string_view text) {
    units_.reserve(text.size() + 1);
    size_t pos = 0;
    while (pos < text.size()) {
      const Utf8Step step = DecodeUtf8Step(text.substr(pos));
      if (step.kind == Utf8Step::Kind::kValid) {
        units_.push_back({pos, step.code_point, ClassifyCodePoint(step.code_point)});
      } else {
        units_.push_back({pos, kNoCodePoint, CodePointClass::kOther});
      }
      pos += step.length;
    }
    units_.push_back({text.size(), kNoCodePoint, CodePointClass::kOther});
  }

  size_t size() const { return units_.size() - 1; }
  const Unit& operator[](size_t i) const { return units_[i]; }

 private:
  std::vector<Unit> units_;
};

// Matchers: each returns the end (exclusive, > i) of the match its rule makes at unit i of a
// stretch that ends at unit n (the regex sees only the stretch: n is its end of input). Every
// rule matches at every position, so a stretch is cut without gaps.
class Matcher {
 public:
  Matcher(const Units& u, size_t n) : u_(u), n_(n) {}

  // The kGpt2 rule.
  size_t Gpt2(size_t i) const {
    if (size_t end = Contraction(i, /*fold_case=*/false); end != 0) return end;
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: at most one of them can match, and which one
    // depends only on the class of the first code point after the optional space.
    if (Cp(i) == ' ' && i + 1 < n_ && Cls(i + 1) != CodePointClass::kWhitespace) {
      return RunEnd(i + 1, Cls(i + 1));
    }
    if (Cls(i) != CodePointClass::kWhitespace) return RunEnd(i, Cls(i));
    return Whitespace(i);
  }

  // The kLlama3 rule, or kQwen2's when max_digits is 1.
  size_t Llama3(size_t i, size_t max_digits) const {
    if (size_t end = Contraction(i, /*fold_case=*/true); end != 0) return end;
    const CodePointClass cls = Cls(i);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (cls == CodePointClass::kLetter) return RunEnd(i, CodePointClass::kLetter);
    if (cls != CodePointClass::kNumber && !IsNewline(i) && i + 1 < n_ &&
        Cls(i + 1) == CodePointClass::kLetter) {
      return RunEnd(i + 1, CodePointClass::kLetter);
    }
    // \p{N}{1,3}
    if (cls == CodePointClass::kNumber) {
      return std::min(RunEnd(i, CodePointClass::kNumber), i + max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    size_t start = i;
    if (Cp(i) == ' ' && i + 1 < n_ && Cls(i + 1) == CodePointClass::kOther) start = i + 1;
    if (Cls(start) == CodePointClass::kOther) {
      size_t end = RunEnd(start, CodePointClass::kOther);
      while (end < n_ && IsNewline(end)) ++end;
      return end;
    }
    // Only white space is left. `\s*[\r\n]+`: the greedy \s* gives back code points until
    // [\r\n]+ can match, so the match ends just after the run's last \r or \n.
    const size_t run_end = RunEnd(i, CodePointClass::kWhitespace);
    for (size_t k = run_end; k > i; --k) {
      if (IsNewline(k - 1)) return k;
    }
    return Whitespace(i);
  }

 private:
  char32_t Cp(size_t i) const { return u_[i].code_point; }
  CodePointClass Cls(size_t i) const { return u_[i].cls; }
  bool IsNewline(size_t i) const { return Cp(i) == '\r' || Cp(i) == '\n'; }

  size_t RunEnd(size_t i, CodePointClass cls) const {
    while (i < n_ && Cls(i) == cls) ++i;
    return i;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive; 0 when none matches.
  size_t Contraction(size_t i, bool fold_case) const {
    if (Cp(i) != '\'' || i + 1 >= n_) return 0;
    auto at = [&](size_t k) -> char32_t {
      if (k >= n_) return 0;
      const char32_t c = Cp(k);
      if (!fold_case) return c;
      if (c >= 'A' && c <= 'Z') return c - 'A' + 'a';
      if (c == 0x017F) return 's';  // LATIN SMALL LETTER LONG S case-folds to 's'
      return c;
    };
    const char32_t c1 = at(i + 1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;
    const char32_t c2 = at(i + 2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
      return i + 3;
    }
    return 0;
  }

  // `\s+(?!\S)|\s+` at a white space code point: a run that reaches the end of the stretch is
  // taken whole; otherwise the lookahead makes it give back its last code point (which then
  // starts the next word, e.g. " " before "word"), unless that would leave nothing.
  size_t Whitespace(size_t i) const {
    const size_t run_end = RunEnd(i, CodePointClass::kWhitespace);
    if (run_end == n_ || run_end - i == 1) return run_end;
    return run_end - 1;
  }

  const Units& u_;
  const size_t n_;
};

// Cuts units [begin, end) into words with the kGpt2, kLlama3 or kQwen2 rule.
void CutStretch(PreTokenizerRule rule, const Units& units, std::string_view text, size_t begin,
                size_t end, std::vector<std::string_view>& words) {
  const Matcher matcher(units, end);
  size_t i = begin;
  while (i < end) {
    size_t next = 0;
    switch (rule) {
      case PreTokenizerRule::kGpt2:
      case PreTokenizerRule::kSmolLm:
        next = matcher.Gpt2(i);
        break;
      case PreTokenizerRule::kLlama3:
        next = matcher.Llama3(i, /*max_digits=*/3);
        break;
      case PreTokenizerRule::kQwen2:
        next = matcher.Llama3(i, /*max_digits=*/1);
        break;
    }
    words.push_back(text.substr(units[i].offset, units[next].offset - units[i].offset));
    i = next;
  }
}

}  // namespace

absl::StatusOr<PreTokenizerRule> ParsePreTokenizerRule(std::string_view name) {
  if (name == "gpt2") return PreTokenizerRule::kGpt2;
  if (name == "smollm") return PreTokenizerRule::kSmolLm;
  if (name == "llama-bpe") return PreTokenizerRule::kLlama3;
  if (name == "qwen2") return PreTokenizerRule::kQwen2;
  return absl::InvalidArgumentError(absl::StrCat("unknown pre-tokenizer '",
                                                 absl::string_view(name.data(), name.size()),
                                                 "'; known: gpt2, smollm, llama-bpe, qwen2"));
}

std::string_view PreTokenizerRuleName(PreTokenizerRule rule) {
  switch (rule) {
    case PreTokenizerRule::kGpt2:
      return "gpt2";
    case PreTokenizerRule::kSmolLm:
      return "smollm";
    case PreTokenizerRule::kLlama3:
      return "llama-bpe";
    case PreTokenizerRule::kQwen2:
      return "qwen2";
  }
  return "?";
}

void PreTokenize(PreTokenizerRule rule, std::string_view text,
                 std::vector<std::string_view>& words) {
  if (text.empty()) return;
  const Units units(text);
  const size_t n = units.size();
  if (rule != PreTokenizerRule::kSmolLm) {
    CutStretch(rule, units, text, /*begin=*/0, /*end=*/n, words);
    return;
  }
  // Each \p{N} alone first, then the GPT-2 rule on the stretches between them.
  size_t stretch_begin = 0;
  for (size_t i = 0; i < n; ++i) {
    if (units[i].cls != CodePointClass::kNumber) continue;
    CutStretch(rule, units, text, stretch_begin, i, words);
    words.push_back(text.substr(units[i].offset, units[i + 1].offset - units[i].offset));
    stretch_begin = i + 1;
  }
  CutStretch(rule, units, text, stretch_begin, n, words);
}

}  // namespace kvstrata::tokenizer
