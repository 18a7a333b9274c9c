#pragma once

// What kvstrata-loadtest measured: one record per request, and the run's summary over the
// records outside the warm-up (latency percentiles, throughput, goodput under SLOs, errors by
// status, cached tokens and hit ratio, predicted vs actual cached tokens, per-worker counts).

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json_fwd.hpp"

namespace kvstrata::loadtest {

struct RequestRecord {
  int64_t index = 0;
  std::string group;
  bool warmup = false;
  int stage = -1;         // the stage it was sent in (--stages), -1 without stages
  double sent_s = 0;      // from the start of the run
  double ttft_ms = -1;    // to the first message carrying tokens; -1 if none came
  double e2e_ms = 0;      // to the end of the stream
  std::vector<double> itl_ms;  // gaps between tokens (a message of k tokens: its gap / k, k times)
  std::string status = "OK";   // gRPC status code name
  std::string error;           // its message
  std::string finish_reason;   // of the last message: "length", "stop_token", ... ("" if none)
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t cached_local_tokens = 0;
  uint32_t cached_kvstore_tokens = 0;
  uint32_t uncached_tokens = 0;
  uint32_t predicted_cached_tokens = 0;
  std::string worker_id;
  std::string text;  // the answer, as streamed (kept for multi-turn sessions; not in the CSV)

  // Time per output token after the first: (e2e - ttft) / (completion - 1); -1 when undefined.
  double tpot_ms() const;
  bool ok() const { return status == "OK"; }
};

// Linear interpolation between closest ranks (numpy's default); q in [0, 1]. NaN for no values.
double Percentile(std::vector<double> values, double q);

struct Slo {
  double ttft_ms = 0;  // 0: no bound
  double tpot_ms = 0;
};

struct Distribution {
  int64_t n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution Distribute(const std::vector<double>& values);

struct Summary {
  int64_t requests = 0, ok = 0;  // measured (after the warm-up)
  double wall_s = 0;             // first measured send to last measured end
  double requests_per_s = 0, output_tokens_per_s = 0, total_tokens_per_s = 0;
  Distribution ttft_ms, itl_ms, tpot_ms, e2e_ms;
  int64_t good = 0;  // OK and within every SLO
  double goodput_per_s = 0;
  std::map<std::string, int64_t> by_status, by_finish, by_worker;
  int64_t prompt_tokens = 0, cached_local = 0, cached_kvstore = 0, predicted_cached = 0;
  double hit_ratio = 0;             // cached / prompt tokens over OK requests
  double predicted_over_actual = 0;  // Σ predicted / Σ cached (1 = the router predicts exactly)
  double client_cpu_cores = 0;       // this process's CPU time / wall time
  bool client_bound = false;         // the client was busy enough to distort latencies
};

Summary Summarise(const std::vector<RequestRecord>& records, const Slo& slo, double cpu_seconds,
                  double run_wall_s, unsigned cores);

// The summaries of a run's stages (labels such as "2 req/s x 30 s"), one line each.
std::string FormatStages(const std::vector<std::string>& labels, const std::vector<Summary>& s);

// The summary as a table for a terminal.
std::string FormatSummary(const Summary& s, const Slo& slo);
nlohmann::json SummaryJson(const Summary& s, const Slo& slo);
nlohmann::json RecordJson(const RequestRecord& r);
// One CSV header line and one line per record.
std::string CsvHeader();
std::string CsvLine(const RequestRecord& r);

}  // namespace kvstrata::loadtest
