// kvstrata-sim: the routing policies of kvstrata-router on a request trace, at any number of
// simulated workers (loadtest/sim/cluster_sim.h; docs/loadtest.md has the model and results).

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "loadtest/sim/cluster_sim.h"

ABSL_FLAG(std::string, trace, "", "a Mooncake JSONL trace (required)");
ABSL_FLAG(int64_t, trace_requests, 0, "simulate only the first N requests (0: all)");
ABSL_FLAG(std::string, workers, "10", "comma-separated worker counts");
ABSL_FLAG(int64_t, worker_cache_tokens, 3000000, "each worker's page cache, in tokens");
ABSL_FLAG(int64_t, kvstore_tokens, -1,
          "the shared kvstore of the '+kvstore' policies, in tokens (-1: workers x "
          "worker_cache_tokens)");
ABSL_FLAG(std::string, policies,
          "round-robin,least-load,cache-aware,prefix-affinity,prefix-affinity+kvstore",
          "policies to compare; NAME+kvstore adds the shared kvstore");
ABSL_FLAG(double, speedup, 1.0,
          "the trace's timestamps are divided by this x (workers / reference_workers), so each "
          "worker sees the same load at every worker count");
ABSL_FLAG(int, reference_workers, 10, "the worker count at which the trace runs at --speedup");
ABSL_FLAG(double, prefill_tok_s, 3917, "prefill tokens per second of one worker (default: the "
                                       "CUDA engine at 8B shape, INT2, 8K prompt, one H200)");
ABSL_FLAG(double, decode_tok_s, 88, "decode tokens per second of one sequence (same source)");
ABSL_FLAG(double, fetch_tok_s, 2e6, "tokens per second of pages fetched from the kvstore");
ABSL_FLAG(std::string, json, "", "write every result as JSON here");

namespace kvstrata::loadtest {
namespace {

int Usage(const std::string& m) {
  std::fprintf(stderr, "kvstrata-sim: %s (see --help)\n", m.c_str());
  return 2;
}

int Main() {
  if (absl::GetFlag(FLAGS_trace).empty()) return Usage("--trace is required");
  absl::StatusOr<std::vector<TraceRecord>> trace =
      ReadTrace(absl::GetFlag(FLAGS_trace), absl::GetFlag(FLAGS_trace_requests));
  if (!trace.ok()) return Usage(std::string(trace.status().message()));
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) return Usage(absl::StrCat("--workers: bad '", part, "'"));
    counts.push_back(n);
  }
  nlohmann::json out;
  out["trace"] = absl::GetFlag(FLAGS_trace);
  out["requests"] = trace->size();
  out["cost"] = {{"prefill_tok_s", absl::GetFlag(FLAGS_prefill_tok_s)},
                 {"decode_tok_s", absl::GetFlag(FLAGS_decode_tok_s)},
                 {"fetch_tok_s", absl::GetFlag(FLAGS_fetch_tok_s)}};
  std::printf("%7s  %-24s %8s %8s %8s %10s %10s %10s %9s %9s\n", "workers", "policy", "hit %",
              "local %", "store %", "TTFT mean", "TTFT p99", "queue p99", "req max/", "busy max/");
  std::printf("%7s  %-24s %8s %8s %8s %10s %10s %10s %9s %9s\n", "", "", "", "", "", "ms", "ms",
              "ms", "mean", "mean");
  for (int n : counts) {
    for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',')) {
      SimOptions o;
      o.workers = n;
      o.worker_cache_tokens = absl::GetFlag(FLAGS_worker_cache_tokens);
      std::string policy(name);
      if (absl::ConsumeSuffix(&name, "+kvstore")) {
        o.kvstore_tokens = absl::GetFlag(FLAGS_kvstore_tokens) >= 0
                               ? absl::GetFlag(FLAGS_kvstore_tokens)
                               : int64_t{n} * o.worker_cache_tokens;
      }
      o.policy = std::string(name);
      o.cost.prefill_tokens_per_s = absl::GetFlag(FLAGS_prefill_tok_s);
      o.cost.decode_tokens_per_s = absl::GetFlag(FLAGS_decode_tok_s);
      o.cost.fetch_tokens_per_s = absl::GetFlag(FLAGS_fetch_tok_s);
      o.speedup = absl::GetFlag(FLAGS_speedup) * n / absl::GetFlag(FLAGS_reference_workers);
      absl::StatusOr<SimResult> r = Simulate(*trace, o);
      if (!r.ok()) return Usage(absl::StrCat(policy, ": ", r.status().message()));
      const double local = r->prompt_tokens ? 100.0 * r->cached_local_tokens / r->prompt_tokens : 0;
      const double stored = r->prompt_tokens ? 100.0 * r->cached_kvstore_tokens / r->prompt_tokens : 0;
      std::printf("%7d  %-24s %8.1f %8.1f %8.1f %10.0f %10.0f %10.0f %9.2f %9.2f\n", n,
                  policy.c_str(), 100 * r->hit_ratio(), local, stored, r->ttft_ms.mean,
                  r->ttft_ms.p99, r->queue_ms.p99, r->request_imbalance, r->busy_imbalance);
      std::fflush(stdout);
      out["results"].push_back({{"workers", n},
                                {"policy", policy},
                                {"kvstore_tokens", o.kvstore_tokens},
                                {"worker_cache_tokens", o.worker_cache_tokens},
                                {"speedup", o.speedup},
                                {"hit_ratio", r->hit_ratio()},
                                {"cached_local_tokens", r->cached_local_tokens},
                                {"cached_kvstore_tokens", r->cached_kvstore_tokens},
                                {"prompt_tokens", r->prompt_tokens},
                                {"predicted_cached_tokens", r->predicted_cached_tokens},
                                {"ttft_ms", {{"mean", r->ttft_ms.mean}, {"p50", r->ttft_ms.p50},
                                             {"p90", r->ttft_ms.p90}, {"p99", r->ttft_ms.p99}}},
                                {"queue_ms", {{"mean", r->queue_ms.mean}, {"p50", r->queue_ms.p50},
                                              {"p99", r->queue_ms.p99}}},
                                {"request_imbalance", r->request_imbalance},
                                {"busy_imbalance", r->busy_imbalance},
                                {"simulated_s", r->simulated_s}});
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream f(path);
    f << out.dump(1) << "\n";
    if (!f) return Usage(absl::StrCat("cannot write --json ", path));
  }
  return 0;
}

}  // namespace
}  // namespace kvstrata::loadtest

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the router's routing policies on a request trace at any number of simulated workers: "
      "hit ratio, TTFT, queueing and load imbalance per policy (docs/loadtest.md)");
  absl::ParseCommandLine(argc, argv);
  return kvstrata::loadtest::Main();
}
