// The local cluster end to end, as separate processes on loopback: kvstrata-router, two
// kvstrata-decode workers registering with it, and one or two kvstrata-kvstore nodes, on the
// default model. Requests go through the router's public Generation API only.
//
//   - a prompt sharing a 1,000+ token prefix with an earlier request that ran on the other
//     worker is served from the kvstore, fully, with the same greedy text (one and two stores);
//   - prefix-affinity gets a higher cache hit ratio than round-robin on a shared-prefix workload;
//   - killing the kvstore mid-run lets every request finish;
//   - every service's /metrics passes `promtool check metrics`.
//
// Each process logs to a file under the test's temporary folder; a failing test prints the tail
// of every log.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "kvstrata/v1/generate.grpc.pb.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"
#include "tests/testing/loopback.h"
#include "tests/testing/process.h"

#if !defined(KVSTRATA_ROUTER_BINARY) || !defined(KVSTRATA_DECODE_BINARY) || \
    !defined(KVSTRATA_KVSTORE_BINARY)
#error "the test needs the paths of the three service binaries"
#endif

namespace kvstrata {
namespace {

using ::kvstrata::test_util::Channel;
using ::kvstrata::test_util::Child;
using ::kvstrata::test_util::FreePort;
using ::kvstrata::test_util::HttpGet;
using ::kvstrata::test_util::WaitServing;

constexpr int kPage = 64;

struct ClusterOptions {
  std::string policy = "prefix-affinity";
  int kvstores = 1;
};

struct Answer {
  grpc::Status status;
  std::string text;
  std::string worker;
  v1::FinishReason finish = v1::FINISH_REASON_UNSPECIFIED;
  v1::Usage usage;
};

class Cluster {
 public:
  // Starts everything and waits until the router has both workers. Check ok() after.
  explicit Cluster(const ClusterOptions& options) {
    const char* model = std::getenv("KVSTRATA_MODEL");
    if (model == nullptr) {
      error_ = "KVSTRATA_MODEL is not set";
      return;
    }
    std::vector<std::string> stores;
    for (int i = 0; i < options.kvstores; ++i) {
      const int port = FreePort(), metrics = FreePort();
      stores.push_back(absl::StrCat("127.0.0.1:", port));
      metrics_ports_.push_back(metrics);
      children_.push_back(std::make_unique<Child>(
          absl::StrCat("kvstore", i), KVSTRATA_KVSTORE_BINARY,
          std::vector<std::string>{"--insecure", absl::StrCat("--listen=", stores.back()),
                                   absl::StrCat("--metrics_listen=127.0.0.1:", metrics),
                                   "--capacity_mb=256", "--shutdown_grace_ms=500"}));
      if (!WaitServing(stores.back(), "kvstrata.v1.KvStore", *children_.back(),
                       absl::Seconds(20))) {
        error_ = "a kvstore did not start";
        return;
      }
    }
    kvstores_ = stores;
    const std::string kvstore_flag = absl::StrCat("--kvstore=", absl::StrJoin(stores, ","));
    router_address_ = absl::StrCat("127.0.0.1:", FreePort());
    router_metrics_port_ = FreePort();
    metrics_ports_.push_back(router_metrics_port_);
    children_.push_back(std::make_unique<Child>(
        "router", KVSTRATA_ROUTER_BINARY,
        std::vector<std::string>{
            "--insecure", absl::StrCat("--listen=", router_address_),
            absl::StrCat("--metrics_listen=127.0.0.1:", router_metrics_port_),
            absl::StrCat("--model=", model), absl::StrCat("--policy=", options.policy),
            "--heartbeat_interval_ms=200", "--shutdown_grace_ms=1000", kvstore_flag}));
    router_ = children_.back().get();
    if (!WaitServing(router_address_, "kvstrata.v1.Generation", *router_, absl::Seconds(30))) {
      error_ = "the router did not start";
      return;
    }
    std::vector<std::pair<std::string, Child*>> workers;
    for (const char* id : {"decode-a", "decode-b"}) {
      const std::string address = absl::StrCat("127.0.0.1:", FreePort());
      const int metrics = FreePort();
      metrics_ports_.push_back(metrics);
      children_.push_back(std::make_unique<Child>(
          id, KVSTRATA_DECODE_BINARY,
          std::vector<std::string>{
              "--insecure", absl::StrCat("--listen=", address),
              absl::StrCat("--metrics_listen=127.0.0.1:", metrics), absl::StrCat("--model=", model),
              absl::StrCat("--worker_id=", id), absl::StrCat("--router=", router_address_),
              kvstore_flag, "--kv_cache_mb=192", "--local_cache_mb=128",
              "--shutdown_grace_ms=1000"}));
      workers.push_back({address, children_.back().get()});
    }
    for (auto& [address, child] : workers) {
      if (!WaitServing(address, "kvstrata.v1.Generation", *child, absl::Seconds(120))) {
        error_ = absl::StrCat(child->name(), " did not start");
        return;
      }
    }
    stub_ = v1::Generation::NewStub(Channel(router_address_));
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      v1::ServerInfo info;
      if (stub_->GetServerInfo(&context, {}, &info).ok() && info.available_workers() == 2) return;
      absl::SleepFor(absl::Milliseconds(100));
    }
    error_ = "the workers did not register with the router";
  }

  ~Cluster() {
    // Workers first (they drain), then the router and the stores.
    for (auto it = children_.rbegin(); it != children_.rend(); ++it) (*it)->Stop(SIGTERM);
    if (::testing::Test::HasFailure() || !error_.empty()) {
      for (const auto& c : children_) {
        fprintf(stderr, "---- %s log (tail) ----\n%s\n", c->name().c_str(),
                c->LogTail().c_str());
      }
    }
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  Child& kvstore(int i) { return *children_[i]; }
  const std::vector<int>& metrics_ports() const { return metrics_ports_; }

  Answer Ask(const std::string& system, const std::string& question, int max_tokens) {
    v1::GenerateRequest request;
    v1::ChatInput* chat = request.mutable_chat();
    chat->set_apply_chat_template(true);
    chat->set_add_generation_prompt(true);
    v1::ChatMessage* s = chat->add_messages();
    s->set_role("system");
    s->set_content(system);
    v1::ChatMessage* u = chat->add_messages();
    u->set_role("user");
    u->set_content(question);
    request.mutable_sampling()->set_temperature(0);
    request.mutable_stop()->set_max_tokens(static_cast<uint32_t>(max_tokens));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(180));
    auto reader = stub_->Generate(&context, request);
    Answer a;
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
      a.text += m.text();
      if (!m.worker_id().empty()) a.worker = m.worker_id();
      if (m.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) a.finish = m.finish_reason();
      if (m.has_usage()) a.usage = m.usage();
    }
    a.status = reader->Finish();
    return a;
  }

  // Pages held by all kvstore nodes together.
  uint64_t StoredPages() {
    uint64_t pages = 0;
    for (const std::string& address : kvstores_) {
      auto store = v1::KvStore::NewStub(Channel(address));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
      v1::StatsResponse stats;
      if (store->Stats(&context, {}, &stats).ok()) pages += stats.pages();
    }
    return pages;
  }

  // Publishing is asynchronous; under the sanitizers on two cores it took over 30 s once.
  bool WaitForStoredPages(uint64_t at_least) {
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    while (absl::Now() < give_up) {
      if (StoredPages() >= at_least) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

 private:
  std::vector<std::unique_ptr<Child>> children_;
  std::vector<std::string> kvstores_;
  std::vector<int> metrics_ports_;
  std::string router_address_;
  int router_metrics_port_ = 0;
  Child* router_ = nullptr;
  std::unique_ptr<v1::Generation::Stub> stub_;
  std::string error_;
};

// About 1,200 tokens of operator instructions: the shared prefix.
std::string LongSystemPrompt() {
  std::string s =
      "You are the support assistant of Northwind Outfitters. Follow the rules below exactly.\n";
  const char* topics[] = {"returns", "shipping", "warranty", "billing", "accounts",
                          "gift cards", "repairs", "sizing"};
  for (int i = 0; i < 40; ++i) {
    absl::StrAppend(&s, "Rule ", i + 1, ": for questions about ", topics[i % 8], " on order ",
                    4100 + 37 * i, ", check the record, confirm the customer's address, and "
                    "answer politely within ", 1 + i % 3, " business days.\n");
  }
  return s;
}

std::string TeamPrompt(const std::string& team) {
  std::string s = absl::StrCat("You are the assistant of the ", team, " team. Their handbook:\n");
  for (int i = 0; i < 12; ++i) {
    absl::StrAppend(&s, team, " guideline ", i + 1, ": keep notes for ticket ", 700 + 13 * i,
                    " and reply to the requester the same day.\n");
  }
  return s;
}

void CheckMetricsWithPromtool(Cluster& cluster) {
  for (int port : cluster.metrics_ports()) {
    const std::string body = HttpGet(port, "/metrics");
    ASSERT_FALSE(body.empty()) << "no /metrics on port " << port;
    EXPECT_NE(body.find("kvstrata_"), std::string::npos);
    const std::string path = absl::StrCat(::testing::TempDir(), "e2e_metrics_", port);
    std::ofstream(path) << body;
    const int rc = std::system(
        absl::StrCat("promtool check metrics < ", path, " > ", path, ".out 2>&1").c_str());
    std::ifstream out(path + ".out");
    std::stringstream text;
    text << out.rdbuf();
    EXPECT_EQ(rc, 0) << "promtool on port " << port << ":\n" << text.str();
  }
}

class SharedPrefixTest : public ::testing::TestWithParam<int> {};

// Round-robin sends the repeat to the other worker, which has nothing locally: the whole prefix
// must come from the kvstore (spread over `GetParam()` nodes) and the greedy text must not move.
TEST_P(SharedPrefixTest, RepeatOnTheOtherWorkerComesFromTheKvStoreWithTheSameText) {
  Cluster cluster({.policy = "round-robin", .kvstores = GetParam()});
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string system = LongSystemPrompt();
  const std::string question = "Which rule covers warranty questions on order 4211?";

  const Answer first = cluster.Ask(system, question, 16);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_GT(first.usage.prompt_tokens(), 1000u);
  EXPECT_EQ(first.usage.cached_local_tokens() + first.usage.cached_kvstore_tokens(), 0u);
  const uint32_t cacheable = (first.usage.prompt_tokens() - 1) / kPage * kPage;
  ASSERT_TRUE(cluster.WaitForStoredPages(cacheable / kPage)) << "the worker did not publish";

  const Answer second = cluster.Ask(system, question, 16);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_NE(second.worker, first.worker);
  EXPECT_EQ(second.usage.prompt_tokens(), first.usage.prompt_tokens());
  EXPECT_EQ(second.usage.cached_kvstore_tokens(), cacheable);  // a full-prefix hit
  EXPECT_EQ(second.usage.cached_local_tokens(), 0u);
  EXPECT_EQ(second.text, first.text);
  EXPECT_FALSE(second.text.empty());
  CheckMetricsWithPromtool(cluster);
}

INSTANTIATE_TEST_SUITE_P(OneAndTwoKvStores, SharedPrefixTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat(info.param, "_kvstores"); });

// Three teams' prompts, each asked twice in a row, on a cluster without a kvstore, so hits come
// only from the workers' local tiers. Round-robin sends each repeat to the worker that has not
// seen the prefix; prefix-affinity sends it back to the one that has.
double SharedPrefixHitRatio(const std::string& policy) {
  Cluster cluster({.policy = policy, .kvstores = 0});
  EXPECT_TRUE(cluster.ok()) << cluster.error();
  if (!cluster.ok()) return -1;
  uint64_t prompt = 0, cached = 0;
  for (const char* team : {"billing", "logistics", "platform"}) {
    for (int repeat = 0; repeat < 2; ++repeat) {
      const Answer a = cluster.Ask(TeamPrompt(team), "Who do I reply to first?", 4);
      EXPECT_TRUE(a.status.ok()) << a.status.error_message();
      prompt += a.usage.prompt_tokens();
      cached += a.usage.cached_local_tokens() + a.usage.cached_kvstore_tokens();
      absl::SleepFor(absl::Milliseconds(500));  // two heartbeats
    }
  }
  return prompt == 0 ? -1 : static_cast<double>(cached) / static_cast<double>(prompt);
}

TEST(RoutingPolicyE2eTest, PrefixAffinityHitsTheCacheMoreThanRoundRobin) {
  const double round_robin = SharedPrefixHitRatio("round-robin");
  const double affinity = SharedPrefixHitRatio("prefix-affinity");
  fprintf(stderr, "cache hit ratio: round-robin %.3f, prefix-affinity %.3f\n", round_robin,
          affinity);
  EXPECT_GT(affinity, round_robin + 0.2);
}

// The kvstore dies while requests run: they must all finish (a dead store is a miss).
TEST(KvStoreFailureE2eTest, KillingTheKvStoreMidRunLetsEveryRequestFinish) {
  Cluster cluster({.policy = "round-robin", .kvstores = 1});
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string system = LongSystemPrompt();
  const Answer warm = cluster.Ask(system, "What is rule 3 about?", 4);
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();

  std::vector<Answer> answers(6);
  std::vector<std::thread> clients;
  for (int c = 0; c < 2; ++c) {
    clients.emplace_back([&, c] {
      for (int i = 0; i < 3; ++i) {
        answers[c * 3 + i] =
            cluster.Ask(system, absl::StrCat("What is rule ", 5 + c * 3 + i, " about?"), 6);
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  cluster.kvstore(0).Stop(SIGKILL);
  for (std::thread& t : clients) t.join();
  for (const Answer& a : answers) {
    EXPECT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_NE(a.finish, v1::FINISH_REASON_ERROR);
    EXPECT_FALSE(a.text.empty());
  }
}

}  // namespace
}  // namespace kvstrata
