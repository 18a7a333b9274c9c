#pragma once

// A trace-driven simulation of routing at scale: the router's own policies and prefix index
// (services/router, not a re-implementation) choose among N simulated decode workers, each a
// page cache of a given capacity (least recently used pages leave first), a prefill queue served
// one request at a time and decode running beside it; an optional shared kvstore of a given
// capacity (least recently used pages leave first) serves the pages after a worker's own run,
// as the decode worker does. Costs per token come from measured figures (docs/loadtest.md).
//
// Time is simulated (events at arrival, prefill end and decode end), so hours of trace take
// seconds. The router sees every store and eviction at once and each worker's exact load,
// where the real one learns them with a delay: the figures are the policies at their best.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/report.h"
#include "loadtest/workload.h"
#include "services/router/policy.h"

namespace kvstrata::loadtest {

struct SimCost {
  double prefill_tokens_per_s = 3917;   // a worker's prefill, tokens computed per second
  double decode_tokens_per_s = 88;      // one sequence's decode, tokens per second
  double fetch_tokens_per_s = 2e6;      // pages fetched from the kvstore, tokens per second
};

struct SimOptions {
  int workers = 10;
  int64_t worker_cache_tokens = 3'000'000;  // each worker's page cache
  int64_t kvstore_tokens = 0;               // the shared kvstore; 0 = none
  std::string policy = "prefix-affinity";
  router::RoutingPolicyOptions policy_options;
  SimCost cost;
  double speedup = 1.0;  // the trace's timestamps are divided by this
  BlockMapping blocks;   // how trace blocks become tokens (512 tokens each by default)
  int page_tokens = 64;
};

struct SimResult {
  int64_t requests = 0;
  int64_t prompt_tokens = 0, cached_local_tokens = 0, cached_kvstore_tokens = 0;
  int64_t predicted_cached_tokens = 0;
  double hit_ratio() const {
    return prompt_tokens ? double(cached_local_tokens + cached_kvstore_tokens) / prompt_tokens : 0;
  }
  Distribution ttft_ms, queue_ms;
  std::vector<int64_t> requests_per_worker;
  std::vector<double> prefill_busy_s_per_worker;
  double request_imbalance = 0;  // max / mean requests per worker
  double busy_imbalance = 0;     // max / mean prefill busy time per worker
  double simulated_s = 0;        // from the first arrival to the last decode end
};

// Simulates `trace` (in order of its timestamps). InvalidArgument naming the option for bad
// options or an unknown policy.
absl::StatusOr<SimResult> Simulate(const std::vector<TraceRecord>& trace, const SimOptions& o);

}  // namespace kvstrata::loadtest
