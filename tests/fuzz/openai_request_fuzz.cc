// OpenAI request bodies, as the router's HTTP front reads them: the first byte picks the
// endpoint, the rest is the body. Any body is mapped or refused with a 400 that is a valid
// OpenAI error object; a mapped one is a GenerateRequest with exactly one input.

#include <nlohmann/json.hpp>
#include <string>

#include "services/openai/openai_errors.h"
#include "services/openai/openai_request.h"
#include "tests/fuzz/fuzz_util.h"

namespace kvstrata {

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const openai::Endpoint endpoint =
      data[0] % 2 == 0 ? openai::Endpoint::kCompletions : openai::Endpoint::kChatCompletions;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<openai::OpenAiRequest> r = openai::ParseRequest(endpoint, body);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    const openai::ApiError e = openai::ErrorFromStatus(r.status(), endpoint);
    FUZZ_CHECK(e.http_status == 400 && !e.message.empty());
    const nlohmann::json j = nlohmann::json::parse(openai::ErrorBody(e), nullptr, false);
    FUZZ_CHECK(!j.is_discarded() && j["error"]["type"] == "invalid_request_error");
    return 0;
  }
  const v1::GenerateRequest& g = r->generate;
  if (endpoint == openai::Endpoint::kChatCompletions) {
    FUZZ_CHECK(g.has_chat() && g.chat().messages_size() > 0 && g.chat().apply_chat_template());
  } else {
    FUZZ_CHECK(g.input_case() == v1::GenerateRequest::kText ||
               g.input_case() == v1::GenerateRequest::kTokenIds);
    FUZZ_CHECK(g.stop().max_tokens() >= 1);
  }
  FUZZ_CHECK(r->include_usage ? r->stream : true);
  // Strings came from JSON, so they are UTF-8 and the message serializes.
  std::string bytes;
  FUZZ_CHECK(g.SerializeToString(&bytes));
  return 0;
}

}  // namespace kvstrata
