#include "tokenizer/prompt_encoder.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sha256.h"
#include "core/status_macros.h"

namespace kvstrata::tokenizer {

absl::StatusOr<PromptEncoder> PromptEncoder::Create(const TokenizerSpec& spec) {
  KV_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Create(spec));
  PromptEncoder e(std::move(tokenizer));
  std::string digest_input;
  auto field = [&](std::string_view v) {
    digest_input += std::to_string(v.size());
    digest_input += ':';
    digest_input.append(v);
    digest_input += ';';
  };
  field(spec.model);
  field(spec.pre);
  for (const std::string& t : spec.tokens) field(t);
  for (int32_t t : spec.token_types) absl::StrAppend(&digest_input, t, ",");
  for (const std::string& m : spec.merges) field(m);
  // What turns a prompt into ids; not what ends a generation (EOS ids), which stays the
  // worker's business.
  absl::StrAppend(&digest_input, spec.bos_id, ",", spec.unknown_id, ",", spec.add_bos, ";");
  field(spec.chat_template);
  e.identity_ = absl::StrCat(spec.pre, ":", Sha256Hex(digest_input).substr(0, 16));
  if (!spec.chat_template.empty()) {
    absl::StatusOr<ChatTemplate> t = ChatTemplate::FromJinja(spec.chat_template);
    if (t.ok()) e.chat_template_ = std::move(*t);  // else EncodeChat says there is none
  }
  for (int32_t id = 0; id < e.tokenizer_.vocab_size(); ++id) {
    if (!e.tokenizer_.IsControl(id)) continue;
    const std::string_view text = e.tokenizer_.TokenBytes(id);
    if (!text.empty()) e.control_tokens_.emplace_back(std::string(text), id);
  }
  std::stable_sort(e.control_tokens_.begin(), e.control_tokens_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return e;
}

absl::StatusOr<std::vector<int32_t>> PromptEncoder::EncodeChat(
    std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  if (!chat_template_) {
    return absl::FailedPreconditionError(
        "the model has no recognised chat template");
  }
  KV_ASSIGN_OR_RETURN(const RenderedChat real,
                      chat_template_->Render(messages, add_generation_prompt));
  // Render again with a marker for each message's content: whatever surrounds a marker is the
  // template's own text, and the same text surrounds the content in the real rendering.
  std::vector<ChatMessage> marked(messages.begin(), messages.end());
  for (size_t i = 0; i < marked.size(); ++i) {
    marked[i].content = absl::StrCat("\x01kvstrata-content-", i, "\x02");
  }
  KV_ASSIGN_OR_RETURN(const RenderedChat skeleton,
                      chat_template_->Render(marked, add_generation_prompt));
  struct Piece {
    std::string_view text;
    bool from_template;
  };
  std::vector<Piece> pieces;
  const std::string_view r = real.text, s = skeleton.text;
  auto internal = [](size_t i) {
    return absl::InternalError(absl::StrCat("chat rendering of message ", i, " is inconsistent"));
  };
  size_t r_prev = 0, s_prev = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& marker = marked[i].content;
    const size_t m = s.find(marker, s_prev);
    if (m == std::string_view::npos || m > skeleton.message_ends[i]) return internal(i);
    const size_t prefix = m - s_prev;
    const size_t suffix = skeleton.message_ends[i] - (m + marker.size());
    if (real.message_ends[i] < r_prev + prefix + suffix) return internal(i);
    const size_t c_begin = r_prev + prefix, c_end = real.message_ends[i] - suffix;
    if (r.substr(r_prev, prefix) != s.substr(s_prev, prefix) ||
        r.substr(c_end, suffix) != s.substr(m + marker.size(), suffix)) {
      return internal(i);
    }
    pieces.push_back({s.substr(s_prev, prefix), true});
    pieces.push_back({r.substr(c_begin, c_end - c_begin), false});
    pieces.push_back({s.substr(m + marker.size(), suffix), true});
    r_prev = real.message_ends[i];
    s_prev = skeleton.message_ends[i];
  }
  if (r.substr(r_prev) != s.substr(s_prev)) return internal(messages.size());
  pieces.push_back({s.substr(s_prev), true});

  // Control tokens are cut out of the template's text only; the plain text between them,
  // template and content alike, is encoded in one piece so word boundaries match the
  // encoding of the whole rendered text.
  std::vector<int32_t> ids;
  std::string plain;
  auto flush = [&] {
    if (plain.empty()) return;
    const std::vector<int32_t> part = tokenizer_.Encode(plain, /*parse_special=*/false);
    ids.insert(ids.end(), part.begin(), part.end());
    plain.clear();
  };
  for (const Piece& piece : pieces) {
    if (!piece.from_template) {
      plain.append(piece.text);
      continue;
    }
    for (size_t pos = 0; pos < piece.text.size();) {
      const auto hit = std::find_if(
          control_tokens_.begin(), control_tokens_.end(),
          [&](const auto& ct) { return piece.text.substr(pos).starts_with(ct.first); });
      if (hit == control_tokens_.end()) {
        plain.push_back(piece.text[pos++]);
      } else {
        flush();
        ids.push_back(hit->second);
        pos += hit->first.size();
      }
    }
  }
  flush();
  const std::optional<int32_t> bos = tokenizer_.bos_id();
  if (tokenizer_.add_bos() && bos && (ids.empty() || ids.front() != *bos)) {
    ids.insert(ids.begin(), *bos);
  }
  return ids;
}

std::vector<int32_t> PromptEncoder::EncodeText(std::string_view text) const {
  std::vector<int32_t> ids = tokenizer_.Encode(text, /*parse_special=*/false);
  const std::optional<int32_t> bos = tokenizer_.bos_id();
  if (tokenizer_.add_bos() && bos) ids.insert(ids.begin(), *bos);
  return ids;
}

}  // namespace kvstrata::tokenizer
