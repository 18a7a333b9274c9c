// A GenerateRequest from the network: the handler's own parse must agree with protobuf's on
// which bytes are a message (and explain every refusal), and a parsed request must go through
// validation and tokenisation (text, token ids, chat with the model's template) without a crash.

#include <google/protobuf/stubs/logging.h>

#include "kvstrata/v1/generate.pb.h"
#include "rpc/parse.h"
#include "services/common/generate_input.h"
#include "tests/fuzz/fuzz_util.h"
#include "tokenizer/prompt_encoder.h"

namespace kvstrata {
namespace {

const tokenizer::PromptEncoder& Encoder() {
  static const tokenizer::PromptEncoder* encoder = [] {
    absl::StatusOr<tokenizer::PromptEncoder> e =
        tokenizer::PromptEncoder::Create(fuzz::FuzzTokenizerSpec());
    FUZZ_CHECK(e.ok());
    return new tokenizer::PromptEncoder(*std::move(e));
  }();
  return *encoder;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static google::protobuf::LogSilencer quiet;  // the parser logs each string that is not UTF-8
  Encoder();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  v1::GenerateRequest reference;
  const bool parses = reference.ParseFromArray(data, static_cast<int>(size));
  v1::GenerateRequest request;
  const absl::Status parsed = rpc::ParseRequest(bytes, &request);
  FUZZ_CHECK(parsed.ok() == parses);
  if (!parsed.ok()) {
    FUZZ_CHECK(parsed.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(!rpc::DescribeParseFailure(bytes, *v1::GenerateRequest::descriptor()).empty());
    return 0;
  }
  if (!ValidateRequestEnvelope(request).ok()) return 0;
  ValidateRoutingHints(request.routing()).IgnoreError();
  const tokenizer::PromptEncoder& encoder = Encoder();
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptTokens(request, encoder, encoder.tokenizer().vocab_size());
  if (!prompt.ok()) return 0;
  for (int32_t id : *prompt) FUZZ_CHECK(id >= 0 && id < encoder.tokenizer().vocab_size());
  CheckContextLimit(static_cast<int64_t>(prompt->size()), request.stop().max_tokens(), 8192)
      .IgnoreError();
  return 0;
}

}  // namespace kvstrata
