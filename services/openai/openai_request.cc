#include "services/openai/openai_request.h"

#include <limits>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "services/openai/json_fields.h"

namespace kvstrata::openai {
namespace {

// Fields both endpoints share: sampling, stop conditions, streaming, routing hints, and the
// kvstrata extensions a client may add (through extra_body in OpenAI's clients).
absl::Status ParseCommon(const json& o, OpenAiRequest* r) {
  v1::GenerateRequest& g = r->generate;
  std::optional<std::string> model;
  KV_RETURN_IF_ERROR(GetString(o, "model", &model));
  if (model) r->model = *model;
  g.set_model(r->model);

  v1::SamplingParams& s = *g.mutable_sampling();
  std::optional<double> number;
  KV_RETURN_IF_ERROR(GetNumber(o, "temperature", &number));
  if (number) s.set_temperature(static_cast<float>(*number));
  for (auto [name, setter] :
       std::initializer_list<std::pair<const char*, void (v1::SamplingParams::*)(float)>>{
           {"top_p", &v1::SamplingParams::set_top_p},
           {"min_p", &v1::SamplingParams::set_min_p},
           {"presence_penalty", &v1::SamplingParams::set_presence_penalty},
           {"frequency_penalty", &v1::SamplingParams::set_frequency_penalty},
           {"repetition_penalty", &v1::SamplingParams::set_repetition_penalty}}) {
    number.reset();
    KV_RETURN_IF_ERROR(GetNumber(o, name, &number));
    if (number) (s.*setter)(static_cast<float>(*number));
  }
  std::optional<int64_t> i;
  KV_RETURN_IF_ERROR(GetInt(o, "top_k", -1, std::numeric_limits<int32_t>::max(), &i));
  if (i && *i > 0) s.set_top_k(static_cast<uint32_t>(*i));  // -1 and 0: off
  i.reset();
  KV_RETURN_IF_ERROR(GetInt(o, "n", 1, 128, &i));
  if (i) s.set_n(static_cast<uint32_t>(*i));
  i.reset();
  KV_RETURN_IF_ERROR(GetInt(o, "seed", std::numeric_limits<int64_t>::min(),
                            std::numeric_limits<int64_t>::max(), &i));
  if (i) s.set_seed(static_cast<uint64_t>(*i));

  v1::StopConditions& stop = *g.mutable_stop();
  if (const json* v = Field(o, "stop")) {
    if (v->is_string()) {
      stop.add_stop_strings(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t k = 0; k < v->size(); ++k) {
        if (!(*v)[k].is_string()) return Invalid(absl::StrCat("stop[", k, "]"), "must be a string");
        stop.add_stop_strings((*v)[k].get<std::string>());
      }
    } else {
      return Invalid("stop", "must be a string or an array of strings");
    }
  }
  if (const json* v = Field(o, "stop_token_ids")) {
    if (!v->is_array()) return Invalid("stop_token_ids", "must be an array of token ids");
    v1::TokenIds ids;
    KV_RETURN_IF_ERROR(GetTokenIds(*v, "stop_token_ids", &ids));
    for (uint32_t id : ids.ids()) stop.add_stop_token_ids(id);
  }
  i.reset();
  KV_RETURN_IF_ERROR(GetInt(o, "min_tokens", 0, std::numeric_limits<uint32_t>::max(), &i));
  if (i) stop.set_min_tokens(static_cast<uint32_t>(*i));
  bool flag = false;
  KV_RETURN_IF_ERROR(GetBool(o, "ignore_eos", &flag));
  stop.set_ignore_eos(flag);
  flag = false;
  KV_RETURN_IF_ERROR(GetBool(o, "include_stop_str_in_output", &flag));
  stop.set_include_stop_str_in_output(flag);

  KV_RETURN_IF_ERROR(GetBool(o, "stream", &r->stream));
  if (const json* v = Field(o, "stream_options")) {
    if (!v->is_object()) return Invalid("stream_options", "must be an object");
    if (!r->stream) return Invalid("stream_options", "only allowed when stream is true");
    KV_RETURN_IF_ERROR(GetBool(*v, "include_usage", &r->include_usage));
  }
  if (const json* v = Field(o, "logit_bias")) {
    if (!v->is_object()) return Invalid("logit_bias", "must be an object");
    if (!v->empty()) return Invalid("logit_bias", "not supported by kvstrata");
  }

  // Routing and tenancy. `user` names the end user; their requests tend to continue one
  // another, so it is the session the router keeps on one worker unless session_id says more.
  std::optional<std::string> text;
  KV_RETURN_IF_ERROR(GetString(o, "user", &text));
  if (text) g.mutable_cache_hints()->set_session_id(*text);
  text.reset();
  KV_RETURN_IF_ERROR(GetString(o, "session_id", &text));
  if (text) g.mutable_cache_hints()->set_session_id(*text);
  text.reset();
  KV_RETURN_IF_ERROR(GetString(o, "cache_salt", &text));
  if (text) g.set_cache_salt(*text);
  i.reset();
  KV_RETURN_IF_ERROR(GetInt(o, "priority", -100, 100, &i));
  if (i) g.set_priority(static_cast<int32_t>(*i));
  return absl::OkStatus();
}

absl::Status ParseCompletion(const json& o, OpenAiRequest* r) {
  v1::GenerateRequest& g = r->generate;
  const json* prompt = Field(o, "prompt");
  if (prompt == nullptr) return Invalid("prompt", "required");
  const json* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];  // a batch of one
  }
  if (p->is_string()) {
    g.set_text(p->get<std::string>());
  } else if (p->is_array() && (p->empty() || (*p)[0].is_number())) {
    KV_RETURN_IF_ERROR(GetTokenIds(*p, "prompt", g.mutable_token_ids()));
  } else if (p->is_array()) {
    return Invalid("prompt", "batches of several prompts are not supported; send one per request");
  } else {
    return Invalid("prompt", "must be a string, an array of token ids, or an array of one of them");
  }
  std::optional<int64_t> max_tokens;
  KV_RETURN_IF_ERROR(GetInt(o, "max_tokens", 1, std::numeric_limits<uint32_t>::max(), &max_tokens));
  g.mutable_stop()->set_max_tokens(max_tokens ? static_cast<uint32_t>(*max_tokens)
                                              : kCompletionsDefaultMaxTokens);
  std::optional<int64_t> logprobs;
  KV_RETURN_IF_ERROR(GetInt(o, "logprobs", 0, 1000, &logprobs));
  if (logprobs) {
    r->logprobs = true;
    r->top_logprobs = static_cast<uint32_t>(*logprobs);
    g.mutable_logprobs()->set_top_n(r->top_logprobs);
  }
  bool echo = false;
  KV_RETURN_IF_ERROR(GetBool(o, "echo", &echo));
  if (echo) return Invalid("echo", "not supported by kvstrata");
  std::optional<std::string> suffix;
  KV_RETURN_IF_ERROR(GetString(o, "suffix", &suffix));
  if (suffix && !suffix->empty()) return Invalid("suffix", "not supported by kvstrata");
  std::optional<int64_t> best_of;
  KV_RETURN_IF_ERROR(GetInt(o, "best_of", 1, 128, &best_of));
  if (best_of && *best_of != std::max<int64_t>(1, g.sampling().n())) {
    return Invalid("best_of", "only best_of = n is supported");
  }
  return absl::OkStatus();
}

// One message's content: a string, or an array of text parts (joined by newlines).
absl::StatusOr<std::string> MessageContent(const json& m, const std::string& param) {
  const json* c = Field(m, "content");
  if (c == nullptr) {
    if (Field(m, "tool_calls") != nullptr || Field(m, "function_call") != nullptr) {
      return Invalid(absl::StrCat(param, ".tool_calls"), "tool calls are not supported");
    }
    return std::string();
  }
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) return Invalid(param + ".content", "must be a string or an array of parts");
  std::string text;
  for (size_t k = 0; k < c->size(); ++k) {
    const json& part = (*c)[k];
    const std::string where = absl::StrCat(param, ".content[", k, "]");
    if (!part.is_object()) return Invalid(where, "must be an object");
    const json* type = Field(part, "type");
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
      return Invalid(where + ".type", "only text content is supported");
    }
    const json* t = Field(part, "text");
    if (t == nullptr || !t->is_string()) return Invalid(where + ".text", "must be a string");
    if (k > 0) text += "\n";
    text += t->get<std::string>();
  }
  return text;
}

absl::Status ParseChat(const json& o, OpenAiRequest* r) {
  v1::GenerateRequest& g = r->generate;
  const json* messages = Field(o, "messages");
  if (messages == nullptr) return Invalid("messages", "required");
  if (!messages->is_array() || messages->empty()) {
    return Invalid("messages", "must be a non-empty array of messages");
  }
  v1::ChatInput& chat = *g.mutable_chat();
  chat.set_apply_chat_template(true);
  chat.set_add_generation_prompt(true);
  for (size_t k = 0; k < messages->size(); ++k) {
    const json& m = (*messages)[k];
    const std::string param = absl::StrCat("messages[", k, "]");
    if (!m.is_object()) return Invalid(param, "must be an object");
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) return Invalid(param + ".role", "must be a string");
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";  // OpenAI's newer name for the system role
    if (name == "tool" || name == "function") {
      return Invalid(param + ".role", "tool messages are not supported");
    }
    KV_ASSIGN_OR_RETURN(std::string content, MessageContent(m, param));
    v1::ChatMessage* out = chat.add_messages();
    out->set_role(std::move(name));
    out->set_content(std::move(content));
  }
  // max_completion_tokens replaced max_tokens, which OpenAI still accepts.
  std::optional<int64_t> max_tokens;
  KV_RETURN_IF_ERROR(GetInt(o, "max_tokens", 1, std::numeric_limits<uint32_t>::max(), &max_tokens));
  std::optional<int64_t> max_completion;
  KV_RETURN_IF_ERROR(
      GetInt(o, "max_completion_tokens", 1, std::numeric_limits<uint32_t>::max(), &max_completion));
  if (max_completion) max_tokens = max_completion;
  if (max_tokens) g.mutable_stop()->set_max_tokens(static_cast<uint32_t>(*max_tokens));

  KV_RETURN_IF_ERROR(GetBool(o, "logprobs", &r->logprobs));
  std::optional<int64_t> top;
  KV_RETURN_IF_ERROR(GetInt(o, "top_logprobs", 0, 1000, &top));
  if (top && !r->logprobs) return Invalid("top_logprobs", "requires logprobs to be true");
  if (r->logprobs) {
    r->top_logprobs = top ? static_cast<uint32_t>(*top) : 0;
    g.mutable_logprobs()->set_top_n(r->top_logprobs);
  }
  for (const char* name : {"tools", "functions"}) {
    const json* v = Field(o, name);
    if (v != nullptr && !(v->is_array() && v->empty())) {
      return Invalid(name, "tools are not supported by kvstrata");
    }
  }
  if (const json* v = Field(o, "response_format")) {
    const json* type = v->is_object() ? Field(*v, "type") : nullptr;
    if (type == nullptr || *type != "text") {
      return Invalid("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseRequest(Endpoint endpoint, std::string_view body) {
  json o;
  try {  // the parser's only way to say where the error is; it does not leave this function
    o = json::parse(body);
  } catch (const json::exception& e) {
    const auto* parse_error = dynamic_cast<const json::parse_error*>(&e);
    return absl::InvalidArgumentError(
        parse_error != nullptr ? absl::StrCat("body: not valid JSON (byte ", parse_error->byte, ")")
                               : std::string("body: not valid JSON"));
  }
  if (!o.is_object()) return absl::InvalidArgumentError("body: must be a JSON object");
  OpenAiRequest r;
  r.endpoint = endpoint;
  KV_RETURN_IF_ERROR(ParseCommon(o, &r));
  if (endpoint == Endpoint::kCompletions) {
    KV_RETURN_IF_ERROR(ParseCompletion(o, &r));
  } else {
    KV_RETURN_IF_ERROR(ParseChat(o, &r));
  }
  return r;
}

}  // namespace kvstrata::openai
