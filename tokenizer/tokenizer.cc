#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "tokenizer/unicode.h"

namespace kvstrata::tokenizer {
namespace {

// GGUF token types (llama.cpp's numbering).
constexpr int32_t kTypeNormal = 1;
constexpr int32_t kTypeUnknown = 2;
constexpr int32_t kTypeControl = 3;
constexpr int32_t kTypeUserDefined = 4;
constexpr int32_t kTypeUnused = 5;
constexpr int32_t kTypeByte = 6;

// Per-token flags, one byte per token.
constexpr uint8_t kFlagControl = 1;
constexpr uint8_t kFlagUserDefined = 2;
constexpr uint8_t kFlagEndOfGeneration = 4;
constexpr uint8_t kFlagSpelledInAlphabet = 8;  // normal and byte tokens

// This Abseil is built with its own string_view, which std::string_view does not convert to.
absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A token string quoted for an error message: escaped, and cut when long.
std::string Quote(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string quoted = absl::CHexEscape(AsAbsl(s.substr(0, kMax)));
  if (s.size() > kMax) quoted += "...";
  return absl::StrCat("'", quoted, "'");
}

// GPT-2's byte-to-unicode alphabet: bytes that are printable, non-space characters of Latin-1
// stand for themselves; the other 68 bytes, in increasing order, take U+0100 onwards. So every
// byte has a visible, non-space symbol, and tokens can be stored as text.
struct ByteAlphabet {
  static constexpr char32_t kLastSymbol = 0x100 + 68 - 1;
  std::array<std::string, 256> symbol;             // byte -> UTF-8 of its symbol
  std::array<int16_t, kLastSymbol + 1> byte_of{};  // symbol -> byte, -1 for none
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* const alphabet = [] {
    auto* a = new ByteAlphabet;
    a->byte_of.fill(-1);
    char32_t next_shifted = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool stands_for_itself =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t symbol = stands_for_itself ? static_cast<char32_t>(b) : next_shifted++;
      AppendUtf8(symbol, a->symbol[b]);
      a->byte_of[symbol] = static_cast<int16_t>(b);
    }
    return a;
  }();
  return *alphabet;
}

// The byte-level spelling of raw bytes ("\n" -> "Ċ").
std::string Spell(std::string_view bytes) {
  const ByteAlphabet& alphabet = Alphabet();
  std::string spelling;
  spelling.reserve(2 * bytes.size());
  for (const char c : bytes) spelling += alphabet.symbol[static_cast<uint8_t>(c)];
  return spelling;
}

// The bytes a byte-level spelling stands for; the error says what is wrong with it.
absl::StatusOr<std::string> Unspell(std::string_view spelling) {
  const ByteAlphabet& alphabet = Alphabet();
  std::string bytes;
  size_t pos = 0;
  while (pos < spelling.size()) {
    const Utf8Step step = DecodeUtf8Step(spelling.substr(pos));
    if (step.kind != Utf8Step::Kind::kValid) {
      return absl::InvalidArgumentError(absl::StrCat("is not valid UTF-8 at byte ", pos));
    }
    if (step.code_point > ByteAlphabet::kLastSymbol || alphabet.byte_of[step.code_point] < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("has U+%04X, which is outside the byte-level alphabet", step.code_point));
    }
    bytes.push_back(static_cast<char>(alphabet.byte_of[step.code_point]));
    pos += step.length;
  }
  return bytes;
}

// "<0x0A>" -> 0x0A: how SentencePiece-style vocabularies write byte tokens.
std::optional<uint8_t> ParseByteToken(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return std::nullopt;
  int value = 0;
  for (const char c : s.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      value |= c - 'a' + 10;
    } else {
      return std::nullopt;
    }
  }
  return static_cast<uint8_t>(value);
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;    // position in TokenizerSpec::merges: lower merges first
  int32_t merged;  // the token the pair becomes
};

absl::Status CheckOptionalId(const char* field, int32_t id, size_t vocab_size) {
  if (id == -1 || (id >= 0 && static_cast<size_t>(id) < vocab_size)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("TokenizerSpec.", field, " is ", id,
                                                 "; expected -1 (none) or an id below the ",
                                                 vocab_size, " tokens"));
}

}  // namespace

namespace internal {

struct CompiledVocab {
  PreTokenizerRule rule = PreTokenizerRule::kGpt2;
  // Llama 3: a word that is itself a token is taken whole (looked up by its spelling).
  bool ignore_merges = false;
  std::vector<std::string> token_bytes;    // id -> the bytes it stands for
  std::vector<uint8_t> token_flags;        // id -> kFlag*
  std::array<int32_t, 256> byte_ids{};     // byte -> the token of its single symbol, or -1
  std::vector<uint8_t> unencodable_bytes;  // bytes whose byte_ids entry is -1
  absl::flat_hash_map<uint64_t, Merge> merges;
  absl::flat_hash_map<std::string, int32_t> spelling_to_id;  // filled only for ignore_merges
  absl::flat_hash_map<std::string, int32_t> bytes_to_id;     // for TokenIdForText
  // Control and user-defined tokens that can be cut out of text, by first byte, longest first.
  std::array<std::vector<int32_t>, 256> specials_by_first_byte;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  bool add_bos = false;

  bool IsValidId(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < token_bytes.size();
  }
};

}  // namespace internal

namespace {

// Per-Encode scratch space and word cache. Words repeat a lot in real text ("Ġthe"), so each
// distinct word goes through BPE once per call; keys view the caller's text, which outlives
// the encoder.
class Encoder {
 public:
  explicit Encoder(const internal::CompiledVocab& model) : model_(model) {}

  // Encodes text that holds no special token to cut out.
  void EncodePlain(std::string_view text, std::vector<int32_t>& out) {
    words_.clear();
    PreTokenize(model_.rule, text, words_);
    for (const std::string_view word : words_) EncodeWord(word, out);
  }

 private:
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // index of the left symbol: lower is further left in the word
    int32_t left_id;
    int32_t right_id;
    int32_t merged;
  };
  // std heap functions keep the greatest on top; this puts the lowest rank, then the leftmost
  // pair, there.
  static bool After(const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
  }

  void EncodeWord(std::string_view word, std::vector<int32_t>& out) {
    if (auto it = cache_.find(AsAbsl(word)); it != cache_.end()) {
      const auto [begin, count] = it->second;
      out.insert(out.end(), cached_ids_.begin() + begin, cached_ids_.begin() + begin + count);
      return;
    }
    const size_t begin = cached_ids_.size();
    Bpe(word, cached_ids_);
    cache_.emplace(AsAbsl(word), std::make_pair(begin, cached_ids_.size() - begin));
    out.insert(out.end(), cached_ids_.begin() + begin, cached_ids_.end());
  }

  void Bpe(std::string_view word, std::vector<int32_t>& out) {
    if (model_.ignore_merges) {
      if (auto it = model_.spelling_to_id.find(Spell(word)); it != model_.spelling_to_id.end()) {
        out.push_back(it->second);
        return;
      }
    }
    symbols_.clear();
    for (const char c : word) {
      const int32_t id = model_.byte_ids[static_cast<uint8_t>(c)];
      if (id < 0) continue;  // a byte the vocabulary cannot spell is dropped
      const int32_t i = static_cast<int32_t>(symbols_.size());
      symbols_.push_back({id, i - 1, i + 1});
    }
    if (symbols_.empty()) return;
    symbols_.back().next = -1;
    const int32_t n = static_cast<int32_t>(symbols_.size());
    heap_.clear();
    for (int32_t i = 0; i + 1 < n; ++i) PushPair(i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), After);
      const Candidate c = heap_.back();
      heap_.pop_back();
      Symbol& left = symbols_[c.left];
      // Stale when either side has merged since the pair was queued: a merge changes the id of
      // the left symbol it grows and retires the right one.
      if (left.id != c.left_id || left.next < 0 || symbols_[left.next].id != c.right_id) continue;
      Symbol& right = symbols_[left.next];
      left.id = c.merged;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = c.left;
      right.id = -1;
      if (left.prev >= 0) PushPair(left.prev);
      PushPair(c.left);
    }
    for (int32_t i = 0; i >= 0; i = symbols_[i].next) out.push_back(symbols_[i].id);
  }

  void PushPair(int32_t left) {
    const int32_t right = symbols_[left].next;
    if (right < 0) return;
    const auto it = model_.merges.find(PairKey(symbols_[left].id, symbols_[right].id));
    if (it == model_.merges.end()) return;
    heap_.push_back(
        {it->second.rank, left, symbols_[left].id, symbols_[right].id, it->second.merged});
    std::push_heap(heap_.begin(), heap_.end(), After);
  }

  const internal::CompiledVocab& model_;
  std::vector<std::string_view> words_;
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;
  absl::flat_hash_map<absl::string_view, std::pair<size_t, size_t>> cache_;
  std::vector<int32_t> cached_ids_;
};

}  // namespace

absl::StatusOr<Tokenizer> Tokenizer::Create(const TokenizerSpec& spec) {
  if (spec.model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat("TokenizerSpec.model is ", Quote(spec.model),
                                                   "; only 'gpt2' (byte-level BPE) is "
                                                   "supported"));
  }
  auto model = std::make_shared<internal::CompiledVocab>();
  absl::StatusOr<PreTokenizerRule> rule = ParsePreTokenizerRule(spec.pre);
  if (!rule.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("TokenizerSpec.pre: ", rule.status().message()));
  }
  model->rule = *rule;
  model->ignore_merges = *rule == PreTokenizerRule::kLlama3;

  const size_t n = spec.tokens.size();
  if (n == 0 || n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("TokenizerSpec.tokens has ", n, " entries; expected 1 to 2^31-1"));
  }
  if (spec.token_types.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("TokenizerSpec.token_types has ",
                                                   spec.token_types.size(),
                                                   " entries; expected one per token (", n, ")"));
  }

  // Bytes and flags of every token; the spelling map resolves merges and byte symbols.
  absl::flat_hash_map<std::string, int32_t> spelling_to_id;
  spelling_to_id.reserve(n);
  model->token_bytes.resize(n);
  model->token_flags.assign(n, 0);
  for (size_t id = 0; id < n; ++id) {
    const std::string& token = spec.tokens[id];
    const int32_t type = spec.token_types[id];
    spelling_to_id.try_emplace(token, static_cast<int32_t>(id));  // the first of duplicates wins
    switch (type) {
      case kTypeNormal:
      case kTypeByte: {
        if (type == kTypeByte) {
          if (std::optional<uint8_t> byte = ParseByteToken(token)) {
            model->token_bytes[id] = std::string(1, static_cast<char>(*byte));
            break;
          }
        }
        absl::StatusOr<std::string> bytes = Unspell(token);
        if (!bytes.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("TokenizerSpec.tokens[", id, "] ",
                                                         Quote(token), " (type ", type, ") ",
                                                         bytes.status().message()));
        }
        model->token_bytes[id] = *std::move(bytes);
        model->token_flags[id] |= kFlagSpelledInAlphabet;
        break;
      }
      case kTypeControl:
        model->token_bytes[id] = token;
        model->token_flags[id] |= kFlagControl;
        break;
      case kTypeUserDefined:
        model->token_bytes[id] = token;
        model->token_flags[id] |= kFlagUserDefined;
        break;
      case kTypeUnknown:
      case kTypeUnused:
        model->token_bytes[id] = token;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("TokenizerSpec.token_types[", id, "] is ", type,
                         "; expected 1 (normal), 2 (unknown), 3 (control), 4 (user-defined), "
                         "5 (unused) or 6 (byte)"));
    }
  }

  // Real vocabularies can lack a few byte symbols (SmolLM2 has none for 21 bytes, among them
  // 0x04 and 0xF1); like Hugging Face `tokenizers`, BPE then drops those bytes.
  const ByteAlphabet& alphabet = Alphabet();
  for (int b = 0; b < 256; ++b) {
    const auto it = spelling_to_id.find(alphabet.symbol[b]);
    if (it == spelling_to_id.end()) {
      model->byte_ids[b] = -1;
      model->unencodable_bytes.push_back(static_cast<uint8_t>(b));
    } else {
      model->byte_ids[b] = it->second;
    }
  }
  if (model->unencodable_bytes.size() == 256) {
    return absl::InvalidArgumentError(
        "TokenizerSpec.tokens has no single-symbol token for any byte; not a byte-level BPE "
        "vocabulary");
  }

  model->merges.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string_view merge = spec.merges[rank];
    auto error = [&](std::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("TokenizerSpec.merges[", rank, "] ", Quote(merge), ": ", AsAbsl(what)));
    };
    const size_t space = merge.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == merge.size() ||
        merge.find(' ', space + 1) != std::string_view::npos) {
      return error("expected two tokens separated by one space");
    }
    const std::string left(merge.substr(0, space));
    const std::string right(merge.substr(space + 1));
    const auto left_it = spelling_to_id.find(left);
    const auto right_it = spelling_to_id.find(right);
    const auto merged_it = spelling_to_id.find(left + right);
    if (left_it == spelling_to_id.end()) return error(absl::StrCat(Quote(left), " is not a token"));
    if (right_it == spelling_to_id.end()) {
      return error(absl::StrCat(Quote(right), " is not a token"));
    }
    if (merged_it == spelling_to_id.end()) {
      return error(absl::StrCat(Quote(left + right), " is not a token"));
    }
    // The first of duplicate merges keeps its (better) rank.
    model->merges.try_emplace(PairKey(left_it->second, right_it->second),
                              Merge{static_cast<int32_t>(rank), merged_it->second});
  }

  KV_RETURN_IF_ERROR(CheckOptionalId("bos_id", spec.bos_id, n));
  KV_RETURN_IF_ERROR(CheckOptionalId("eos_id", spec.eos_id, n));
  KV_RETURN_IF_ERROR(CheckOptionalId("unknown_id", spec.unknown_id, n));
  KV_RETURN_IF_ERROR(CheckOptionalId("padding_id", spec.padding_id, n));
  for (size_t i = 0; i < spec.end_of_generation_ids.size(); ++i) {
    const int32_t id = spec.end_of_generation_ids[i];
    if (id < 0 || static_cast<size_t>(id) >= n) {
      return absl::InvalidArgumentError(absl::StrCat("TokenizerSpec.end_of_generation_ids[", i,
                                                     "] is ", id, "; expected an id below the ", n,
                                                     " tokens"));
    }
    model->token_flags[id] |= kFlagEndOfGeneration;
  }
  if (spec.eos_id >= 0) model->token_flags[spec.eos_id] |= kFlagEndOfGeneration;
  model->bos_id = spec.bos_id;
  model->eos_id = spec.eos_id;
  model->add_bos = spec.add_bos;

  // Text lookup prefers control and user-defined tokens, then tokens in the alphabet, then the
  // rest (unknown, unused).
  auto lookup_preference = [&](size_t id) {
    const uint8_t flags = model->token_flags[id];
    if ((flags & (kFlagControl | kFlagUserDefined)) != 0) return 0;
    return (flags & kFlagSpelledInAlphabet) != 0 ? 1 : 2;
  };
  model->bytes_to_id.reserve(n);
  for (int preference = 0; preference <= 2; ++preference) {
    for (size_t id = 0; id < n; ++id) {
      if (lookup_preference(id) != preference) continue;
      model->bytes_to_id.try_emplace(model->token_bytes[id], static_cast<int32_t>(id));
    }
  }

  for (size_t id = 0; id < n; ++id) {
    const std::string& bytes = model->token_bytes[id];
    if ((model->token_flags[id] & (kFlagControl | kFlagUserDefined)) == 0 || bytes.empty()) {
      continue;
    }
    model->specials_by_first_byte[static_cast<uint8_t>(bytes[0])].push_back(
        static_cast<int32_t>(id));
  }
  for (std::vector<int32_t>& candidates : model->specials_by_first_byte) {
    std::stable_sort(candidates.begin(), candidates.end(), [&](int32_t a, int32_t b) {
      return model->token_bytes[a].size() > model->token_bytes[b].size();
    });
  }

  if (model->ignore_merges) model->spelling_to_id = std::move(spelling_to_id);
  return Tokenizer(std::move(model));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool parse_special) const {
  const internal::CompiledVocab& m = *model_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  Encoder encoder(m);
  // Special tokens first, leftmost then longest; the plain text between them goes through the
  // pre-tokenizer and BPE.
  size_t plain_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    int32_t special = -1;
    for (const int32_t id : m.specials_by_first_byte[static_cast<uint8_t>(text[pos])]) {
      if (!parse_special && (m.token_flags[id] & kFlagControl) != 0) continue;
      if (text.substr(pos).starts_with(m.token_bytes[id])) {
        special = id;
        break;
      }
    }
    if (special < 0) {
      ++pos;
      continue;
    }
    encoder.EncodePlain(text.substr(plain_begin, pos - plain_begin), ids);
    ids.push_back(special);
    pos += m.token_bytes[special].size();
    plain_begin = pos;
  }
  encoder.EncodePlain(text.substr(plain_begin), ids);
  return ids;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool skip_control) const {
  const internal::CompiledVocab& m = *model_;
  std::string text;
  for (const int32_t id : ids) {
    if (!m.IsValidId(id)) {
      text += kReplacementCharacter;
      continue;
    }
    if (skip_control && (m.token_flags[id] & kFlagControl) != 0) continue;
    text += m.token_bytes[id];
  }
  return text;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (!model_->IsValidId(id)) return {};
  return model_->token_bytes[id];
}

std::optional<int32_t> Tokenizer::TokenIdForText(std::string_view text) const {
  const auto it = model_->bytes_to_id.find(AsAbsl(text));
  if (it == model_->bytes_to_id.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return model_->IsValidId(id) && (model_->token_flags[id] & kFlagEndOfGeneration) != 0;
}

bool Tokenizer::IsControl(int32_t id) const {
  return model_->IsValidId(id) && (model_->token_flags[id] & kFlagControl) != 0;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (model_->bos_id < 0) return std::nullopt;
  return model_->bos_id;
}

std::optional<int32_t> Tokenizer::eos_id() const {
  if (model_->eos_id < 0) return std::nullopt;
  return model_->eos_id;
}

bool Tokenizer::add_bos() const { return model_->add_bos; }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(model_->token_bytes.size()); }

PreTokenizerRule Tokenizer::pre_tokenizer_rule() const { return model_->rule; }

const std::vector<uint8_t>& Tokenizer::unencodable_bytes() const {
  return model_->unencodable_bytes;
}

std::string StreamingDecoder::Feed(int32_t id) {
  if (id < 0 || id >= tokenizer_.vocab_size()) {
    pending_ += kReplacementCharacter;
  } else if (!(skip_control_ && tokenizer_.IsControl(id))) {
    pending_ += tokenizer_.TokenBytes(id);
  }
  std::string text;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const Utf8Step step = DecodeUtf8Step(std::string_view(pending_).substr(pos));
    if (step.kind == Utf8Step::Kind::kTruncated) break;  // wait for the next token
    if (step.kind == Utf8Step::Kind::kValid) {
      text.append(pending_, pos, step.length);
    } else {
      text += kReplacementCharacter;
    }
    pos += step.length;
  }
  pending_.erase(0, pos);
  return text;
}

std::string StreamingDecoder::Flush() {
  if (pending_.empty()) return {};
  pending_.clear();
  return std::string(kReplacementCharacter);  // a truncated tail is one maximal subpart
}

}  // namespace kvstrata::tokenizer
