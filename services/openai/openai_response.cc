#include "services/openai/openai_response.h"

#include <nlohmann/json.hpp>

namespace kvstrata::openai {
namespace {

using json = nlohmann::json;

std::string Dump(const json& j) {
  // Token text can be part of a UTF-8 character: such bytes become U+FFFD (`bytes` is exact).
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json Nullable(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }

json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details",
           {{"cached_tokens", u.cached_local_tokens() + u.cached_kvstore_tokens()}}}};
}

std::string TokenText(const tokenizer::Tokenizer* t, uint32_t id) {
  if (t == nullptr || static_cast<int64_t>(id) >= t->vocab_size()) return "";
  return std::string(t->TokenBytes(static_cast<int32_t>(id)));
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [...]}], "refusal": null}.
json ChatLogprobs(const std::vector<v1::TokenLogprob>& entries, const tokenizer::Tokenizer* t) {
  json content = json::array();
  for (const v1::TokenLogprob& e : entries) {
    const std::string text = TokenText(t, e.token_id());
    json top = json::array();
    for (const v1::TopLogprob& alt : e.top()) {
      const std::string alt_text = TokenText(t, alt.token_id());
      top.push_back({{"token", alt_text}, {"logprob", alt.logprob()}, {"bytes", Bytes(alt_text)}});
    }
    content.push_back({{"token", text},
                       {"logprob", e.logprob()},
                       {"bytes", Bytes(text)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}; `offset` is where
// the first entry's text starts in the choice's text, and moves past the entries.
json CompletionLogprobs(const std::vector<v1::TokenLogprob>& entries, const tokenizer::Tokenizer* t,
                        int64_t* offset) {
  json tokens = json::array(), logprobs = json::array(), top = json::array(),
       offsets = json::array();
  for (const v1::TokenLogprob& e : entries) {
    const std::string text = TokenText(t, e.token_id());
    tokens.push_back(text);
    logprobs.push_back(e.logprob());
    json alts = json::object();
    for (const v1::TopLogprob& alt : e.top()) alts[TokenText(t, alt.token_id())] = alt.logprob();
    top.push_back(std::move(alts));
    offsets.push_back(*offset);
    *offset += static_cast<int64_t>(text.size());
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

std::vector<v1::TokenLogprob> LogprobsOf(const v1::GenerateResponse& m) {
  return {m.logprobs().begin(), m.logprobs().end()};
}

}  // namespace

std::string FinishReasonName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP_TOKEN:
    case v1::FINISH_REASON_STOP_STRING:
    case v1::FINISH_REASON_ABORT:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_DEADLINE:
      return "length";
    case v1::FINISH_REASON_UNSPECIFIED:
    case v1::FINISH_REASON_ERROR:
    case v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      return "";
  }
  return "";
}

std::string ResponseBuilder::Events(const v1::GenerateResponse& message) {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  std::string out;
  auto emit = [&](json choices, json usage) {
    json chunk = {{"id", options_.id},
                  {"object", chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", options_.created},
                  {"model", options_.model},
                  {"choices", std::move(choices)}};
    if (!options_.system_fingerprint.empty()) {
      chunk["system_fingerprint"] = options_.system_fingerprint;
    }
    if (options_.include_usage) chunk["usage"] = std::move(usage);
    out += "data: " + Dump(chunk) + "\n\n";
  };
  auto choice = [&](uint32_t index, json delta_or_text, json logprobs, std::string finish) {
    json c = {
        {"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", Nullable(finish)}};
    c[chat ? "delta" : "text"] = std::move(delta_or_text);
    return json::array({std::move(c)});
  };

  const bool carries_tokens = !message.text().empty() || !message.logprobs().empty();
  const std::string finish = FinishReasonName(message.finish_reason());
  if (carries_tokens || !finish.empty()) {
    Choice& c = choices_[message.index()];
    if (chat && !c.started) {
      emit(choice(message.index(), {{"role", "assistant"}, {"content", ""}}, nullptr, ""), nullptr);
    }
    c.started = true;
    if (carries_tokens) {
      json logprobs = nullptr;
      if (options_.logprobs) {
        logprobs = chat
                       ? ChatLogprobs(LogprobsOf(message), options_.tokenizer)
                       : CompletionLogprobs(LogprobsOf(message), options_.tokenizer, &c.text_bytes);
      }
      json body = chat ? json{{"content", message.text()}} : json(message.text());
      // A completions chunk carries its finish reason with its text; chat sends it apart.
      emit(choice(message.index(), std::move(body), std::move(logprobs), chat ? "" : finish),
           nullptr);
      if (!chat) c.finish = message.finish_reason();
    }
    if (!finish.empty() && (chat || !carries_tokens)) {
      emit(choice(message.index(), chat ? json::object() : json(""), nullptr, finish), nullptr);
    }
  }
  if (message.has_usage() && options_.include_usage) {
    emit(json::array(), UsageJson(message.usage()));
  }
  return out;
}

void ResponseBuilder::Add(const v1::GenerateResponse& message) {
  Choice& c = choices_[message.index()];
  c.text += message.text();
  c.logprobs.insert(c.logprobs.end(), message.logprobs().begin(), message.logprobs().end());
  if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) c.finish = message.finish_reason();
  if (message.has_usage()) usage_ = message.usage();
}

std::string ResponseBuilder::Body() const {
  const bool chat = options_.endpoint == Endpoint::kChatCompletions;
  json choices = json::array();
  std::map<uint32_t, Choice> all = choices_;
  all.try_emplace(0);  // a request always has its first choice
  for (const auto& [index, c] : all) {
    json logprobs = nullptr;
    if (options_.logprobs) {
      int64_t offset = 0;
      logprobs = chat ? ChatLogprobs(c.logprobs, options_.tokenizer)
                      : CompletionLogprobs(c.logprobs, options_.tokenizer, &offset);
    }
    json entry = {{"index", index},
                  {"logprobs", std::move(logprobs)},
                  {"finish_reason", Nullable(FinishReasonName(c.finish))}};
    if (chat) {
      entry["message"] = {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}};
    } else {
      entry["text"] = c.text;
    }
    choices.push_back(std::move(entry));
  }
  json body = {{"id", options_.id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", options_.created},
               {"model", options_.model},
               {"choices", std::move(choices)},
               {"usage", usage_ ? UsageJson(*usage_) : json(nullptr)}};
  if (!options_.system_fingerprint.empty())
    body["system_fingerprint"] = options_.system_fingerprint;
  return Dump(body);
}

}  // namespace kvstrata::openai
