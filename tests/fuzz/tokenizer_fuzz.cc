// The tokenizer on any bytes: ids inside the vocabulary, Decode(Encode(text)) == text whenever no
// byte was dropped, and the streaming decoder's output equal to Decode when that is UTF-8.

#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace kvstrata {
namespace {

const tokenizer::Tokenizer& Tok() {
  static const tokenizer::Tokenizer* t = [] {
    absl::StatusOr<tokenizer::Tokenizer> made = tokenizer::Tokenizer::Create(fuzz::FuzzTokenizerSpec());
    FUZZ_CHECK(made.ok());
    return new tokenizer::Tokenizer(*std::move(made));
  }();
  return *t;
}

// Well-formed UTF-8 (Unicode 15, table 3-7): no overlong forms, surrogates or values past
// U+10FFFF.
bool IsUtf8(const std::string& s) {
  auto at = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = at(i);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) {
      n = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    if (n > 1 && (at(i + 1) < lo || at(i + 1) > hi)) return false;
    for (size_t k = 2; k < n; ++k) {
      if ((at(i + k) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  Tok();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const tokenizer::Tokenizer& tok = Tok();
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.Encode(text, special);
    for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    const std::string back = tok.Decode(ids);
    if (!special && back.size() == text.size()) FUZZ_CHECK(back == text);
    if (special || !IsUtf8(back)) continue;
    tokenizer::StreamingDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Feed(id);
    streamed += stream.Flush();
    FUZZ_CHECK(streamed == back);
  }
  return 0;
}

}  // namespace kvstrata
