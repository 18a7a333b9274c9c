// kvstrata-loadtest's client (RunLoad) against an in-process fake worker that answers at once:
// what each request carries, and that a run ends cleanly however its last reactions are timed.
// No model: label unit, so it runs under ASan too (scripts/sanitize.sh).

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "loadtest/client.h"
#include "loadtest/workload.h"

namespace kvstrata::loadtest {
namespace {

namespace v1 = ::kvstrata::v1;

// Streams `tokens` one-token messages ("w0 ", "w1 ", ...) and a last one with the usage.
class FakeWorker final : public v1::Generation::Service {
 public:
  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.push_back(*request);
    }
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
    v1::GenerateResponse m;
    const int tokens = static_cast<int>(request->stop().max_tokens());
    for (int i = 0; i < tokens; ++i) {
      m.Clear();
      m.add_token_ids(7);
      m.set_text(absl::StrCat("w", i, " "));
      m.set_worker_id("fake");
      if (i + 1 == tokens) {
        m.set_finish_reason(v1::FINISH_REASON_LENGTH);
        m.mutable_usage()->set_prompt_tokens(100);
        m.mutable_usage()->set_completion_tokens(tokens);
        m.mutable_usage()->set_cached_local_tokens(64);
      }
      if (!writer->Write(m)) return grpc::Status::CANCELLED;
    }
    return grpc::Status::OK;
  }

  std::vector<v1::GenerateRequest> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(received_, {});
  }

  std::atomic<int> delay_ms{0};  // before the first token of each request

 private:
  std::mutex mu_;
  std::vector<v1::GenerateRequest> received_;
};

class LoadTestClient : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&worker_);
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    target_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override { server_->Shutdown(); }

  RunOptions Options() const {
    RunOptions o;
    o.target = target_;
    o.channels = 2;
    o.progress_interval_s = 0;
    return o;
  }

  FakeWorker worker_;
  std::unique_ptr<grpc::Server> server_;
  std::string target_;
};

std::string Text() {
  std::string t;
  for (int i = 0; t.size() < 8192; ++i) absl::StrAppend(&t, "word", i % 97, " and more text. ");
  return t;
}

// Run after run of short sessions: the last turn's reaction ends while Run() is returning, the
// race that once left a reaction using a runner already gone (a segfault under load; under ASan
// a heap-use-after-free). Each run must also carry every answer into the next turn.
TEST_F(LoadTestClient, SessionRunsEndCleanlyAndCarryEachAnswer) {
  SessionOptions so;
  so.sessions = 3;
  so.turns = 2;
  so.max_tokens = 3;
  so.system_tokens = 20;
  so.question_tokens = 5;
  absl::StatusOr<std::vector<RequestSpec>> requests = SessionRequests(so, Text());
  ASSERT_TRUE(requests.ok()) << requests.status();
  RunOptions o = Options();
  o.concurrency = 3;
  for (int run = 0; run < 150; ++run) {
    absl::StatusOr<RunResult> r = RunLoad(*requests, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->records.size(), 6u) << "run " << run;
    for (const RequestRecord& rec : r->records) {
      ASSERT_TRUE(rec.ok()) << rec.status << " " << rec.error;
      ASSERT_EQ(rec.text, "w0 w1 w2 ");
    }
    const std::vector<v1::GenerateRequest> got = worker_.Take();
    ASSERT_EQ(got.size(), 6u);
    int second_turns = 0;
    for (const v1::GenerateRequest& g : got) {
      const auto& m = g.chat().messages();
      if (m.size() == 2) continue;  // a first turn: system prompt and question
      ASSERT_EQ(m.size(), 4);       // system, question 1, answer 1, question 2
      EXPECT_EQ(m[2].role(), "assistant");
      EXPECT_EQ(m[2].content(), "w0 w1 w2 ");
      ++second_turns;
    }
    EXPECT_EQ(second_turns, 3);
  }
}

// The same for independent requests, closed and open loop.
TEST_F(LoadTestClient, RunsOfSingleRequestsEndCleanly) {
  SharedPrefixOptions sp;
  sp.groups = 2;
  sp.prompts_per_group = 2;
  sp.max_tokens = 2;
  sp.system_tokens = 20;
  sp.question_tokens = 5;
  absl::StatusOr<std::vector<RequestSpec>> requests = SharedPrefixRequests(sp, Text());
  ASSERT_TRUE(requests.ok()) << requests.status();
  for (int run = 0; run < 100; ++run) {
    RunOptions o = Options();
    o.concurrency = 2;
    if (run % 2) o.send_at = {0, 0, 0.001, 0.001};
    absl::StatusOr<RunResult> r = RunLoad(*requests, o);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->records.size(), 4u);
    for (const RequestRecord& rec : r->records) ASSERT_TRUE(rec.ok()) << rec.error;
    worker_.Take();
  }
}

// An agent loop's context grows by the last answer and one tool output a step, in order.
TEST_F(LoadTestClient, AgentStepsCarryTheWholeContextSoFar) {
  AgentOptions ao;
  ao.agents = 2;
  ao.steps = 4;
  ao.system_tokens = 30;
  ao.task_tokens = 5;
  ao.tool_tokens = 20;
  ao.max_tokens = 2;
  absl::StatusOr<std::vector<RequestSpec>> requests = AgentRequests(ao, Text());
  ASSERT_TRUE(requests.ok()) << requests.status();
  RunOptions o = Options();
  o.concurrency = 2;
  absl::StatusOr<RunResult> r = RunLoad(*requests, o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->records.size(), 8u);
  std::map<std::string, std::vector<v1::GenerateRequest>> by_system_and_task;
  for (const v1::GenerateRequest& g : worker_.Take()) {
    by_system_and_task[g.chat().messages(1).content()].push_back(g);  // keyed by the task
  }
  ASSERT_EQ(by_system_and_task.size(), 2u);
  for (auto& [task, steps] : by_system_and_task) {
    ASSERT_EQ(steps.size(), 4u);
    std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) {
      return a.chat().messages_size() < b.chat().messages_size();
    });
    for (int k = 0; k < 4; ++k) {
      const auto& m = steps[k].chat().messages();
      ASSERT_EQ(m.size(), 2 + 2 * k);           // system, task, then (answer, tool output) per step
      for (int j = 0; j + 1 < m.size(); ++j) {  // everything the last step sent, unchanged
        if (k > 0 && j < steps[k - 1].chat().messages_size()) {
          EXPECT_EQ(m[j].content(), steps[k - 1].chat().messages(j).content());
        }
      }
      if (k > 0) {
        EXPECT_EQ(m[2 * k].role(), "assistant");
        EXPECT_EQ(m[2 * k].content(), "w0 w1 ");
        EXPECT_EQ(m[2 * k + 1].role(), "user");
        EXPECT_EQ(m[2 * k + 1].content().rfind("Tool output", 0), 0u) << m[2 * k + 1].content();
      }
    }
  }
}

// The most requests of one stage that were in flight at once (from the records' times).
int MaxOverlap(const std::vector<RequestRecord>& records, int stage) {
  std::vector<std::pair<double, int>> events;
  for (const RequestRecord& r : records) {
    if (r.stage != stage) continue;
    events.emplace_back(r.sent_s, 1);
    events.emplace_back(r.sent_s + r.e2e_ms / 1e3, -1);
  }
  std::sort(events.begin(), events.end());  // an end sorts before a start at the same time
  int now = 0, most = 0;
  for (const auto& [t, d] : events) most = std::max(most, now += d);
  return most;
}

// Closed-loop stages set the concurrency for their time and sending stops after the last.
TEST_F(LoadTestClient, ClosedLoopStagesSetTheConcurrency) {
  SharedPrefixOptions sp;
  sp.groups = 4;
  sp.prompts_per_group = 100;
  sp.max_tokens = 1;
  sp.system_tokens = 20;
  sp.question_tokens = 5;
  absl::StatusOr<std::vector<RequestSpec>> requests = SharedPrefixRequests(sp, Text());
  ASSERT_TRUE(requests.ok());
  worker_.delay_ms = 20;
  RunOptions o = Options();
  o.stages = {{1, 0.5}, {4, 0.5}};
  absl::StatusOr<RunResult> r = RunLoad(*requests, o);
  ASSERT_TRUE(r.ok()) << r.status();
  int in_stage[2] = {0, 0};
  for (const RequestRecord& rec : r->records) {
    ASSERT_TRUE(rec.stage == 0 || rec.stage == 1) << rec.stage;
    ++in_stage[rec.stage];
    EXPECT_LT(rec.sent_s, 1.0 + 0.05);        // nothing sent after the stages (a little slack)
    if (std::abs(rec.sent_s - 0.5) > 0.02) {  // labelled when prepared, a moment before sent
      EXPECT_EQ(rec.stage, rec.sent_s < 0.5 ? 0 : 1) << rec.sent_s;
    }
  }
  EXPECT_EQ(MaxOverlap(r->records, 0), 1);
  EXPECT_GE(MaxOverlap(r->records, 1), 3);
  EXPECT_LE(MaxOverlap(r->records, 1), 4);
  EXPECT_GT(in_stage[1], in_stage[0]);  // four at a time send more in the same time
  EXPECT_LT(r->records.size(), requests->size());
}

}  // namespace
}  // namespace kvstrata::loadtest
