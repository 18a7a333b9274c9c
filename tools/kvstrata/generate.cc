// kvstrata generate: runs one prompt through the engine on the CPU and streams the text to
// stdout, then prints one line of figures to stderr (prompt and generated tokens, finish
// reason, prefill and decode tokens/s, and the KV cache the sequence held: bytes, pages and
// bits per element).
//
//   kvstrata generate --chat --prompt "What is the capital of France?"
//
// Exit status: 0 on success, 2 for a bad flag (the message names it), 1 for anything else
// (the model failed to load, the prompt does not fit, ...).

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/engine.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/engine_flags.h"

ABSL_FLAG(std::string, prompt, "", "the prompt (required)");
ABSL_FLAG(bool, chat, false, "render the prompt as a user message with the model's chat template");
ABSL_FLAG(std::string, system, "",
          "system message for --chat (default: the template's own default, if any)");
ABSL_FLAG(int, max_tokens, 256, "most tokens to generate (>= 1)");
ABSL_FLAG(float, temperature, 0.0f, "sampling temperature; 0 = greedy");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling: smallest set with this probability, in (0, 1]");
ABSL_FLAG(int, top_k, 0, "sample among the k most likely tokens; 0 = off");
ABSL_FLAG(float, min_p, 0.0f, "drop tokens below min_p times the top probability, in [0, 1)");
// --seed (default 1) is defined by format-demo, as flags are global to the binary; here it seeds
// sampling, so a run with --temperature > 0 is reproducible.
ABSL_DECLARE_FLAG(uint32_t, seed);

namespace kvstrata::cli {
namespace {

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "kvstrata generate: %s\n", message.c_str());
  return 2;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "kvstrata generate: %s\n", std::string(status.message()).c_str());
  return 1;
}

int RunGenerate() {
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  const std::string system = absl::GetFlag(FLAGS_system);
  const bool chat = absl::GetFlag(FLAGS_chat);
  if (prompt.empty()) return BadFlag("--prompt is required (the text to continue or answer)");
  if (!system.empty() && !chat) return BadFlag("--system needs --chat");

  engine::GenerationRequest request;
  request.request_id = "cli";
  request.stop.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  engine::SamplingOptions& s = request.sampling;
  s.temperature = absl::GetFlag(FLAGS_temperature);
  s.top_p = absl::GetFlag(FLAGS_top_p);
  s.top_k = absl::GetFlag(FLAGS_top_k);
  s.min_p = absl::GetFlag(FLAGS_min_p);
  s.seed = absl::GetFlag(FLAGS_seed);
  if (request.stop.max_tokens < 1) {
    return BadFlag(absl::StrCat("--max-tokens=", request.stop.max_tokens, " must be >= 1"));
  }
  if (absl::Status st = engine::ValidateSamplingOptions(s); !st.ok()) {
    // The sampler names its fields as the flags spell them, with '_' for '-'.
    std::string message(st.message());
    const size_t eq = message.find('=');
    std::string field = message.substr(0, eq);
    for (char& c : field) c = c == '_' ? '-' : c;
    return BadFlag(absl::StrCat("--", field, message.substr(eq)));
  }
  absl::StatusOr<engine::EngineOptions> options = EngineOptionsFromFlags();
  if (absl::IsInvalidArgument(options.status()))
    return BadFlag(std::string(options.status().message()));
  if (!options.ok()) return Fail(options.status());
  // One sequence: the BF16 working set is sized for it alone, the rest of the budget is INT2.
  options->kv_cache.max_sequences = 1;
  options->scheduler.max_running = 1;

  absl::StatusOr<std::unique_ptr<engine::Engine>> loaded = engine::Engine::Load(*options);
  if (!loaded.ok()) return Fail(loaded.status());
  engine::Engine& e = **loaded;

  if (chat) {
    std::vector<tokenizer::ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system});
    messages.push_back({"user", prompt});
    absl::StatusOr<std::vector<int32_t>> ids = e.EncodeChat(messages);
    if (!ids.ok()) return Fail(ids.status());
    request.prompt = std::move(*ids);
  } else {
    request.prompt = e.EncodeText(prompt);
  }
  absl::StatusOr<PageKey> ns = e.PageNamespace(/*cache_salt=*/"");
  if (!ns.ok()) return Fail(ns.status());
  request.namespace_key = *ns;

  absl::StatusOr<engine::GenerationStats> stats =
      e.Generate(std::move(request), [](const engine::GenerationEvent& event) {
        if (event.text.empty()) return;
        std::fwrite(event.text.data(), 1, event.text.size(), stdout);
        std::fflush(stdout);
      });
  if (!stats.ok()) return Fail(stats.status());
  if (stats->text.empty() || stats->text.back() != '\n') std::fputc('\n', stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "prompt_tokens=%d generated_tokens=%d finish=%s prefill=%.1f tok/s decode=%.1f "
               "tok/s kv_format=%s kv_tokens=%lld kv_bytes=%lld kv_pages=%lld+%lld "
               "kv_bits_per_element=%.2f\n",
               stats->prompt_tokens, stats->generated_tokens,
               engine::FinishReasonName(stats->finish), stats->prefill_tokens_per_second(),
               stats->decode_tokens_per_second(), e.KvFormatString().c_str(),
               static_cast<long long>(stats->kv_tokens), static_cast<long long>(stats->kv_bytes),
               static_cast<long long>(stats->kv_bf16_pages),
               static_cast<long long>(stats->kv_int2_pages), stats->kv_bits_per_element);
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(generate, "generate",
                 "run a prompt through the model on the CPU, streaming the text", RunGenerate);

}  // namespace kvstrata::cli
