#include "loadtest/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace kvstrata::loadtest {

double RequestRecord::tpot_ms() const {
  if (ttft_ms < 0 || completion_tokens < 2) return -1;
  return (e2e_ms - ttft_ms) / (completion_tokens - 1);
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

Distribution Distribute(const std::vector<double>& values) {
  Distribution d;
  d.n = static_cast<int64_t>(values.size());
  if (values.empty()) return d;
  double sum = 0;
  for (double v : values) sum += v;
  d.mean = sum / static_cast<double>(values.size());
  d.p50 = Percentile(values, 0.5);
  d.p90 = Percentile(values, 0.9);
  d.p99 = Percentile(values, 0.99);
  d.max = *std::max_element(values.begin(), values.end());
  return d;
}

Summary Summarise(const std::vector<RequestRecord>& records, const Slo& slo, double cpu_seconds,
                  double run_wall_s, unsigned cores) {
  Summary s;
  std::vector<double> ttft, itl, tpot, e2e;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  int64_t output_tokens = 0, total_tokens = 0;
  for (const RequestRecord& r : records) {
    if (r.warmup) continue;
    ++s.requests;
    first = std::min(first, r.sent_s);
    last = std::max(last, r.sent_s + r.e2e_ms / 1e3);
    ++s.by_status[r.status];
    if (!r.ok()) continue;
    ++s.ok;
    if (!r.finish_reason.empty()) ++s.by_finish[r.finish_reason];
    if (!r.worker_id.empty()) ++s.by_worker[r.worker_id];
    if (r.ttft_ms >= 0) ttft.push_back(r.ttft_ms);
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
    if (r.tpot_ms() >= 0) tpot.push_back(r.tpot_ms());
    e2e.push_back(r.e2e_ms);
    output_tokens += r.completion_tokens;
    total_tokens += r.completion_tokens + r.prompt_tokens;
    s.prompt_tokens += r.prompt_tokens;
    s.cached_local += r.cached_local_tokens;
    s.cached_kvstore += r.cached_kvstore_tokens;
    s.predicted_cached += r.predicted_cached_tokens;
    const bool ttft_ok = slo.ttft_ms <= 0 || (r.ttft_ms >= 0 && r.ttft_ms <= slo.ttft_ms);
    const bool tpot_ok = slo.tpot_ms <= 0 || r.tpot_ms() < 0 || r.tpot_ms() <= slo.tpot_ms;
    if (ttft_ok && tpot_ok) ++s.good;
  }
  s.wall_s = s.requests > 0 ? last - first : 0;
  if (s.wall_s > 0) {
    s.requests_per_s = s.ok / s.wall_s;
    s.output_tokens_per_s = output_tokens / s.wall_s;
    s.total_tokens_per_s = total_tokens / s.wall_s;
    s.goodput_per_s = s.good / s.wall_s;
  }
  s.ttft_ms = Distribute(ttft);
  s.itl_ms = Distribute(itl);
  s.tpot_ms = Distribute(tpot);
  s.e2e_ms = Distribute(e2e);
  const int64_t cached = s.cached_local + s.cached_kvstore;
  s.hit_ratio = s.prompt_tokens > 0 ? static_cast<double>(cached) / s.prompt_tokens : 0;
  s.predicted_over_actual = cached > 0 ? static_cast<double>(s.predicted_cached) / cached : 0;
  s.client_cpu_cores = run_wall_s > 0 ? cpu_seconds / run_wall_s : 0;
  // Busy for most of one core (the completion queue and progress thread) or of the machine.
  // (A run of under a second is too short to say.)
  s.client_bound = run_wall_s >= 1 && (s.client_cpu_cores > 0.8 ||
                                       (cores > 0 && s.client_cpu_cores > 0.5 * cores));
  return s;
}

namespace {

std::string DistLine(const char* name, const Distribution& d) {
  if (d.n == 0) return absl::StrFormat("  %-22s —\n", name);
  return absl::StrFormat("  %-22s mean %9.1f  p50 %9.1f  p90 %9.1f  p99 %9.1f  max %9.1f  (n=%d)\n",
                         name, d.mean, d.p50, d.p90, d.p99, d.max, d.n);
}

nlohmann::json DistJson(const Distribution& d) {
  return {{"n", d.n}, {"mean", d.mean}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99},
          {"max", d.max}};
}

}  // namespace

std::string FormatStages(const std::vector<std::string>& labels, const std::vector<Summary>& s) {
  std::string out = absl::StrFormat(
      "stages:\n  %-5s %-20s %8s %6s %8s %10s %10s %10s %10s %10s %6s\n", "stage", "load",
      "requests", "ok", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "e2e p50", "hit");
  for (size_t i = 0; i < s.size() && i < labels.size(); ++i) {
    absl::StrAppend(
        &out,
        absl::StrFormat("  %-5d %-20s %8d %6d %8.2f %10.1f %10.1f %10.1f %10.1f %10.1f %5.1f%%\n",
                        i + 1, labels[i], s[i].requests, s[i].ok, s[i].requests_per_s,
                        s[i].output_tokens_per_s, s[i].ttft_ms.p50, s[i].ttft_ms.p99,
                        s[i].tpot_ms.p50, s[i].e2e_ms.p50, 100 * s[i].hit_ratio));
  }
  return out;
}

std::string FormatSummary(const Summary& s, const Slo& slo) {
  std::string out = absl::StrFormat(
      "requests: %d measured, %d OK over %.1f s: %.2f req/s, %.1f output tok/s, %.1f total tok/s\n",
      s.requests, s.ok, s.wall_s, s.requests_per_s, s.output_tokens_per_s, s.total_tokens_per_s);
  absl::StrAppend(&out, "latency (ms):\n", DistLine("time to first token", s.ttft_ms),
                  DistLine("inter-token", s.itl_ms), DistLine("time per output token", s.tpot_ms),
                  DistLine("end to end", s.e2e_ms));
  if (slo.ttft_ms > 0 || slo.tpot_ms > 0) {
    absl::StrAppend(&out, absl::StrFormat("goodput (TTFT <= %.0f ms, TPOT <= %.0f ms): %d of %d, "
                                          "%.2f req/s\n",
                                          slo.ttft_ms, slo.tpot_ms, s.good, s.requests,
                                          s.goodput_per_s));
  }
  absl::StrAppend(&out, "status:");
  for (const auto& [k, v] : s.by_status) absl::StrAppend(&out, " ", k, "=", v);
  absl::StrAppend(&out, "\nfinish:");
  for (const auto& [k, v] : s.by_finish) absl::StrAppend(&out, " ", k, "=", v);
  absl::StrAppend(&out, "\nworkers:");
  for (const auto& [k, v] : s.by_worker) absl::StrAppend(&out, " ", k, "=", v);
  absl::StrAppend(&out, absl::StrFormat(
                            "\ncache: hit ratio %.1f%% (%d local + %d kvstore of %d prompt tokens); "
                            "router predicted %.2fx the cached tokens\n",
                            100 * s.hit_ratio, s.cached_local, s.cached_kvstore, s.prompt_tokens,
                            s.predicted_over_actual));
  absl::StrAppend(&out, absl::StrFormat("client: %.2f CPU cores busy%s\n", s.client_cpu_cores,
                                        s.client_bound ? " — CLIENT-BOUND: latencies include "
                                                         "the load generator's own delays"
                                                       : ""));
  return out;
}

nlohmann::json SummaryJson(const Summary& s, const Slo& slo) {
  return {{"requests", s.requests},
          {"ok", s.ok},
          {"wall_s", s.wall_s},
          {"requests_per_s", s.requests_per_s},
          {"output_tokens_per_s", s.output_tokens_per_s},
          {"total_tokens_per_s", s.total_tokens_per_s},
          {"ttft_ms", DistJson(s.ttft_ms)},
          {"itl_ms", DistJson(s.itl_ms)},
          {"tpot_ms", DistJson(s.tpot_ms)},
          {"e2e_ms", DistJson(s.e2e_ms)},
          {"slo", {{"ttft_ms", slo.ttft_ms}, {"tpot_ms", slo.tpot_ms}}},
          {"good", s.good},
          {"goodput_per_s", s.goodput_per_s},
          {"by_status", s.by_status},
          {"by_finish_reason", s.by_finish},
          {"by_worker", s.by_worker},
          {"prompt_tokens", s.prompt_tokens},
          {"cached_local_tokens", s.cached_local},
          {"cached_kvstore_tokens", s.cached_kvstore},
          {"predicted_cached_tokens", s.predicted_cached},
          {"hit_ratio", s.hit_ratio},
          {"predicted_over_actual_cached", s.predicted_over_actual},
          {"client_cpu_cores", s.client_cpu_cores},
          {"client_bound", s.client_bound}};
}

nlohmann::json RecordJson(const RequestRecord& r) {
  return {{"index", r.index},
          {"group", r.group},
          {"warmup", r.warmup},
          {"stage", r.stage},
          {"sent_s", r.sent_s},
          {"ttft_ms", r.ttft_ms},
          {"tpot_ms", r.tpot_ms()},
          {"e2e_ms", r.e2e_ms},
          {"status", r.status},
          {"error", r.error},
          {"finish_reason", r.finish_reason},
          {"prompt_tokens", r.prompt_tokens},
          {"completion_tokens", r.completion_tokens},
          {"cached_local_tokens", r.cached_local_tokens},
          {"cached_kvstore_tokens", r.cached_kvstore_tokens},
          {"uncached_tokens", r.uncached_tokens},
          {"predicted_cached_tokens", r.predicted_cached_tokens},
          {"worker_id", r.worker_id}};
}

std::string CsvHeader() {
  return "index,group,warmup,sent_s,ttft_ms,tpot_ms,e2e_ms,status,finish_reason,prompt_tokens,"
         "completion_tokens,cached_local_tokens,cached_kvstore_tokens,uncached_tokens,"
         "predicted_cached_tokens,worker_id,stage,error\n";
}

std::string CsvLine(const RequestRecord& r) {
  // The error message is the only free text: quoted, quotes doubled.
  const std::string error = absl::StrCat("\"", absl::StrReplaceAll(r.error, {{"\"", "\"\""}}), "\"");
  return absl::StrFormat("%d,%s,%d,%.6f,%.3f,%.3f,%.3f,%s,%s,%d,%d,%d,%d,%d,%d,%s,%d,%s\n", r.index,
                         r.group, r.warmup ? 1 : 0, r.sent_s, r.ttft_ms, r.tpot_ms(), r.e2e_ms,
                         r.status, r.finish_reason, r.prompt_tokens, r.completion_tokens,
                         r.cached_local_tokens, r.cached_kvstore_tokens, r.uncached_tokens,
                         r.predicted_cached_tokens, r.worker_id, r.stage, error);
}

}  // namespace kvstrata::loadtest
