#include "services/openai/openai_errors.h"

#include <cctype>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"

namespace kvstrata::openai {
namespace {

// kvstrata.v1 field paths in server messages and the OpenAI parameters they come from.
std::vector<std::pair<std::string, std::string>> FieldNames(Endpoint endpoint) {
  return {
      {"sampling.temperature", "temperature"},
      {"sampling.top_p", "top_p"},
      {"sampling.top_k", "top_k"},
      {"sampling.min_p", "min_p"},
      {"sampling.repetition_penalty", "repetition_penalty"},
      {"sampling.frequency_penalty", "frequency_penalty"},
      {"sampling.presence_penalty", "presence_penalty"},
      {"sampling.n", "n"},
      {"sampling.seed", "seed"},
      {"stop.stop_strings", "stop"},
      {"stop.stop_token_ids", "stop_token_ids"},
      {"stop.max_tokens", "max_tokens"},
      {"stop.min_tokens", "min_tokens"},
      {"logprobs.top_n", endpoint == Endpoint::kChatCompletions ? "top_logprobs" : "logprobs"},
      {"chat.messages", "messages"},
      {"chat.apply_chat_template", "messages"},
      {"token_ids.ids", "prompt"},
  };
}

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' ||
         c == ']';
}

// The parameter a message starts with ("top_p" in "top_p=2 must be ..."), or "".
std::string LeadingParam(const std::string& message) {
  size_t n = 0;
  while (n < message.size() && IsNameChar(message[n])) ++n;
  if (n == 0 || n == message.size() || (message[n] != ':' && message[n] != '=')) return "";
  const std::string name = message.substr(0, n);
  return name == "body" ? "" : name;  // the whole body (not JSON) is no parameter
}

std::string TypeFor(int http_status) {
  switch (http_status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 429:
      return "rate_limit_error";
    case 504:
      return "timeout_error";
    default:
      return http_status < 500 ? "invalid_request_error" : "server_error";
  }
}

}  // namespace

ApiError HttpError(int http_status, std::string message, std::string code) {
  return {.http_status = http_status,
          .type = TypeFor(http_status),
          .code = std::move(code),
          .message = std::move(message)};
}

ApiError ErrorFromStatus(const absl::Status& status, Endpoint endpoint) {
  std::string message(status.message());
  for (const auto& [from, to] : FieldNames(endpoint)) {
    message = absl::StrReplaceAll(message, {{from, to}});
  }
  // Whole-field names only where the message starts with them.
  if (absl::StartsWith(message, "text:")) message = "prompt:" + message.substr(5);
  const std::string input_param = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  ApiError e{.message = message};
  e.param = LeadingParam(message);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      break;
    case absl::StatusCode::kOutOfRange:
      e.http_status = 400;
      e.code = "context_length_exceeded";
      if (e.param.empty()) e.param = input_param;
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.code = "model_not_found";
      if (e.param.empty()) e.param = "model";
      break;
    case absl::StatusCode::kAlreadyExists:
      e.http_status = 409;
      e.code = "request_in_flight";
      break;
    case absl::StatusCode::kResourceExhausted:
      // gRPC's own refusal of a message over the size limit: retrying cannot help.
      if (absl::StrContains(message, "larger than max")) {
        e.http_status = 413;
        e.code = "request_too_large";
      } else {
        e.http_status = 429;
        e.code = "queue_full";
      }
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.code = "unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.code = "deadline_exceeded";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      e.code = "cancelled";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      break;
    case absl::StatusCode::kUnimplemented:
      e.http_status = 501;
      break;
    default:
      e.http_status = 500;
      break;
  }
  if (e.http_status >= 500 || e.http_status == 429 || e.http_status == 409) e.param.clear();
  e.type = TypeFor(e.http_status);
  return e;
}

std::string ErrorBody(const ApiError& error) {
  using json = nlohmann::json;
  json e = {{"message", error.message},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}};
  return json{{"error", std::move(e)}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvstrata::openai
