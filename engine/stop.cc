#include "engine/stop.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "tokenizer/unicode.h"

namespace kvstrata::engine {

namespace {

// Length of a trailing incomplete UTF-8 sequence in s (0 if s ends on a boundary).
size_t IncompleteUtf8Tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return need > back ? back : 0;
  }
  return 0;
}

// `bytes` as valid UTF-8: each ill-formed or truncated sequence becomes U+FFFD. Token bytes need
// not be UTF-8 (a sampled token can be a lone continuation byte, and max_tokens can end inside a
// character), but streamed text must be: a protobuf string field that is not fails to serialize,
// and the worker's stream then ends without its final message.
std::string ValidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const tokenizer::Utf8Step step = tokenizer::DecodeUtf8Step(bytes.substr(pos));
    if (step.kind == tokenizer::Utf8Step::Kind::kValid) {
      out.append(bytes.substr(pos, step.length));
    } else {
      out.append(tokenizer::kReplacementCharacter);
    }
    pos += step.length;
  }
  return out;
}

}  // namespace

absl::Status ValidateStopOptions(const StopOptions& o, int vocab_size) {
  if (o.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens=", o.max_tokens, " must be >= 1"));
  }
  if (o.min_tokens < 0 || o.min_tokens > o.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens=", o.min_tokens, " must be in [0, max_tokens]"));
  }
  for (size_t i = 0; i < o.stop_strings.size(); ++i) {
    if (o.stop_strings[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop_strings[", i, "] is empty"));
    }
  }
  for (size_t i = 0; i < o.stop_token_ids.size(); ++i) {
    if (o.stop_token_ids[i] < 0 || o.stop_token_ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "stop_token_ids[", i, "]=", o.stop_token_ids[i], " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kEndOfGeneration:
      return "eos";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kDeadline:
      return "deadline";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

StopChecker::StopChecker(const StopOptions& options, std::function<bool(int32_t)> is_eog)
    : options_(options), is_eog_(std::move(is_eog)) {
  for (const std::string& s : options_.stop_strings)
    longest_stop_ = std::max(longest_stop_, s.size());
}

StopChecker::Step StopChecker::Add(int32_t token, std::string_view bytes, int n) {
  Step step;
  const bool may_stop = n >= options_.min_tokens;
  if (may_stop && !options_.ignore_eos && is_eog_(token)) {
    step.text = ValidUtf8(std::string_view(text_).substr(emitted_));
    emitted_ = text_.size();
    step.finish = FinishReason::kEndOfGeneration;
    return step;
  }
  if (may_stop && std::find(options_.stop_token_ids.begin(), options_.stop_token_ids.end(),
                            token) != options_.stop_token_ids.end()) {
    step.text = ValidUtf8(std::string_view(text_).substr(emitted_));
    emitted_ = text_.size();
    step.finish = FinishReason::kStopToken;
    return step;
  }
  const size_t before = text_.size();
  text_.append(bytes);
  if (may_stop && longest_stop_ > 0) {
    // Earliest match that ends in the new bytes.
    const size_t from = before >= longest_stop_ ? before - longest_stop_ + 1 : 0;
    size_t best = std::string::npos;
    const std::string* matched = nullptr;
    for (const std::string& s : options_.stop_strings) {
      const size_t pos = text_.find(s, from);
      if (pos != std::string::npos && pos < best) best = pos, matched = &s;
    }
    if (best != std::string::npos) {
      step.matched_stop = *matched;
      const size_t cut = options_.include_stop_string ? best + matched->size() : best;
      text_.resize(cut);
      step.text = ValidUtf8(std::string_view(text_).substr(std::min(emitted_, cut)));
      emitted_ = text_.size();
      step.finish = FinishReason::kStopString;
      return step;
    }
  }
  if (n >= options_.max_tokens) {
    step.text = ValidUtf8(std::string_view(text_).substr(emitted_));
    emitted_ = text_.size();
    step.finish = FinishReason::kLength;
    return step;
  }
  // Hold back a suffix that could begin a stop string, and an incomplete UTF-8 character.
  size_t hold = IncompleteUtf8Tail(text_);
  for (const std::string& s : options_.stop_strings) {
    for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k) {
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  const size_t safe = text_.size() - hold;
  if (safe > emitted_) {
    step.text = ValidUtf8(std::string_view(text_).substr(emitted_, safe - emitted_));
    emitted_ = safe;
  }
  return step;
}

}  // namespace kvstrata::engine
