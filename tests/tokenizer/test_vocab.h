#pragma once

// Small hand-made byte-level vocabularies for the tokenizer unit tests.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer_spec.h"

namespace kvstrata::tokenizer::testing {

// GPT-2's byte-to-symbol alphabet, written out here independently of tokenizer.cc: printable
// Latin-1 bytes other than space and soft hyphen are their own symbol, the remaining 68 bytes
// take U+0100.. in byte order.
inline std::string SymbolOf(uint8_t byte) {
  int shifted = 0;
  for (int b = 0; b < byte; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    if (!printable) ++shifted;
  }
  const bool printable =
      (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
  const char32_t cp = printable ? byte : 0x100 + shifted;
  std::string utf8;
  if (cp < 0x80) {
    utf8.push_back(static_cast<char>(cp));
  } else {
    utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return utf8;
}

// The byte-level spelling of raw bytes: " the" -> "Ġthe".
inline std::string Spell(std::string_view bytes) {
  std::string spelling;
  for (const char c : bytes) spelling += SymbolOf(static_cast<uint8_t>(c));
  return spelling;
}

// Tokens: ids 0..255 are the byte symbols (id == byte), then one token per merge in merge order
// (the pair's concatenation), then `controls` (type 3) and `user_defined` (type 4). Merges are
// given as raw bytes: {" ", "t"} is the merge "Ġ t".
inline TokenizerSpec MakeSpec(const std::vector<std::pair<std::string, std::string>>& merges,
                              const std::vector<std::string>& controls = {},
                              const std::vector<std::string>& user_defined = {},
                              std::string pre = "gpt2") {
  TokenizerSpec spec;
  spec.model = "gpt2";
  spec.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) {
    spec.tokens.push_back(SymbolOf(static_cast<uint8_t>(b)));
    spec.token_types.push_back(1);
  }
  for (const auto& [left, right] : merges) {
    spec.merges.push_back(Spell(left) + " " + Spell(right));
    spec.tokens.push_back(Spell(left + right));
    spec.token_types.push_back(1);
  }
  for (const std::string& control : controls) {
    spec.tokens.push_back(control);
    spec.token_types.push_back(3);
  }
  for (const std::string& token : user_defined) {
    spec.tokens.push_back(token);
    spec.token_types.push_back(4);
  }
  return spec;
}

// The id of the first token whose entry is `token` (a spelling or a special's text); -1 if none.
inline int32_t IdOf(const TokenizerSpec& spec, std::string_view token) {
  for (size_t id = 0; id < spec.tokens.size(); ++id) {
    if (spec.tokens[id] == token) return static_cast<int32_t>(id);
  }
  return -1;
}

// The id of the normal token standing for raw `bytes`.
inline int32_t IdOfBytes(const TokenizerSpec& spec, std::string_view bytes) {
  return IdOf(spec, Spell(bytes));
}

}  // namespace kvstrata::tokenizer::testing
