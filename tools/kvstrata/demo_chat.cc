// kvstrata demo-chat: the client side of the README's main job. It sends a few chat requests to
// the router, one after another, that share one long operator system prompt (a support desk's
// product manual and policies, well over a thousand tokens) and differ only in a short user
// question. The first request prefills the whole prompt; later ones should find its full pages
// cached, on the worker that served the first (prefix-affinity routing) or in the kvstore.
//
// For each request it prints the question, the answer, the worker that served it and the cached
// prompt tokens by tier; then the cache hit ratio (cached prompt tokens / prompt tokens) over
// all requests and over those after the first, and each request's time to first token and
// decode speed (tokens after the first, per second, as the stream delivered them).
//
//   kvstrata demo-chat --target=127.0.0.1:50070 --requests=4
//
// Exit status: 0 when every request succeeded, 1 when any failed, 2 for a bad flag.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/generation_client.h"

ABSL_FLAG(int, requests, 4, "demo-chat: how many questions to send (sequentially)");
// --target and --deadline_ms come from `kvstrata request`, --max_tokens from `kvstrata generate`
// (flags are global to the binary). demo-chat keeps answers short: 48 tokens unless --max_tokens
// is given a value other than generate's default.
ABSL_DECLARE_FLAG(std::string, target);
ABSL_DECLARE_FLAG(int64_t, deadline_ms);
ABSL_DECLARE_FLAG(int, max_tokens);

namespace kvstrata::cli {
namespace {

constexpr int kDefaultAnswerTokens = 48;

// The shared prefix: what an operator would put in front of every conversation. Long on
// purpose, so that it fills many KV pages that every later request can reuse.
constexpr char kSystemPrompt[] =
    R"(You are Tessa, the support assistant of Northwind Kettleworks, a company that designs and sells the Aurora line of smart electric kettles and the Aurora Brew Station. You answer customers in a friendly, short and accurate way. Always answer in the language of the customer. If you do not know something, say so and offer to connect the customer with a human agent. Never invent order numbers, prices, tracking codes or policies that are not written below.

# Products

Aurora Kettle One: 1.7 litre stainless steel kettle, 2200 watts on 230 volt mains (1500 watts on the 120 volt model sold in North America). Five temperature presets: 70, 80, 85, 90 and 100 degrees Celsius. Keep-warm mode holds the chosen temperature for up to 30 minutes. The base has a 360 degree swivel connector and a cord store underneath. The lid opens with a push button and has a removable limescale filter. The kettle switches off automatically when it boils, when it is lifted from the base, and when it is switched on empty (boil-dry protection).

Aurora Kettle Mini: 0.8 litre travel kettle, 1100 watts, dual voltage (110 to 240 volts, switch under the base). One temperature only (boiling). Comes with two stacking cups and a travel pouch. Not compatible with the app.

Aurora Brew Station: kettle plus a pour-over brewer with a built-in scale. It controls water temperature to within one degree, pours in pulses at a rate the customer sets in the app, and shows the brew ratio on its display. The glass carafe holds 1 litre. The paper filters are size 02 cones.

# The Aurora app

The app runs on iOS 16 or newer and Android 11 or newer. It connects to the kettle over Bluetooth Low Energy for setup and over the home Wi-Fi (2.4 GHz only; 5 GHz networks are not supported) afterwards. Features: start the kettle remotely (only when the kettle was filled and placed on the base within the last 10 minutes, for safety), custom temperature presets between 40 and 100 degrees, schedules (for example "every weekday at 6:45"), brew recipes for the Brew Station, descaling reminders, and firmware updates. The app never needs a subscription.

Pairing steps: 1. Plug in the base and place the kettle on it. 2. Hold the temperature button for 5 seconds until the ring light pulses blue. 3. Open the app, tap "Add device" and follow the steps. If pairing fails, move the phone within 2 metres of the kettle, make sure Bluetooth and location permissions are on, and check that the Wi-Fi network is 2.4 GHz. A factory reset is done by holding the temperature and power buttons together for 10 seconds until the ring light flashes red three times.

# Care and descaling

Descale every 4 weeks in hard water areas and every 12 weeks in soft water areas; the app reminds the customer based on the water hardness they entered. Use a solution of one part white vinegar to two parts water, or citric acid (one tablespoon per litre). Fill to the MAX line, boil, leave for one hour, pour away and rinse twice. Never put the kettle or the base in a dishwasher, and never immerse the base in water. The limescale filter can be rinsed under the tap and is dishwasher safe.

# Error codes on the display

E1: the kettle was switched on empty. Let it cool for 10 minutes, fill it and try again.
E2: temperature sensor fault. Unplug for one minute. If E2 comes back, the kettle needs a repair under warranty.
E3: the base is overheating, usually because the cord is wound tightly in the cord store. Unwind the cord and let the base cool.
E4: Wi-Fi lost. The kettle still works from its buttons; the app shows it as offline until the network returns.
E5: firmware update failed. Keep the kettle on the base and plugged in; it retries automatically within an hour.

# Orders, shipping and returns

Standard shipping is free on orders over 40 euros in the European Union and over 50 dollars in the United States, and takes 3 to 5 working days. Express shipping takes 1 to 2 working days and costs 9 euros or 12 dollars. Customers receive a tracking link by email when the parcel leaves the warehouse. Orders can be changed or cancelled free of charge until they are packed, usually within 4 hours of ordering.

Returns: customers may return any product within 30 days of delivery for a full refund, even if it was used, as long as all parts are included. The return label is free in the EU and the US. Refunds go back to the original payment method within 5 working days after the return arrives at the warehouse. Gift cards and the descaling kit cannot be refunded once opened.

# Warranty

Every kettle and Brew Station has a 2 year warranty from the date of delivery, extended to 3 years when the customer registers the product in the app within 60 days. The warranty covers manufacturing defects and electrical faults, including error E2. It does not cover limescale damage from skipped descaling, cracked glass from drops, or damage from using the wrong voltage. Under warranty, Northwind sends a replacement first and collects the faulty unit afterwards; the customer needs the order number or the serial number printed under the base (it starts with NW and has 10 characters).

# Safety

If a customer reports smoke, a burning smell, sparks or a damaged cord, tell them to unplug the kettle at once, stop using it and contact support for a free replacement. Do not give repair instructions for the electrical parts. Children under 8 should not use the kettle.

# Style

Keep answers under 80 words unless the customer asks for detail. Use numbered steps for procedures. Do not use emojis. End with an offer to help further only when the issue is not yet solved.)";

constexpr const char* kQuestions[] = {
    "My kettle shows E3 on the display. What should I do?",
    "How often should I descale it? I live in a hard water area.",
    "Can I return the Brew Station if I already used it?",
    "The app cannot find my kettle during pairing. Any tips?",
    "How long is the warranty, and how do I extend it?",
    "Is the Kettle Mini safe to use in the United States?",
    "What does error E5 mean?",
    "Can I cancel my order? I placed it an hour ago.",
};
constexpr int kNumQuestions = sizeof(kQuestions) / sizeof(kQuestions[0]);

int RunDemoChat() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const int requests = absl::GetFlag(FLAGS_requests);
  if (requests < 1) {
    std::fprintf(stderr, "kvstrata demo-chat: --requests=%d must be >= 1\n", requests);
    return 2;
  }
  int max_tokens = absl::GetFlag(FLAGS_max_tokens);
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag("max_tokens");
  if (flag != nullptr && flag->CurrentValue() == flag->DefaultValue()) {
    max_tokens = kDefaultAnswerTokens;
  }
  if (max_tokens < 1) {
    std::fprintf(stderr, "kvstrata demo-chat: --max-tokens=%d must be >= 1\n", max_tokens);
    return 2;
  }

  std::printf(
      "demo-chat: %d request(s) to %s sharing one %zu-character system prompt, "
      "greedy, up to %d tokens each\n\n",
      requests, target.c_str(), sizeof(kSystemPrompt) - 1, max_tokens);
  int failures = 0;
  uint64_t prompt_all = 0, cached_all = 0, prompt_later = 0, cached_later = 0;
  std::vector<std::string> ttfts, decode_speeds;
  for (int i = 0; i < requests; ++i) {
    const char* question = kQuestions[i % kNumQuestions];
    ClientRequest request;
    request.request_id = absl::StrCat("demo-chat-", i + 1);
    request.messages = {{"system", kSystemPrompt}, {"user", question}};
    request.max_tokens = static_cast<uint32_t>(max_tokens);
    request.temperature = 0.0f;
    request.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
    std::printf("[%d/%d] Q: %s\n      A: ", i + 1, requests, question);
    std::fflush(stdout);
    // Continuation lines are indented under the answer; newlines are held back until more text
    // follows, so trailing blank lines are dropped.
    int held_newlines = 0;
    absl::StatusOr<ClientResult> r =
        Generate(target, request, [&held_newlines](const std::string& text) {
          for (char c : text) {
            if (c == '\n') {
              ++held_newlines;
              continue;
            }
            for (; held_newlines > 0; --held_newlines) std::fputs("\n         ", stdout);
            std::fputc(c, stdout);
          }
          std::fflush(stdout);
        });
    if (!r.ok()) {
      ++failures;
      std::printf("\n      FAILED: %s\n\n", DescribeRpcError(r.status()).c_str());
      ttfts.push_back("failed");
      decode_speeds.push_back("failed");
      continue;
    }
    const uint32_t cached = r->cached_local_tokens + r->cached_kvstore_tokens;
    std::printf(
        "\n      worker=%s finish=%s prompt=%u cached=%u (local %u, kvstore %u) uncached=%u "
        "predicted_cached=%u generated=%u ttft=%.0f ms decode=%.1f tok/s total=%.0f ms\n\n",
        r->worker_id.empty() ? "?" : r->worker_id.c_str(),
        r->finish_reason.empty() ? "?" : r->finish_reason.c_str(), r->prompt_tokens, cached,
        r->cached_local_tokens, r->cached_kvstore_tokens, r->uncached_tokens,
        r->predicted_cached_tokens, r->completion_tokens, r->ttft_ms, r->decode_tokens_per_second(),
        r->total_ms);
    prompt_all += r->prompt_tokens;
    cached_all += cached;
    if (i > 0) {
      prompt_later += r->prompt_tokens;
      cached_later += cached;
    }
    ttfts.push_back(absl::StrFormat("%.0f ms", r->ttft_ms));
    decode_speeds.push_back(r->completion_tokens > 1
                                ? absl::StrFormat("%.1f tok/s", r->decode_tokens_per_second())
                                : std::string("n/a"));
  }

  auto ratio = [](uint64_t cached, uint64_t prompt) {
    return prompt == 0
               ? std::string("n/a")
               : absl::StrFormat("%.1f%% (%u/%u tokens)", 100.0 * cached / prompt, cached, prompt);
  };
  std::printf("cache hit ratio, all requests:         %s\n", ratio(cached_all, prompt_all).c_str());
  if (requests > 1) {
    std::printf("cache hit ratio, after the first:      %s\n",
                ratio(cached_later, prompt_later).c_str());
  }
  std::printf("time to first token:");
  for (size_t i = 0; i < ttfts.size(); ++i) std::printf(" #%zu %s", i + 1, ttfts[i].c_str());
  std::printf("\n");
  // Client side, first to last token: what a user of the stream sees.
  std::printf("decode speed:       ");
  for (size_t i = 0; i < decode_speeds.size(); ++i) {
    std::printf(" #%zu %s", i + 1, decode_speeds[i].c_str());
  }
  std::printf("\n");
  std::fflush(stdout);  // keep the summary above the error when both go to one pipe
  if (failures > 0) {
    std::fprintf(stderr, "kvstrata demo-chat: %d of %d request(s) failed\n", failures, requests);
    return 1;
  }
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(demo_chat, "demo-chat",
                 "chat requests sharing a long system prompt through the router; cache hit ratio",
                 RunDemoChat);

}  // namespace kvstrata::cli
