#pragma once

// The load generator's gRPC side: many Generate streams at once from one process, on the gRPC
// callback API (no thread per stream), each timed as it streams. The one file that includes
// generated gRPC headers is client.cc.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadtest/report.h"
#include "loadtest/workload.h"

namespace kvstrata::loadtest {

struct TargetInfo {
  std::string role;  // "router" or "worker"
  std::string model;
  uint32_t vocab_size = 0;
  uint32_t max_context_tokens = 0;
  uint32_t available_workers = 0;
};
// GetServerInfo of `target`, waiting up to timeout_ms for the connection.
absl::StatusOr<TargetInfo> GetTargetInfo(const std::string& target, int64_t timeout_ms);

struct RunOptions {
  std::string target;
  int channels = 4;             // HTTP/2 connections the streams are spread over
  // Open loop: send_at[i] (seconds from the start) for request i. Empty: closed loop.
  std::vector<double> send_at;
  int concurrency = 8;          // closed loop: requests kept in flight
  double duration_s = 0;        // stop sending after this long (0: send every request)
  // Stages: in a closed loop each sets the concurrency for its time; in an open loop they only
  // label the requests (send_at follows their rates). Sending stops at the end of the last;
  // each record is labelled with the stage it was sent in.
  std::vector<Stage> stages;
  int64_t warmup_requests = 0;  // the first ones sent are recorded but left out of the summary
  int64_t deadline_ms = 0;      // per request (0: none)
  double progress_interval_s = 2;  // a progress line on stderr this often (0: none)
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT): stop sending, cancel all
};

struct RunResult {
  std::vector<RequestRecord> records;  // in the order sent
  double wall_s = 0;                   // start to the last stream's end
};

// Sends `requests` as the options say and waits for every stream to end.
absl::StatusOr<RunResult> RunLoad(const std::vector<RequestSpec>& requests, const RunOptions& o);

}  // namespace kvstrata::loadtest
