#pragma once

// Byte-level BPE (GPT-2 style): text -> token ids -> text.
//
// Encoding: special tokens are cut out of the text first (whole-token matches, leftmost and
// then longest), the rest is cut into words by the pre-tokenizer rule (pre_tokenizer.h), each
// word's bytes become the GPT-2 byte-to-unicode symbols, and merges are applied lowest rank
// first (leftmost first among equal ranks) until none applies. Any byte string encodes, ill-
// formed UTF-8 included, and Decode(Encode(text)) == text, except that a byte the vocabulary
// has no symbol for (unencodable_bytes()) is dropped before merging, as Hugging Face
// `tokenizers` drops it: SmolLM2 lacks 21, 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 and
// 0xF5..0xFF. Callers that must not lose input can compare Decode(ids).size() with text.size().
//
// Which tokens count as special: control tokens (type 3) are matched only when Encode is asked
// to parse specials; user-defined tokens (type 4) always are (as in llama.cpp and in Hugging
// Face's non-special added tokens). Normal (1) and byte (6) tokens are spelled in the byte-level
// alphabet ("Ġthe" is " the"); every other type is stored and decoded as its literal text.
//
// The "llama-bpe" rule also takes a whole word that is itself a token without merging (Llama 3's
// `ignore_merges`), as the real Llama 3 tokenizer does.
//
// Thread-safety: a Tokenizer is immutable; every const method may be called concurrently.
// Copies are cheap and share the vocabulary.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::tokenizer {

namespace internal {
struct CompiledVocab;  // tokenizer.cc
}  // namespace internal

class Tokenizer {
 public:
  // Validates and compiles `spec`. Errors (InvalidArgument) name the offending field or entry:
  // an unsupported model, an unknown pre rule, token_types of the wrong size or with unknown
  // values, a normal token with a character outside the byte-level alphabet, no single-symbol
  // token for any byte, a merge that is not "left right" over known tokens whose concatenation
  // is a token, a special id out of range.
  static absl::StatusOr<Tokenizer> Create(const TokenizerSpec& spec);

  // Token ids of `text`, which may be any bytes. With parse_special, control tokens written in
  // the text ("<|im_start|>") become their ids; without, they are encoded as plain text. No BOS
  // is added: callers that need one check add_bos() and bos_id().
  std::vector<int32_t> Encode(std::string_view text, bool parse_special) const;

  // The concatenated bytes of `ids` (not necessarily UTF-8: a token can hold part of a
  // character). Control tokens render as their text unless skip_control. An id outside
  // [0, vocab_size()) renders as U+FFFD, so corrupt ids show instead of vanishing.
  std::string Decode(std::span<const int32_t> ids, bool skip_control = false) const;

  // The bytes token `id` stands for; empty for an id outside [0, vocab_size()).
  std::string_view TokenBytes(int32_t id) const;

  // The id of the token whose bytes are exactly `text` ("<|im_end|>", "\n"), preferring a
  // control or user-defined token when a normal token has the same bytes.
  std::optional<int32_t> TokenIdForText(std::string_view text) const;

  // eos, every TokenizerSpec::end_of_generation_ids entry.
  bool IsEndOfGeneration(int32_t id) const;
  // Control token (type 3): never produced by Encode without parse_special.
  bool IsControl(int32_t id) const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  // Whether the model expects a BOS token in front of every prompt (TokenizerSpec::add_bos).
  bool add_bos() const;
  int32_t vocab_size() const;
  PreTokenizerRule pre_tokenizer_rule() const;
  // Bytes that Encode drops because the vocabulary has no token for their symbol; ascending.
  const std::vector<uint8_t>& unencodable_bytes() const;

 private:
  explicit Tokenizer(std::shared_ptr<const internal::CompiledVocab> model)
      : model_(std::move(model)) {}

  std::shared_ptr<const internal::CompiledVocab> model_;
};

// Turns ids into text as they are generated: each Feed returns only complete UTF-8 characters
// (possibly none: a token may end inside a character, whose remaining bytes wait for the next
// token). Output is always valid UTF-8: an ill-formed sequence becomes U+FFFD (one per maximal
// subpart), and so does an incomplete character left at Flush. Concatenating every Feed and the
// Flush equals Decode of all ids whenever that decodes to valid UTF-8.
//
// Not thread-safe: one decoder per sequence. Keeps its own copy of the tokenizer.
class StreamingDecoder {
 public:
  explicit StreamingDecoder(Tokenizer tokenizer, bool skip_control = false)
      : tokenizer_(std::move(tokenizer)), skip_control_(skip_control) {}

  // The text that `id` completes.
  std::string Feed(int32_t id);

  // The incomplete character still pending, as U+FFFD (empty when nothing is pending). The
  // decoder is then empty and can be reused.
  std::string Flush();

 private:
  Tokenizer tokenizer_;
  bool skip_control_;
  std::string pending_;  // bytes of an incomplete character, at most 3
};

}  // namespace kvstrata::tokenizer
