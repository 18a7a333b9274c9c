#pragma once

// Pre-tokenizers: the rules that cut text into words before byte-level BPE merges within each
// word. Each rule is the leftmost-first match of a regular expression (as Oniguruma, used by
// Hugging Face `tokenizers`, runs it), written by hand because RE2 has no lookahead:
//
//   kGpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   kSmolLm  every \p{N} code point is a word by itself; the kGpt2 rule runs on the text between
//            them, each stretch on its own (so "(?!\S)" sees the end of the stretch, not a digit)
//   kLlama3  (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//            ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   kQwen2   kLlama3 with \p{N} (one code point) for \p{N}{1,3}
//
// Classes are per code point, Unicode 16.0 (tokenizer/unicode.h). Case-insensitive matching of
// the kLlama3 contractions folds A-Z and U+017F (long s, which folds to 's'), as Oniguruma
// does. Ill-formed UTF-8 never fails: each maximal ill-formed subpart is one code point of class
// "other" (so it joins a [^\s\p{L}\p{N}]+ run).
//
// Thread-safety: every function here is pure.

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvstrata::tokenizer {

enum class PreTokenizerRule { kGpt2, kSmolLm, kLlama3, kQwen2 };

// The rule a GGUF `tokenizer.ggml.pre` value names: "gpt2", "smollm", "llama-bpe", "qwen2".
absl::StatusOr<PreTokenizerRule> ParsePreTokenizerRule(std::string_view name);

// The inverse of ParsePreTokenizerRule.
std::string_view PreTokenizerRuleName(PreTokenizerRule rule);

// Appends the words of `text` to `words`, in order; they are views into `text` and concatenate
// to exactly `text` (no byte is dropped or added). Empty text gives no word.
void PreTokenize(PreTokenizerRule rule, std::string_view text,
                 std::vector<std::string_view>& words);

}  // namespace kvstrata::tokenizer
