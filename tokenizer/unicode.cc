#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <iterator>

#include "tokenizer/unicode_tables.h"

namespace kvstrata::tokenizer {
namespace {

using unicode_tables::kRanges;
using unicode_tables::RangeClass;

CodePointClass FromRangeClass(RangeClass cls) {
  switch (cls) {
    case RangeClass::kLetter:
      return CodePointClass::kLetter;
    case RangeClass::kNumber:
      return CodePointClass::kNumber;
    case RangeClass::kWhitespace:
      return CodePointClass::kWhitespace;
  }
  return CodePointClass::kOther;
}

CodePointClass ClassifyByTable(char32_t code_point) {
  // The first range whose last code point is not below code_point.
  const auto* range =
      std::lower_bound(std::begin(kRanges), std::end(kRanges), code_point,
                       [](const unicode_tables::Range& r, char32_t cp) { return r.last < cp; });
  if (range == std::end(kRanges) || range->first > code_point) return CodePointClass::kOther;
  return FromRangeClass(range->cls);
}

// ASCII dominates real text; a table spares it the binary search.
const std::array<CodePointClass, 128> kAsciiClasses = [] {
  std::array<CodePointClass, 128> classes{};
  for (char32_t c = 0; c < 128; ++c) classes[c] = ClassifyByTable(c);
  return classes;
}();

bool InRange(uint8_t byte, uint8_t lo, uint8_t hi) { return byte >= lo && byte <= hi; }

}  // namespace

CodePointClass ClassifyCodePoint(char32_t code_point) {
  if (code_point < 128) return kAsciiClasses[code_point];
  return ClassifyByTable(code_point);
}

const char* UnicodeTablesVersion() { return unicode_tables::kUnicodeVersion; }

Utf8Step DecodeUtf8Step(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  const uint8_t lead = p[0];
  if (lead < 0x80) return {Utf8Step::Kind::kValid, 1, lead};

  // The length of the sequence a lead byte starts, and the range its second byte must be in;
  // later bytes are always 80..BF.
  int length = 0;
  uint8_t second_lo = 0x80;
  uint8_t second_hi = 0xBF;
  char32_t code_point = 0;
  if (InRange(lead, 0xC2, 0xDF)) {
    length = 2;
    code_point = lead & 0x1F;
  } else if (InRange(lead, 0xE0, 0xEF)) {
    length = 3;
    code_point = lead & 0x0F;
    if (lead == 0xE0) second_lo = 0xA0;  // no overlongs
    if (lead == 0xED) second_hi = 0x9F;  // no surrogates
  } else if (InRange(lead, 0xF0, 0xF4)) {
    length = 4;
    code_point = lead & 0x07;
    if (lead == 0xF0) second_lo = 0x90;  // no overlongs
    if (lead == 0xF4) second_hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {Utf8Step::Kind::kInvalid, 1, 0};  // 80..C1, F5..FF never start a sequence
  }
  for (int i = 1; i < length; ++i) {
    if (static_cast<size_t>(i) >= n) {
      return {Utf8Step::Kind::kTruncated, static_cast<uint8_t>(i), 0};
    }
    const uint8_t lo = i == 1 ? second_lo : 0x80;
    const uint8_t hi = i == 1 ? second_hi : 0xBF;
    if (!InRange(p[i], lo, hi)) return {Utf8Step::Kind::kInvalid, static_cast<uint8_t>(i), 0};
    code_point = (code_point << 6) | (p[i] & 0x3F);
  }
  return {Utf8Step::Kind::kValid, static_cast<uint8_t>(length), code_point};
}

void AppendUtf8(char32_t code_point, std::string& out) {
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

}  // namespace kvstrata::tokenizer
