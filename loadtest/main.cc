// kvstrata-loadtest: load for a kvstrata router or decode worker — shared-prefix chat,
// multi-turn sessions, agent loops, long-document QA or a Mooncake trace, open loop (Poisson or
// gamma arrivals, rate stages, or the trace's own timestamps) or closed loop (fixed or staged
// concurrency) — with a progress line, a summary (per stage too), and JSON and CSV of every
// request.
// docs/loadtest.md has the workloads, the measures and examples.

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "loadtest/client.h"
#include "loadtest/report.h"
#include "loadtest/workload.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50070",
          "HOST:PORT of a kvstrata router (or of one decode worker)");
ABSL_FLAG(std::string, workload, "shared-prefix", "shared-prefix, sessions, agent, docqa or trace");
// shared-prefix
ABSL_FLAG(int, groups, 8, "shared-prefix: groups, each with its own system prompt");
ABSL_FLAG(int, prompts_per_group, 16, "shared-prefix: requests per group");
ABSL_FLAG(int, system_tokens, 600,
          "shared-prefix, sessions, agent: system prompt length, about, in tokens");
ABSL_FLAG(int, question_tokens, 40,
          "shared-prefix, sessions, docqa: question length (agent: the task's), about, in tokens");
ABSL_FLAG(uint32_t, max_tokens, 32, "every workload but trace: tokens to generate per request");
ABSL_FLAG(std::string, text_file, "",
          "real English text the prompts are cut from: a file, or a folder whose .txt files are "
          "read in name order (default: /usr/share/common-licenses/GPL-3 for shared-prefix and "
          "sessions; for agent and docqa, which need more, the evaluation documents "
          "scripts/fetch-text.sh fetches into ${KVSTRATA_CACHE:-~/.cache/kvstrata}/text)");
// sessions
ABSL_FLAG(int, sessions, 8, "sessions: conversations (--concurrency of them at once)");
ABSL_FLAG(int, turns, 4, "sessions: turns per conversation, each sent when the last returned");
// agent
ABSL_FLAG(int, agents, 4, "agent: agent loops (--concurrency of them at once)");
ABSL_FLAG(int, steps, 6, "agent: requests per loop: the task, then one per tool output");
ABSL_FLAG(int, tool_tokens, 200, "agent: tool output appended at each step, about, in tokens");
// docqa
ABSL_FLAG(int, documents, 8, "docqa: distinct documents");
ABSL_FLAG(int, document_tokens, 2000, "docqa: document length, about, in tokens");
ABSL_FLAG(std::string, hit_miss, "1:1",
          "docqa: HITS:MISSES, the order of requests: MISSES on documents not sent before, then "
          "HITS on documents already sent, repeated until every document was sent");
// trace
ABSL_FLAG(std::string, trace, "", "trace: a Mooncake JSONL file (timestamp, input_length, "
                                  "output_length, hash_ids)");
ABSL_FLAG(int64_t, trace_requests, 0, "trace: replay only the first N requests (0: all)");
ABSL_FLAG(double, trace_scale, 1.0,
          "trace: scale every length by this (0, 1]: blocks become 512 x scale tokens, "
          "input_length and output_length are scaled alike, so a CPU cluster can replay it");
ABSL_FLAG(double, speedup, 1.0, "trace: divide the trace's timestamps by this");
// arrivals
ABSL_FLAG(std::string, arrivals, "closed",
          "closed (--concurrency in flight), poisson or gamma (at --rate), or trace (the "
          "trace's timestamps / --speedup)");
ABSL_FLAG(int, concurrency, 8, "closed loop: requests kept in flight");
ABSL_FLAG(double, rate, 4.0, "poisson/gamma: requests per second");
ABSL_FLAG(double, burstiness, 1.0, "gamma: 1 / shape of the gaps (1 = Poisson, >1 burstier)");
ABSL_FLAG(std::string, stages, "",
          "VALUE:SECONDS,...: run in stages, each VALUE for SECONDS: a rate (poisson, gamma) or "
          "a concurrency (closed); a summary per stage; sending stops after the last");
ABSL_FLAG(double, duration_s, 0, "stop sending after this many seconds (0: send every request)");
ABSL_FLAG(int64_t, warmup, 0, "the first N requests are sent but left out of the summary");
ABSL_FLAG(int64_t, deadline_ms, 0, "deadline of each request (0: none)");
ABSL_FLAG(int, channels, 4, "gRPC connections the streams are spread over");
ABSL_FLAG(uint64_t, seed, 1, "seed of the workload and the arrivals");
// measures and output
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput: a request counts when its TTFT is at most this");
ABSL_FLAG(double, slo_tpot_ms, 0, "goodput: ... and its time per output token at most this");
ABSL_FLAG(std::string, json, "", "write the summary and every request as JSON here");
ABSL_FLAG(std::string, csv, "", "write every request as CSV here");
ABSL_FLAG(double, progress_interval_s, 2.0, "a progress line on stderr this often (0: none)");

namespace kvstrata::loadtest {
namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop.store(true); }

int Usage(const std::string& message) {
  std::fprintf(stderr, "kvstrata-loadtest: %s (see --help)\n", message.c_str());
  return 2;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvstrata-loadtest: %s\n", std::string(s.message()).c_str());
  return 1;
}

// The text of a file, or of a folder's .txt files in name order (a blank line between).
std::string ReadText(const std::string& path) {
  std::vector<std::string> files;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0) {
        files.push_back(absl::StrCat(path, "/", name));
      }
    }
    closedir(d);
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const std::string& f : files) {
    std::ifstream in(f);
    if (!text.empty()) text += "\n\n";
    text.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return text;
}

std::string DefaultTextFile(const std::string& workload) {
  if (workload == "shared-prefix" || workload == "sessions") {
    return "/usr/share/common-licenses/GPL-3";
  }
  const char* cache = std::getenv("KVSTRATA_CACHE");
  const char* home = std::getenv("HOME");
  return absl::StrCat(cache ? cache : absl::StrCat(home ? home : "", "/.cache/kvstrata"),
                      "/text/evaluation");
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int Main() {
  const std::string target = absl::GetFlag(FLAGS_target);
  const std::string workload = absl::GetFlag(FLAGS_workload);
  const std::string arrivals = absl::GetFlag(FLAGS_arrivals);
  if (workload != "shared-prefix" && workload != "sessions" && workload != "agent" &&
      workload != "docqa" && workload != "trace") {
    return Usage(absl::StrCat("--workload=", workload,
                              ": expected shared-prefix, sessions, agent, docqa or trace"));
  }
  if ((workload == "sessions" || workload == "agent") && arrivals != "closed") {
    return Usage(absl::StrCat("--workload=", workload,
                              " runs in a closed loop (each turn waits for the last): "
                              "--arrivals=closed"));
  }
  if (arrivals != "closed" && arrivals != "poisson" && arrivals != "gamma" && arrivals != "trace") {
    return Usage(absl::StrCat("--arrivals=", arrivals, ": expected closed, poisson, gamma or trace"));
  }
  if (arrivals == "trace" && workload != "trace") {
    return Usage("--arrivals=trace needs --workload=trace");
  }
  if ((arrivals == "poisson" || arrivals == "gamma") && !(absl::GetFlag(FLAGS_rate) > 0)) {
    return Usage("--rate must be > 0");
  }
  if (!(absl::GetFlag(FLAGS_burstiness) > 0)) return Usage("--burstiness must be > 0");
  if (!(absl::GetFlag(FLAGS_speedup) > 0)) return Usage("--speedup must be > 0");
  const double scale = absl::GetFlag(FLAGS_trace_scale);
  if (!(scale > 0 && scale <= 1)) return Usage("--trace_scale must be in (0, 1]");
  std::vector<Stage> stages;
  if (const std::string spec = absl::GetFlag(FLAGS_stages); !spec.empty()) {
    absl::StatusOr<std::vector<Stage>> st = ParseStages(spec);
    if (!st.ok()) return Usage(std::string(st.status().message()));
    stages = *std::move(st);
    if (arrivals == "trace") return Usage("--stages: with --arrivals=closed, poisson or gamma");
    if (absl::GetFlag(FLAGS_duration_s) > 0) {
      return Usage("--stages and --duration_s: the stages give the duration");
    }
  }
  std::pair<int, int> hit_miss;
  if (workload == "docqa") {
    absl::StatusOr<std::pair<int, int>> hm = ParseHitMiss(absl::GetFlag(FLAGS_hit_miss));
    if (!hm.ok()) return Usage(std::string(hm.status().message()));
    hit_miss = *hm;
  }

  absl::StatusOr<TargetInfo> info = GetTargetInfo(target, 10000);
  if (!info.ok()) return Fail(info.status());
  std::fprintf(stderr, "kvstrata-loadtest: %s %s, model %s, vocabulary %u, context %u tokens%s\n",
               info->role.c_str(), target.c_str(), info->model.c_str(), info->vocab_size,
               info->max_context_tokens,
               info->role == "router" ? absl::StrCat(", ", info->available_workers, " workers").c_str()
                                      : "");

  std::vector<RequestSpec> requests;
  std::vector<double> send_at;
  std::string text;
  if (workload != "trace") {
    std::string path = absl::GetFlag(FLAGS_text_file);
    if (path.empty()) path = DefaultTextFile(workload);
    text = ReadText(path);
    if (text.empty()) {
      return Usage(absl::StrCat(
          "--text_file ", path, ": missing or empty",
          absl::GetFlag(FLAGS_text_file).empty() ? " (scripts/fetch-text.sh fetches it)" : ""));
    }
  }
  if (workload == "agent") {
    AgentOptions o;
    o.agents = absl::GetFlag(FLAGS_agents);
    o.steps = absl::GetFlag(FLAGS_steps);
    o.system_tokens = absl::GetFlag(FLAGS_system_tokens);
    o.task_tokens = absl::GetFlag(FLAGS_question_tokens);
    o.tool_tokens = absl::GetFlag(FLAGS_tool_tokens);
    o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    o.seed = absl::GetFlag(FLAGS_seed);
    absl::StatusOr<std::vector<RequestSpec>> r = AgentRequests(o, text);
    if (!r.ok()) return Usage(std::string(r.status().message()));
    requests = *std::move(r);
  } else if (workload == "docqa") {
    DocQaOptions o;
    o.documents = absl::GetFlag(FLAGS_documents);
    o.document_tokens = absl::GetFlag(FLAGS_document_tokens);
    o.question_tokens = absl::GetFlag(FLAGS_question_tokens);
    o.hits = hit_miss.first;
    o.misses = hit_miss.second;
    o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    o.seed = absl::GetFlag(FLAGS_seed);
    absl::StatusOr<std::vector<RequestSpec>> r = DocQaRequests(o, text);
    if (!r.ok()) return Usage(std::string(r.status().message()));
    requests = *std::move(r);
  } else if (workload == "sessions") {
    SessionOptions o;
    o.sessions = absl::GetFlag(FLAGS_sessions);
    o.turns = absl::GetFlag(FLAGS_turns);
    o.system_tokens = absl::GetFlag(FLAGS_system_tokens);
    o.question_tokens = absl::GetFlag(FLAGS_question_tokens);
    o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    o.seed = absl::GetFlag(FLAGS_seed);
    absl::StatusOr<std::vector<RequestSpec>> r = SessionRequests(o, text);
    if (!r.ok()) return Usage(std::string(r.status().message()));
    requests = *std::move(r);
  } else if (workload == "shared-prefix") {
    SharedPrefixOptions o;
    o.groups = absl::GetFlag(FLAGS_groups);
    o.prompts_per_group = absl::GetFlag(FLAGS_prompts_per_group);
    o.system_tokens = absl::GetFlag(FLAGS_system_tokens);
    o.question_tokens = absl::GetFlag(FLAGS_question_tokens);
    o.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    o.seed = absl::GetFlag(FLAGS_seed);
    absl::StatusOr<std::vector<RequestSpec>> r = SharedPrefixRequests(o, text);
    if (!r.ok()) return Usage(std::string(r.status().message()));
    requests = *std::move(r);
  } else {
    if (absl::GetFlag(FLAGS_trace).empty()) return Usage("--workload=trace needs --trace FILE");
    absl::StatusOr<std::vector<TraceRecord>> trace =
        ReadTrace(absl::GetFlag(FLAGS_trace), absl::GetFlag(FLAGS_trace_requests));
    if (!trace.ok()) return Fail(trace.status());
    if (info->vocab_size == 0) {
      return Fail(absl::FailedPreconditionError("the target reports no vocabulary"));
    }
    const BlockMapping m = MappingFor(info->vocab_size, scale);
    int64_t too_long = 0;
    for (const TraceRecord& t : *trace) {
      absl::StatusOr<std::vector<uint32_t>> prompt = TracePrompt(t, m);
      if (!prompt.ok()) return Fail(prompt.status());
      RequestSpec r;
      r.token_ids = *std::move(prompt);
      r.max_tokens = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(t.output_length * scale)));
      r.ignore_eos = true;
      r.group = "trace";
      r.trace_time_s = t.timestamp_ms / 1e3;
      if (info->max_context_tokens > 0 &&
          r.token_ids.size() + r.max_tokens > info->max_context_tokens) {
        ++too_long;  // sent anyway: the server answers OUT_OF_RANGE, which the report counts
      }
      requests.push_back(std::move(r));
    }
    if (too_long > 0) {
      std::fprintf(stderr,
                   "kvstrata-loadtest: %lld requests exceed the %u-token context at this scale "
                   "(lower --trace_scale); they will come back OUT_OF_RANGE\n",
                   static_cast<long long>(too_long), info->max_context_tokens);
    }
    if (arrivals == "trace") {
      const double t0 = requests.front().trace_time_s;
      for (const RequestSpec& r : requests) {
        send_at.push_back((r.trace_time_s - t0) / absl::GetFlag(FLAGS_speedup));
      }
    }
  }
  if (arrivals == "poisson" || arrivals == "gamma") {
    const double burstiness = arrivals == "poisson" ? 1.0 : absl::GetFlag(FLAGS_burstiness);
    if (stages.empty()) {
      send_at = GammaArrivals(static_cast<int64_t>(requests.size()), absl::GetFlag(FLAGS_rate),
                              burstiness, absl::GetFlag(FLAGS_seed));
    } else {
      send_at = StagedArrivals(static_cast<int64_t>(requests.size()), stages, burstiness,
                               absl::GetFlag(FLAGS_seed));
      double expected = 0;
      for (const Stage& st : stages) expected += st.value * st.duration_s;
      if (send_at.size() < requests.size()) {
        requests.resize(send_at.size());  // the stages send fewer than the workload holds
      } else if (expected > 1.05 * static_cast<double>(requests.size())) {
        std::fprintf(stderr,
                     "kvstrata-loadtest: the stages would send about %.0f requests and the "
                     "workload holds %zu: the last stages will run out (make the workload "
                     "larger)\n",
                     expected, requests.size());
      }
    }
  }

  RunOptions o;
  o.target = target;
  o.channels = absl::GetFlag(FLAGS_channels);
  o.send_at = std::move(send_at);
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.duration_s = absl::GetFlag(FLAGS_duration_s);
  o.stages = stages;
  o.warmup_requests = absl::GetFlag(FLAGS_warmup);
  o.deadline_ms = absl::GetFlag(FLAGS_deadline_ms);
  o.progress_interval_s = absl::GetFlag(FLAGS_progress_interval_s);
  o.stop = &g_stop;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::fprintf(stderr, "kvstrata-loadtest: %zu %s requests, %s arrivals%s\n", requests.size(),
               workload.c_str(), arrivals.c_str(),
               arrivals == "closed" ? absl::StrCat(", ", o.concurrency, " in flight").c_str() : "");
  const double cpu0 = CpuSeconds();
  absl::StatusOr<RunResult> run = RunLoad(requests, o);
  if (!run.ok()) return Fail(run.status());
  const double cpu = CpuSeconds() - cpu0;

  Slo slo{absl::GetFlag(FLAGS_slo_ttft_ms), absl::GetFlag(FLAGS_slo_tpot_ms)};
  const Summary s = Summarise(run->records, slo, cpu, run->wall_s, std::thread::hardware_concurrency());
  std::printf("%s", FormatSummary(s, slo).c_str());
  std::vector<Summary> per_stage;
  std::vector<std::string> stage_labels;
  for (size_t i = 0; i < stages.size(); ++i) {
    std::vector<RequestRecord> in_stage;
    for (const RequestRecord& r : run->records) {
      if (r.stage == static_cast<int>(i)) in_stage.push_back(r);
    }
    // The stage's own CPU time is not known; the run's share stands for it.
    per_stage.push_back(Summarise(in_stage, slo, 0, 0, std::thread::hardware_concurrency()));
    stage_labels.push_back(
        arrivals == "closed"
            ? absl::StrCat(stages[i].value, " in flight x ", stages[i].duration_s, " s")
            : absl::StrCat(stages[i].value, " req/s x ", stages[i].duration_s, " s"));
  }
  if (!stages.empty()) std::printf("%s", FormatStages(stage_labels, per_stage).c_str());
  if (g_stop.load()) std::printf("(stopped early: %zu of %zu requests sent)\n", run->records.size(), requests.size());

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json j;
    j["target"] = target;
    j["role"] = info->role;
    j["model"] = info->model;
    j["workload"] = workload;
    j["arrivals"] = arrivals;
    j["summary"] = SummaryJson(s, slo);
    if (!stages.empty()) {
      j["stages"] = nlohmann::json::array();
      for (size_t i = 0; i < stages.size(); ++i) {
        nlohmann::json st = SummaryJson(per_stage[i], slo);
        st["stage"] = i;
        st["label"] = stage_labels[i];
        st["value"] = stages[i].value;
        st["duration_s"] = stages[i].duration_s;
        j["stages"].push_back(std::move(st));
      }
    }
    j["requests"] = nlohmann::json::array();
    for (const RequestRecord& r : run->records) j["requests"].push_back(RecordJson(r));
    std::ofstream f(path);
    f << j.dump(1) << "\n";
    if (!f) return Fail(absl::UnavailableError(absl::StrCat("cannot write --json ", path)));
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    std::ofstream f(path);
    f << CsvHeader();
    for (const RequestRecord& r : run->records) f << CsvLine(r);
    if (!f) return Fail(absl::UnavailableError(absl::StrCat("cannot write --csv ", path)));
  }
  return s.ok == s.requests ? 0 : 3;
}

}  // namespace
}  // namespace kvstrata::loadtest

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "load for a kvstrata router or worker: shared-prefix chat, sessions, agent loops, "
      "long-document QA or a Mooncake trace, open or closed loop, in stages or not; prints a "
      "summary (TTFT, inter-token, end-to-end latency, throughput, "
      "goodput, errors, cache hit ratio) and writes every request as JSON/CSV. Exit status 3 "
      "when some requests failed. docs/loadtest.md");
  absl::ParseCommandLine(argc, argv);
  return kvstrata::loadtest::Main();
}
