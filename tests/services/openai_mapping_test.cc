// The OpenAI front's mappings without a server: request bodies to GenerateRequest, statuses to
// OpenAI error objects, and Generate streams to response objects and server-sent events.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "services/openai/openai_errors.h"
#include "services/openai/openai_request.h"
#include "services/openai/openai_response.h"

namespace kvstrata::openai {
namespace {

using json = nlohmann::json;

OpenAiRequest Parse(Endpoint e, const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(e, body);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : OpenAiRequest();
}

// The parameter an error names, as a client would see it.
std::string ErrorParam(Endpoint e, const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(e, body);
  if (r.ok()) return "(accepted)";
  const ApiError err = ErrorFromStatus(r.status(), e);
  EXPECT_EQ(err.http_status, 400) << body;
  return err.param;
}

TEST(OpenAiRequest, ChatFieldsMapOntoGenerate) {
  const OpenAiRequest r = Parse(Endpoint::kChatCompletions, R"({
    "model": "m", "messages": [{"role": "developer", "content": "Be brief."},
                               {"role": "user", "content": [{"type": "text", "text": "a"},
                                                            {"type": "text", "text": "b"}]}],
    "max_tokens": 7, "max_completion_tokens": 9, "temperature": 0, "top_p": 0.5, "seed": -1,
    "presence_penalty": 0.25, "frequency_penalty": -0.5, "stop": "END", "n": 1,
    "logprobs": true, "top_logprobs": 3, "stream": true, "stream_options": {"include_usage": true},
    "user": "ann", "top_k": 40, "cache_salt": "tenant", "priority": 5, "future_field": [1, 2]})");
  const v1::GenerateRequest& g = r.generate;
  EXPECT_EQ(g.model(), "m");
  ASSERT_EQ(g.chat().messages_size(), 2);
  EXPECT_EQ(g.chat().messages(0).role(), "system");
  EXPECT_EQ(g.chat().messages(1).content(), "a\nb");
  EXPECT_TRUE(g.chat().apply_chat_template());
  EXPECT_TRUE(g.chat().add_generation_prompt());
  EXPECT_EQ(g.stop().max_tokens(), 9u);  // max_completion_tokens wins
  ASSERT_TRUE(g.sampling().has_temperature());
  EXPECT_EQ(g.sampling().temperature(), 0.0f);
  EXPECT_EQ(g.sampling().top_p(), 0.5f);
  EXPECT_EQ(g.sampling().seed(), ~uint64_t{0});
  EXPECT_EQ(g.sampling().presence_penalty(), 0.25f);
  EXPECT_EQ(g.sampling().frequency_penalty(), -0.5f);
  EXPECT_EQ(g.sampling().top_k(), 40u);
  EXPECT_EQ(g.sampling().n(), 1u);
  ASSERT_EQ(g.stop().stop_strings_size(), 1);
  EXPECT_EQ(g.stop().stop_strings(0), "END");
  EXPECT_EQ(g.logprobs().top_n(), 3u);
  EXPECT_TRUE(r.logprobs && r.stream && r.include_usage);
  EXPECT_EQ(g.cache_hints().session_id(), "ann");
  EXPECT_EQ(g.cache_salt(), "tenant");
  EXPECT_EQ(g.priority(), 5);
}

TEST(OpenAiRequest, CompletionDefaultsAndPromptForms) {
  OpenAiRequest r = Parse(Endpoint::kCompletions, R"({"prompt": "hi"})");
  EXPECT_EQ(r.generate.text(), "hi");
  EXPECT_EQ(r.generate.stop().max_tokens(), kCompletionsDefaultMaxTokens);
  EXPECT_FALSE(r.generate.sampling().has_temperature());  // the server's default, 1
  EXPECT_FALSE(r.generate.has_logprobs());
  EXPECT_FALSE(r.stream);
  r = Parse(Endpoint::kCompletions,
            R"({"prompt": [[1, 2, 3]], "logprobs": 0, "max_tokens": null})");
  EXPECT_EQ(r.generate.token_ids().ids_size(), 3);
  EXPECT_TRUE(r.logprobs);
  EXPECT_TRUE(r.generate.has_logprobs());
  r = Parse(Endpoint::kCompletions, R"({"prompt": ["one prompt"], "stop": ["a", "b"]})");
  EXPECT_EQ(r.generate.text(), "one prompt");
  EXPECT_EQ(r.generate.stop().stop_strings_size(), 2);
  r = Parse(Endpoint::kChatCompletions, R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r.generate.stop().max_tokens(), 0u);  // chat: up to the context limit
}

TEST(OpenAiRequest, ErrorsNameTheParameter) {
  const Endpoint c = Endpoint::kCompletions, chat = Endpoint::kChatCompletions;
  EXPECT_EQ(ErrorParam(c, "{"), "");  // not JSON: the body, no parameter
  EXPECT_EQ(ErrorParam(c, "[1]"), "");
  EXPECT_EQ(ErrorParam(c, "{}"), "prompt");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": ["a", "b"]})"), "prompt");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": [1, -2]})"), "prompt[1]");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "temperature": "hot"})"), "temperature");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "max_tokens": 0})"), "max_tokens");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "max_tokens": 1.5})"), "max_tokens");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "n": 0})"), "n");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "stop": [1]})"), "stop[0]");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "echo": true})"), "echo");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "suffix": "z"})"), "suffix");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "best_of": 3})"), "best_of");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "logit_bias": {"5": 1}})"), "logit_bias");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "stream_options": {}})"), "stream_options");
  EXPECT_EQ(ErrorParam(c, R"({"prompt": "a", "model": 5})"), "model");
  EXPECT_EQ(ErrorParam(chat, R"({"messages": []})"), "messages");
  EXPECT_EQ(ErrorParam(chat, R"({"messages": [{"content": "x"}]})"), "messages[0].role");
  EXPECT_EQ(ErrorParam(chat, R"({"messages": [{"role": "tool", "content": "x"}]})"),
            "messages[0].role");
  EXPECT_EQ(
      ErrorParam(chat, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"),
      "messages[0].content[0].type");
  EXPECT_EQ(
      ErrorParam(chat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})"),
      "top_logprobs");
  EXPECT_EQ(ErrorParam(chat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})"),
            "tools");
  EXPECT_EQ(ErrorParam(chat, R"({"messages": [{"role": "user", "content": "x"}],
                                 "response_format": {"type": "json_object"}})"),
            "response_format");
  // Accepted as OpenAI accepts them: empty tools, a text response format, nulls.
  EXPECT_EQ(ErrorParam(chat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [],
                                 "response_format": {"type": "text"}, "temperature": null})"),
            "(accepted)");
}

TEST(OpenAiErrors, ServerStatusesBecomeOpenAiErrors) {
  const Endpoint chat = Endpoint::kChatCompletions;
  ApiError e =
      ErrorFromStatus(absl::InvalidArgumentError("sampling.top_p=2 must be in [0, 1]"), chat);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_EQ(e.param, "top_p");
  EXPECT_EQ(e.message, "top_p=2 must be in [0, 1]");
  e = ErrorFromStatus(absl::InvalidArgumentError("logprobs.top_n=30 exceeds max_logprobs_top_n=20"),
                      chat);
  EXPECT_EQ(e.param, "top_logprobs");
  EXPECT_EQ(ErrorFromStatus(absl::InvalidArgumentError("logprobs.top_n=30 exceeds"),
                            Endpoint::kCompletions)
                .param,
            "logprobs");
  e = ErrorFromStatus(absl::OutOfRangeError("prompt tokens 9000 + stop.max_tokens 16 exceed "
                                            "max_context_tokens=8192"),
                      chat);
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "messages");
  EXPECT_EQ(e.message, "prompt tokens 9000 + max_tokens 16 exceed max_context_tokens=8192");
  e = ErrorFromStatus(absl::NotFoundError("model: 'x' is not served here"), chat);
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.code, "model_not_found");
  EXPECT_EQ(e.param, "model");
  struct Case {
    absl::Status status;
    int http;
    const char* type;
    const char* code;
  };
  for (const Case& c : std::vector<Case>{
           {absl::ResourceExhaustedError("the queue is full"), 429, "rate_limit_error",
            "queue_full"},
           {absl::ResourceExhaustedError("Received message larger than max (9 vs. 4)"), 413,
            "invalid_request_error", "request_too_large"},
           {absl::UnavailableError("no healthy worker"), 503, "server_error", "unavailable"},
           {absl::DeadlineExceededError("too late"), 504, "timeout_error", "deadline_exceeded"},
           {absl::AlreadyExistsError("request_id: 'a' is in flight"), 409, "invalid_request_error",
            "request_in_flight"},
           {absl::FailedPreconditionError("chat.apply_chat_template: no template"), 400,
            "invalid_request_error", ""},
           {absl::InternalError("boom"), 500, "server_error", ""},
           {absl::UnauthenticatedError("who"), 401, "authentication_error", ""},
           {absl::PermissionDeniedError("no"), 403, "permission_error", ""}}) {
    e = ErrorFromStatus(c.status, chat);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    EXPECT_EQ(e.code, c.code) << c.status;
  }
  const json body = json::parse(ErrorBody(HttpError(404, "no such path", "not_found")));
  EXPECT_EQ(body["error"]["message"], "no such path");
  EXPECT_EQ(body["error"]["code"], "not_found");
  EXPECT_TRUE(body["error"]["param"].is_null());
}

// A Generate stream: two token messages, then the final one with finish reason and usage.
std::vector<v1::GenerateResponse> Stream() {
  std::vector<v1::GenerateResponse> m(3);
  m[0].set_text("Hel");
  m[0].add_token_ids(1);
  m[1].set_text("lo");
  m[1].add_token_ids(2);
  m[2].set_finish_reason(v1::FINISH_REASON_STOP_STRING);
  v1::Usage* u = m[2].mutable_usage();
  u->set_prompt_tokens(200);
  u->set_completion_tokens(2);
  u->set_cached_local_tokens(64);
  u->set_cached_kvstore_tokens(64);
  u->set_uncached_tokens(72);
  return m;
}

ResponseOptions Options(Endpoint e, bool include_usage) {
  return {.endpoint = e,
          .id = "chatcmpl-7",
          .model = "m",
          .created = 1700000000,
          .include_usage = include_usage};
}

TEST(OpenAiResponse, WholeChatCompletion) {
  ResponseBuilder b(Options(Endpoint::kChatCompletions, false));
  for (const v1::GenerateResponse& m : Stream()) b.Add(m);
  const json r = json::parse(b.Body());
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["id"], "chatcmpl-7");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 200);
  EXPECT_EQ(r["usage"]["total_tokens"], 202);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 128);
}

// The JSON of each `data:` event.
std::vector<json> Events(const std::string& sse) {
  std::vector<json> out;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    out.push_back(json::parse(sse.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  return out;
}

TEST(OpenAiResponse, StreamedChatChunks) {
  ResponseBuilder b(Options(Endpoint::kChatCompletions, true));
  std::string sse;
  for (const v1::GenerateResponse& m : Stream()) sse += b.Events(m);
  const std::vector<json> e = Events(sse);
  ASSERT_EQ(e.size(), 5u);  // role, "Hel", "lo", finish, usage
  EXPECT_EQ(e[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(e[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_EQ(e[2]["choices"][0]["delta"]["content"], "lo");
  EXPECT_TRUE(e[2]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(e[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(e[3]["choices"][0]["delta"].empty());
  EXPECT_TRUE(e[3]["usage"].is_null());  // present, null, on every chunk but the last
  EXPECT_TRUE(e[4]["choices"].empty());
  EXPECT_EQ(e[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 128);
  for (const json& chunk : e) EXPECT_EQ(chunk["object"], "chat.completion.chunk");
  EXPECT_EQ(ResponseBuilder::Done(), "data: [DONE]\n\n");
}

TEST(OpenAiResponse, StreamedCompletionChunksWithoutUsage) {
  ResponseBuilder b(Options(Endpoint::kCompletions, false));
  std::string sse;
  for (const v1::GenerateResponse& m : Stream()) sse += b.Events(m);
  const std::vector<json> e = Events(sse);
  ASSERT_EQ(e.size(), 3u);  // "Hel", "lo", finish; no usage chunk unless asked
  EXPECT_EQ(e[0]["choices"][0]["text"], "Hel");
  EXPECT_EQ(e[2]["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(e[0].contains("usage"));
  EXPECT_EQ(e[0]["object"], "text_completion");
}

TEST(OpenAiResponse, FinishReasonsAsOpenAiNamesThem) {
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_STOP_TOKEN), "stop");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_STOP_STRING), "stop");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_ABORT), "stop");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_LENGTH), "length");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_DEADLINE), "length");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_UNSPECIFIED), "");
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_ERROR), "");
}

}  // namespace
}  // namespace kvstrata::openai
