// The public Generation contract at the router (proto/kvstrata/v1/generate.proto), in process
// against scripted workers: many concurrent streams with cancels, token-id prompts, the context
// limit, the pool's limits in GetServerInfo, deadlines during decoding, a worker lost after
// output began, routing hints from clients, and the gauges before the first request.

#include <grpcpp/generic/generic_stub.h>

#include <random>

#include "services/router/router_service.h"
#include "tests/services/router_test_util.h"
#include "tests/testing/metrics_check.h"
#include "tests/testing/raw_call.h"

namespace kvstrata::router {
namespace {

using namespace ::kvstrata::router::test;  // NOLINT: the fixture and its helpers

class RouterContractTest : public RouterServiceTest {
 protected:
  // A registration that also states the worker's request limits.
  v1::RegisterWorkerRequest WithLimits(v1::RegisterWorkerRequest r, uint32_t max_context) {
    v1::RequestLimits* limits = r.mutable_limits();
    limits->set_max_context_tokens(max_context);
    limits->set_max_n(1);
    limits->set_max_stop_strings(16);
    limits->set_max_logprobs_top_n(20);
    limits->add_eos_token_ids(2);
    return r;
  }

  static v1::GenerateRequest TokenPrompt(int n) {
    v1::GenerateRequest g;
    for (int i = 0; i < n; ++i) g.mutable_token_ids()->add_ids(static_cast<uint32_t>(1 + i % 50));
    return g;
  }
};

// Many short streams at once, a third of them cancelled by the client at a random moment: the
// router must neither crash nor hang, and nothing stays counted as running.
TEST_F(RouterContractTest, ConcurrentStreamsWithClientCancelsEndCleanly) {
  Start({.max_in_flight_requests = 4096});
  Worker a = StartWorker("a", Script{.tokens = 3, .token_interval = absl::Milliseconds(1)});
  Worker b = StartWorker("b", Script{.tokens = 3, .token_interval = absl::Milliseconds(1)});
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  ASSERT_TRUE(Register(Registration("b", b.server->address())).ok());

  constexpr int kThreads = 64, kCallsPerThread = 25;
  std::atomic<int> ok{0}, cancelled{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kCallsPerThread; ++i) {
        grpc::ClientContext c;
        c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
        v1::GenerateRequest g;
        g.set_text(absl::StrCat("prompt ", t, " ", i));
        auto reader = gen_stub_->Generate(&c, g);
        const bool cancel = rng() % 3 == 0;
        std::thread canceller;
        if (cancel) {
          const int after_us = static_cast<int>(rng() % 3000);
          canceller = std::thread([&c, after_us] {
            absl::SleepFor(absl::Microseconds(after_us));
            c.TryCancel();
          });
        }
        v1::GenerateResponse m;
        while (reader->Read(&m)) {
        }
        const grpc::Status s = reader->Finish();
        if (canceller.joinable()) canceller.join();
        if (s.ok()) {
          ++ok;
        } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
          ++cancelled;
        } else {
          ++other;
          ADD_FAILURE() << s.error_code() << ": " << s.error_message();
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok + cancelled + other, kThreads * kCallsPerThread);
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(ok.load(), 0);
  EXPECT_EQ(AvailableWorkers(), 2u);  // the router still answers
  EXPECT_TRUE(WaitUntil([&] {
    return registry_.Render().find("\nkvstrata_router_running_requests 0\n") != std::string::npos;
  })) << registry_.Render();
}

TEST_F(RouterContractTest, TokenIdPromptsReachTheWorkerOnce) {
  Start({});
  Worker a = StartWorker("a");
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  const v1::GenerateRequest g = TokenPrompt(5);
  Result r = Generate(g);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(a.service->received().size(), 1u);
  const v1::GenerateRequest sent = a.service->received()[0];
  ASSERT_EQ(sent.token_ids().ids_size(), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sent.token_ids().ids(i), g.token_ids().ids(i));
  EXPECT_EQ(r.messages.back().usage().prompt_tokens(), 5u);
}

TEST_F(RouterContractTest, PromptsBeyondThePoolsContextAreOutOfRangeAtTheRouter) {
  Start({});
  Worker a = StartWorker("a");
  ASSERT_TRUE(Register(WithLimits(Registration("a", a.server->address()), 2048)).ok());

  v1::GenerateRequest g = TokenPrompt(2000);
  g.mutable_stop()->set_max_tokens(100);
  Result r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_NE(r.status.error_message().find("prompt tokens 2000"), std::string::npos)
      << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("max_context_tokens=2048"), std::string::npos)
      << r.status.error_message();

  // A million-token prompt is refused by the router itself, not by a message-size limit that
  // clients would take for load shedding.
  r = Generate(TokenPrompt(1000000));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::OUT_OF_RANGE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("prompt tokens 1000000"), std::string::npos)
      << r.status.error_message();
  EXPECT_TRUE(a.service->received().empty());

  // Within the limit it goes through.
  g.mutable_stop()->set_max_tokens(48);
  EXPECT_TRUE(Generate(g).status.ok());
}

TEST_F(RouterContractTest, ServerInfoAnswersForThePool) {
  Start({});
  Worker a = StartWorker("a"), b = StartWorker("b");
  ASSERT_TRUE(Register(WithLimits(Registration("a", a.server->address()), 8192)).ok());
  ASSERT_TRUE(Register(WithLimits(Registration("b", b.server->address()), 4096)).ok());
  grpc::ClientContext c;
  v1::ServerInfo info;
  ASSERT_TRUE(gen_stub_->GetServerInfo(&c, {}, &info).ok());
  EXPECT_EQ(info.role(), "router");
  EXPECT_EQ(info.max_context_tokens(), 4096u);  // what every worker of the pool can take
  EXPECT_EQ(info.max_n(), 1u);
  EXPECT_EQ(info.max_stop_strings(), 16u);
  EXPECT_EQ(info.max_logprobs_top_n(), 20u);
  ASSERT_EQ(info.eos_token_ids_size(), 1);
  EXPECT_EQ(info.eos_token_ids(0), 2u);
  EXPECT_GT(info.max_request_bytes(), 1u << 22);
}

// A worker that ignores deadlines and keeps streaming: the router ends the stream itself, in
// time, with finish_reason DEADLINE, usage and status OK.
TEST_F(RouterContractTest, ADeadlineDuringDecodingEndsTheStreamWithDeadlineAndUsage) {
  Start({});
  Worker a = StartWorker("a", Script{.tokens = 1000, .token_interval = absl::Milliseconds(10)});
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(600));
  v1::GenerateRequest g = TokenPrompt(10);
  auto reader = gen_stub_->Generate(&c, g);
  std::vector<v1::GenerateResponse> messages;
  v1::GenerateResponse m;
  uint32_t tokens = 0;
  while (reader->Read(&m)) {
    tokens += static_cast<uint32_t>(m.token_ids_size());
    messages.push_back(m);
  }
  const grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_code() << ": " << s.error_message();
  ASSERT_FALSE(messages.empty());
  const v1::GenerateResponse& last = messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_DEADLINE);
  ASSERT_TRUE(last.has_usage());
  EXPECT_EQ(last.usage().prompt_tokens(), 10u);
  EXPECT_EQ(last.usage().completion_tokens(), tokens);
  EXPECT_GT(tokens, 5u);
  EXPECT_EQ(last.worker_id(), "a");
  EXPECT_TRUE(WaitUntil([&] { return a.service->cancelled(); }));
}

// The contract for a failure after output began: a final message with finish_reason ERROR and
// `error`, then the same non-OK status.
TEST_F(RouterContractTest, AWorkerLostAfterOutputEndsWithAnErrorMessage) {
  Start({});
  Worker a = StartWorker("a", Script{.tokens = 2, .fail_after_output = true});
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  Result r = Generate(TokenPrompt(8));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  ASSERT_EQ(r.messages.size(), 3u);  // two tokens, then the final message
  const v1::GenerateResponse& last = r.messages.back();
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_ERROR);
  EXPECT_EQ(last.error().code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_NE(last.error().message().find("worker a"), std::string::npos) << last.error().message();
  ASSERT_TRUE(last.has_usage());
  EXPECT_EQ(last.usage().prompt_tokens(), 8u);
  EXPECT_EQ(last.usage().completion_tokens(), 2u);
  EXPECT_EQ(last.worker_id(), "a");
  EXPECT_EQ(a.service->received().size(), 1u);  // not retried: output had begun
}

// The API says a client's routing hints are overwritten, so malformed ones are not an error.
TEST_F(RouterContractTest, ClientRoutingHintsAreOverwrittenNotValidated) {
  Start({});
  Worker a = StartWorker("a");
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  v1::GenerateRequest g = TokenPrompt(200);
  g.mutable_routing()->add_prefix_page_keys("not sixteen bytes");
  g.mutable_routing()->set_predicted_local_cached_tokens(123456);
  g.mutable_routing()->set_router_id("client");
  Result r = Generate(g);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  const v1::RoutingHints sent = a.service->received().at(0).routing();
  EXPECT_EQ(sent.router_id(), "router-0");
  EXPECT_EQ(sent.prefix_page_keys_size(), 3);  // (200 - 1) / 64 pages, 16 bytes each
  for (const std::string& k : sent.prefix_page_keys()) EXPECT_EQ(k.size(), 16u);
  EXPECT_EQ(sent.predicted_local_cached_tokens(), 0u);
}

TEST_F(RouterContractTest, GaugesReadZeroBeforeTheFirstRequest) {
  Start({});
  const std::string text = registry_.Render();
  EXPECT_NE(text.find("\nkvstrata_router_running_requests 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nkvstrata_router_workers 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nkvstrata_router_prefix_index_keys 0\n"), std::string::npos) << text;
}

TEST_F(RouterContractTest, EveryDeclaredMetricIsServedAndDocumented) {
  Start({});
  test_util::ExpectDeclaredMetricsServedAndDocumented(registry_, "docs/routing.md",
                                                      "kvstrata_router_");
}

// Bytes that are not a GenerateRequest get INVALID_ARGUMENT saying what is wrong, not an empty
// INTERNAL.
TEST_F(RouterContractTest, UnparseableRequestsAreInvalidArgumentNamingTheField) {
  Start({});
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());

  // A text prompt that is not UTF-8: field 3 (text), length 2, bytes C3 28.
  test_util::RawResult r =
      test_util::RawServerStreamingCall(channel, "/kvstrata.v1.Generation/Generate",
                                        std::string("\x1a\x02\xc3\x28", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("text"), std::string::npos) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("UTF-8"), std::string::npos) << r.status.error_message();

  // A chat message whose content is not UTF-8: chat (5) { messages (1) { content (2) } }.
  const std::string content("\x12\x01\xff", 3);
  const std::string message = std::string("\x0a") + static_cast<char>(content.size()) + content;
  const std::string chat = std::string("\x2a") + static_cast<char>(message.size()) + message;
  r = test_util::RawServerStreamingCall(channel, "/kvstrata.v1.Generation/Generate", chat);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("chat.messages[0].content"), std::string::npos)
      << r.status.error_message();

  // Random bytes.
  r = test_util::RawServerStreamingCall(channel, "/kvstrata.v1.Generation/Generate",
                                        std::string("\xff\xff\xff\xff\x0f\x01", 6));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("kvstrata.v1.GenerateRequest"), std::string::npos)
      << r.status.error_message();
  EXPECT_EQ(AvailableWorkers(), 0u);  // still serving
}

}  // namespace
}  // namespace kvstrata::router
