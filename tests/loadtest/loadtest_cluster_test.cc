// kvstrata-loadtest against the real thing: a router and two decode workers on the default model
// as processes, a short shared-prefix run in a closed loop and a scaled trace replay in an open
// loop, checked through the tool's JSON against what the workloads imply.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "tests/testing/loopback.h"
#include "tests/testing/process.h"

namespace kvstrata {
namespace {

using test_util::Child;

struct ToolRun {
  int exit_code = -1;
  nlohmann::json report;
  std::string output;
};

ToolRun LoadTest(const std::vector<std::string>& args) {
  const std::string dir = ::testing::TempDir();
  const std::string json = absl::StrCat(dir, "loadtest_", getpid(), ".json");
  const std::string out = absl::StrCat(dir, "loadtest_", getpid(), ".out");
  std::string cmd = KVSTRATA_LOADTEST_BINARY;
  for (const std::string& a : args) absl::StrAppend(&cmd, " '", a, "'");
  absl::StrAppend(&cmd, " --json=", json, " --progress_interval_s=1 >", out, " 2>&1");
  ToolRun r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream o(out);
  r.output.assign(std::istreambuf_iterator<char>(o), std::istreambuf_iterator<char>());
  std::ifstream j(json);
  if (j) r.report = nlohmann::json::parse(j, nullptr, false);
  std::remove(json.c_str());
  return r;
}

// One cluster for every test of the suite: starting three processes on the model is most of
// the time, and under the sanitizers far more.
class LoadTestCluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* model = std::getenv("KVSTRATA_MODEL");
    if (model == nullptr || !std::ifstream(model)) return;  // each test skips
    target_ = new std::string(absl::StrCat("127.0.0.1:", test_util::FreePort()));
    children_ = new std::vector<std::unique_ptr<Child>>;
    children_->push_back(std::make_unique<Child>(
        "router", KVSTRATA_ROUTER_BINARY,
        std::vector<std::string>{"--insecure", absl::StrCat("--listen=", *target_),
                                 absl::StrCat("--metrics_listen=127.0.0.1:", test_util::FreePort()),
                                 absl::StrCat("--model=", model), "--heartbeat_interval_ms=200",
                                 // Under the sanitizers on two cores a busy worker's heartbeat
                                 // can miss 600 ms; the tests here are not about losing one.
                                 "--max_missed_heartbeats=10", "--shutdown_grace_ms=500"}));
    for (int i = 0; i < 2; ++i) {
      const std::string address = absl::StrCat("127.0.0.1:", test_util::FreePort());
      children_->push_back(std::make_unique<Child>(
          absl::StrCat("decode-", i), KVSTRATA_DECODE_BINARY,
          std::vector<std::string>{
              "--insecure", absl::StrCat("--listen=", address),
              absl::StrCat("--metrics_listen=127.0.0.1:", test_util::FreePort()),
              absl::StrCat("--model=", model), absl::StrCat("--worker_id=decode-", i),
              absl::StrCat("--router=", *target_), "--kv_cache_mb=192", "--local_cache_mb=128",
              "--shutdown_grace_ms=500"}));
      if (!test_util::WaitServing(address, "kvstrata.v1.Generation", *children_->back(),
                                  absl::Seconds(300))) {
        error_ = new std::string(absl::StrCat("decode-", i, " did not start"));
        return;
      }
    }
    auto stub = v1::Generation::NewStub(test_util::Channel(*target_));
    for (const absl::Time give_up = absl::Now() + absl::Seconds(60); absl::Now() < give_up;) {
      grpc::ClientContext context;
      v1::ServerInfo info;
      if (stub->GetServerInfo(&context, {}, &info).ok() && info.available_workers() == 2) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    error_ = new std::string("the workers did not register");
  }

  static void TearDownTestSuite() {
    if (children_ == nullptr) return;
    for (auto it = children_->rbegin(); it != children_->rend(); ++it) (*it)->Stop(SIGTERM);
    if (failed_ || error_) {
      for (const auto& c : *children_) {
        fprintf(stderr, "---- %s ----\n%s\n", c->name().c_str(), c->LogTail().c_str());
      }
    }
    delete children_;
    children_ = nullptr;
  }

  void SetUp() override {
    if (children_ == nullptr) GTEST_SKIP() << "no default model";
    ASSERT_EQ(error_, nullptr) << *error_;
    target_copy_ = *target_;
  }
  void TearDown() override { failed_ = failed_ || HasFailure(); }

  static std::string* target_;
  static std::vector<std::unique_ptr<Child>>* children_;
  static std::string* error_;
  static bool failed_;
  std::string target_copy_;
};
std::string* LoadTestCluster::target_ = nullptr;
std::vector<std::unique_ptr<Child>>* LoadTestCluster::children_ = nullptr;
std::string* LoadTestCluster::error_ = nullptr;
bool LoadTestCluster::failed_ = false;

TEST_F(LoadTestCluster, SharedPrefixGroupsHitTheirCachedSystemPrompt) {
  const ToolRun r = LoadTest({absl::StrCat("--target=", target_copy_), "--workload=shared-prefix",
                          "--groups=2", "--prompts_per_group=6", "--system_tokens=300",
                          "--question_tokens=20", "--max_tokens=6", "--arrivals=closed",
                          "--concurrency=3", "--slo_ttft_ms=60000"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.report.is_object()) << r.output;
  const nlohmann::json& s = r.report["summary"];
  EXPECT_EQ(s["requests"], 12);
  EXPECT_EQ(s["ok"], 12);
  EXPECT_EQ(s["good"], 12);
  EXPECT_EQ(r.report["requests"].size(), 12u);
  // Independent count from the records: at most the first request of each group computes its
  // system prompt (two more may start before it lands); the others reuse whole pages of it.
  int hits = 0;
  int64_t prompt = 0, cached = 0;
  for (const auto& q : r.report["requests"]) {
    EXPECT_EQ(q["status"], "OK");
    EXPECT_GT(q["ttft_ms"].get<double>(), 0);
    EXPECT_EQ(q["completion_tokens"], 6);
    prompt += q["prompt_tokens"].get<int64_t>();
    cached += q["cached_local_tokens"].get<int64_t>() + q["cached_kvstore_tokens"].get<int64_t>();
    if (q["cached_local_tokens"].get<int>() >= 256) ++hits;
  }
  EXPECT_GE(hits, 6);
  EXPECT_NEAR(s["hit_ratio"].get<double>(), static_cast<double>(cached) / prompt, 1e-9);
  EXPECT_GT(s["hit_ratio"].get<double>(), 0.3);
  EXPECT_EQ(s["ttft_ms"]["n"], 12);
  EXPECT_GT(s["itl_ms"]["n"].get<int>(), 0);
  EXPECT_NE(r.output.find("time to first token"), std::string::npos);
  EXPECT_NE(r.output.find("sent "), std::string::npos) << "no progress line";
}

TEST_F(LoadTestCluster, AScaledTraceReplaysWithItsLengths) {
  const ToolRun r = LoadTest({absl::StrCat("--target=", target_copy_), "--workload=trace",
                          "--trace=tests/loadtest/data/mooncake_conversation_head.jsonl",
                          "--trace_requests=8", "--trace_scale=0.03125", "--arrivals=poisson",
                          "--rate=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.report.is_object()) << r.output;
  ASSERT_EQ(r.report["requests"].size(), 8u);
  // Lengths from the trace file itself, scaled by 1/32 as the flag says.
  std::ifstream in("tests/loadtest/data/mooncake_conversation_head.jsonl");
  std::string line;
  for (int i = 0; i < 8 && std::getline(in, line); ++i) {
    const nlohmann::json t = nlohmann::json::parse(line);
    const auto& q = r.report["requests"][i];
    EXPECT_EQ(q["status"], "OK") << q.dump();
    EXPECT_EQ(q["prompt_tokens"], std::lround(t["input_length"].get<double>() / 32)) << i;
    EXPECT_EQ(q["completion_tokens"],
              std::max<long>(1, std::lround(t["output_length"].get<double>() / 32)))
        << i;
    EXPECT_EQ(q["finish_reason"], "length");
  }
}

TEST_F(LoadTestCluster, SessionTurnsCarryTheConversationAndReuseItsPages) {
  const ToolRun r = LoadTest({absl::StrCat("--target=", target_copy_), "--workload=sessions",
                              "--sessions=2", "--turns=3", "--concurrency=2", "--max_tokens=8",
                              "--system_tokens=200", "--question_tokens=20"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.report.is_object()) << r.output;
  const auto& q = r.report["requests"];
  ASSERT_EQ(q.size(), 6u);
  for (int s = 0; s < 2; ++s) {
    for (int t = 1; t < 3; ++t) {
      const auto& prev = q[s * 3 + t - 1];
      const auto& cur = q[s * 3 + t];
      EXPECT_EQ(cur["group"], prev["group"]);
      // This turn's prompt holds the last one's prompt and its answer, then a new question.
      EXPECT_GT(cur["prompt_tokens"].get<int>(),
                prev["prompt_tokens"].get<int>() + prev["completion_tokens"].get<int>())
          << cur.dump();
      // And the pages of the last turn's prompt come from the cache.
      EXPECT_GE(cur["cached_local_tokens"].get<int>() + cur["cached_kvstore_tokens"].get<int>(),
                64 * ((prev["prompt_tokens"].get<int>() - 1) / 64) - 64)
          << cur.dump();
    }
  }
  EXPECT_FALSE(LoadTest({absl::StrCat("--target=", target_copy_), "--workload=sessions",
                         "--arrivals=poisson"})
                   .exit_code == 0);
}

TEST_F(LoadTestCluster, AgentStepsGrowTheContextAndReuseIt) {
  const ToolRun r = LoadTest({absl::StrCat("--target=", target_copy_), "--workload=agent",
                              "--agents=2", "--steps=3", "--concurrency=1", "--max_tokens=6",
                              "--system_tokens=150", "--question_tokens=20", "--tool_tokens=80",
                              "--text_file=/usr/share/common-licenses/GPL-3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.report.is_object()) << r.output;
  const auto& q = r.report["requests"];
  ASSERT_EQ(q.size(), 6u);
  for (int a = 0; a < 2; ++a) {
    for (int k = 1; k < 3; ++k) {
      const auto& prev = q[a * 3 + k - 1];
      const auto& cur = q[a * 3 + k];
      EXPECT_EQ(cur["group"], absl::StrCat("a", a));
      // The last step's prompt and answer, then a tool output of about 80 tokens.
      EXPECT_GT(cur["prompt_tokens"].get<int>(),
                prev["prompt_tokens"].get<int>() + prev["completion_tokens"].get<int>() + 40)
          << cur.dump();
      EXPECT_GE(cur["cached_local_tokens"].get<int>() + cur["cached_kvstore_tokens"].get<int>(),
                64 * ((prev["prompt_tokens"].get<int>() - 1) / 64) - 64)
          << cur.dump();
    }
  }
  // The loops share their system prompt (the tools): the second loop's first step finds it.
  // (One loop at a time: with two at once the router may spill a step to the idle worker, a
  // load bound that docs/loadtest.md shows.)
  EXPECT_GE(q[3]["cached_local_tokens"].get<int>() + q[3]["cached_kvstore_tokens"].get<int>(), 64)
      << q[3].dump();
  EXPECT_EQ(
      LoadTest({absl::StrCat("--target=", target_copy_), "--workload=agent", "--arrivals=poisson"})
          .exit_code,
      2);
}

TEST_F(LoadTestCluster, DocumentQaHitsServeTheDocumentFromTheCache) {
  const ToolRun r =
      LoadTest({absl::StrCat("--target=", target_copy_), "--workload=docqa", "--documents=3",
                "--document_tokens=400", "--hit_miss=1:1", "--question_tokens=20", "--max_tokens=4",
                "--concurrency=1", "--text_file=/usr/share/common-licenses/GPL-3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(r.report.is_object()) << r.output;
  const auto& q = r.report["requests"];
  ASSERT_EQ(q.size(), 6u);  // new, sent, new, sent, new, sent
  std::map<std::string, int> first_prompt;
  int64_t prompt = 0, cached = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    const std::string doc = q[i]["group"];
    const int tokens = q[i]["prompt_tokens"].get<int>();
    const int hit =
        q[i]["cached_local_tokens"].get<int>() + q[i]["cached_kvstore_tokens"].get<int>();
    prompt += tokens;
    cached += hit;
    if (i % 2 == 0) {  // a document not sent before: nothing of it can be cached
      EXPECT_EQ(first_prompt.count(doc), 0u) << i;
      first_prompt[doc] = tokens;
      EXPECT_LT(hit, 64) << q[i].dump();
    } else {  // a sent one: its pages, all but the question's (and the partial last page)
      ASSERT_EQ(first_prompt.count(doc), 1u) << i;
      EXPECT_GE(hit, 64 * ((first_prompt[doc] - 60) / 64) - 64) << q[i].dump();
      EXPECT_GT(hit, 300) << q[i].dump();
    }
  }
  EXPECT_NEAR(r.report["summary"]["hit_ratio"].get<double>(), static_cast<double>(cached) / prompt,
              1e-9);
}

TEST_F(LoadTestCluster, BadFlagsAreNamed) {
  const ToolRun r = LoadTest({absl::StrCat("--target=", target_copy_), "--arrivals=sometimes"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--arrivals=sometimes"), std::string::npos) << r.output;
  const ToolRun t = LoadTest({absl::StrCat("--target=", target_copy_), "--workload=trace"});
  EXPECT_EQ(t.exit_code, 2);
  EXPECT_NE(t.output.find("--trace"), std::string::npos) << t.output;
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--stages=2:10,fast"},
        std::vector<std::string>{"--stages=2:10", "--duration_s=5"},
        std::vector<std::string>{"--workload=docqa", "--hit_miss=1:0"}}) {
    std::vector<std::string> args = bad;
    args.push_back(absl::StrCat("--target=", target_copy_));
    const ToolRun b = LoadTest(args);
    EXPECT_EQ(b.exit_code, 2) << b.output;
    EXPECT_NE(b.output.find(bad[bad.size() - 1].substr(0, bad.back().find('='))), std::string::npos)
        << b.output;
  }
}

}  // namespace
}  // namespace kvstrata
