// kvstrata request: sends one prompt to a running router (or a decode worker) over
// kvstrata.v1.Generation, streams the text to stdout as it arrives, and prints one summary line
// to stderr: the worker that served it, the finish reason, prompt tokens and how many of them
// were cached (on the worker, from the kvstore), generated tokens, time to first token and
// total time as seen by this client.
//
//   kvstrata request --chat --prompt "What is the capital of France?"
//   kvstrata request --target=127.0.0.1:50071 --prompt "Once upon a time" --max-tokens 32
//
// Exit status: 0 on success, 2 for a bad flag, 1 when the RPC fails (its gRPC code and message
// are printed).

#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/generation_client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50070",
          "HOST:PORT of the Generation service: the router (default) or a decode worker");
ABSL_FLAG(int64_t, deadline_ms, 0, "RPC deadline in milliseconds; 0 = none");
ABSL_FLAG(std::string, request_id, "", "request id (default: the server assigns one)");
// Shared with `kvstrata generate`, which defines them (flags are global to the binary).
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(bool, chat);
ABSL_DECLARE_FLAG(std::string, system);
ABSL_DECLARE_FLAG(int, max_tokens);
ABSL_DECLARE_FLAG(float, temperature);
ABSL_DECLARE_FLAG(uint32_t, seed);

namespace kvstrata::cli {
namespace {

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "kvstrata request: %s\n", message.c_str());
  return 2;
}

int RunRequest() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string system = absl::GetFlag(FLAGS_system);
  const bool chat = absl::GetFlag(FLAGS_chat);
  if (target.empty()) return BadFlag("--target must be HOST:PORT");
  if (prompt.empty()) return BadFlag("--prompt is required (the text, or with --chat the user message)");
  if (!system.empty() && !chat) return BadFlag("--system needs --chat");

  ClientRequest request;
  request.request_id = absl::GetFlag(FLAGS_request_id);
  const int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (max_tokens < 1) return BadFlag(absl::StrCat("--max-tokens=", max_tokens, " must be >= 1"));
  request.max_tokens = static_cast<uint32_t>(max_tokens);
  request.temperature = absl::GetFlag(FLAGS_temperature);
  if (request.temperature < 0) return BadFlag("--temperature must be >= 0");
  request.seed = absl::GetFlag(FLAGS_seed);
  request.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  if (request.deadline_ms < 0) return BadFlag("--deadline-ms must be >= 0");
  if (chat) {
    if (!system.empty()) request.messages.emplace_back("system", system);
    request.messages.emplace_back("user", prompt);
  } else {
    request.text = prompt;
  }

  absl::StatusOr<ClientResult> result = Generate(target, request, [](const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  if (!result.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nkvstrata request: %s: %s\n", target.c_str(),
                 DescribeRpcError(result.status()).c_str());
    return 1;
  }
  if (result->text.empty() || result->text.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "request_id=%s worker=%s finish=%s prompt_tokens=%u cached_local=%u "
               "cached_kvstore=%u uncached=%u generated_tokens=%u ttft_ms=%.1f total_ms=%.1f\n",
               result->request_id.c_str(),
               result->worker_id.empty() ? "?" : result->worker_id.c_str(),
               result->finish_reason.empty() ? "?" : result->finish_reason.c_str(),
               result->prompt_tokens, result->cached_local_tokens, result->cached_kvstore_tokens,
               result->uncached_tokens, result->completion_tokens, result->ttft_ms,
               result->total_ms);
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(request, "request",
                 "send one prompt to a running router or decode worker, streaming the text",
                 RunRequest);

}  // namespace kvstrata::cli
