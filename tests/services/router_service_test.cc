// The router's services in process, against scripted workers: registration and heartbeats,
// validation, what is forwarded (token ids, page keys, predictions), retries before the first
// message, and expiry of silent workers. The workers here are fakes because these tests are
// about what the router does with their answers (failures included); the router in front of
// real decode workers and a real kvstore is covered by cluster_e2e_test.

#include "services/router/router_service.h"

#include <gmock/gmock.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/radix_hash.h"
#include "core/tenant_keys.h"
#include "tests/services/router_test_util.h"

namespace kvstrata::router {
namespace {

using namespace ::kvstrata::router::test;  // NOLINT: the fixture and its helpers

TEST_F(RouterServiceTest, RegistrationErrorsNameTheField) {
  Start({});
  v1::RegisterWorkerRequest r = Registration("", "127.0.0.1:1");
  grpc::Status s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("worker_id"), std::string::npos) << s.error_message();

  r = Registration("w", "127.0.0.1:1");
  r.set_capacity_pages(0);
  s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("capacity_pages"), std::string::npos) << s.error_message();

  r = Registration("w", "127.0.0.1:1");
  r.mutable_kv_format()->set_rotation_digest("short");
  s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("rotation_digest"), std::string::npos) << s.error_message();

  r = Registration("w", "127.0.0.1:1");
  r.set_same_gpu_uuid(std::string(200, 'G'));
  s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("same_gpu_uuid"), std::string::npos) << s.error_message();

  r = Registration("w", "127.0.0.1:1");
  r.add_local_page_keys("not sixteen bytes");
  s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("local_page_keys[0]"), std::string::npos);

  ASSERT_TRUE(Register(Registration("w1", "127.0.0.1:1")).ok());
  r = Registration("w2", "127.0.0.1:2");
  r.set_model_fingerprint("beef");
  s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("model_fingerprint"), std::string::npos) << s.error_message();
  r = Registration("w2", "127.0.0.1:2");
  r.mutable_kv_format()->set_name("bf16-p64");
  s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("kv_format.name"), std::string::npos) << s.error_message();
  EXPECT_EQ(AvailableWorkers(), 1u);
}

TEST_F(RouterServiceTest, AWorkerWithAnotherTokenizerIsRefused) {
  Start({});
  const std::string ours = TinyEncoder().identity();
  ASSERT_FALSE(ours.empty());
  grpc::ClientContext c;
  v1::ServerInfo info;
  ASSERT_TRUE(gen_stub_->GetServerInfo(&c, {}, &info).ok());
  EXPECT_EQ(info.tokenizer(), ours);

  v1::RegisterWorkerRequest r = Registration("w1", "127.0.0.1:1");
  r.set_tokenizer("smollm:0123456789abcdef");
  const grpc::Status s = Register(r);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("tokenizer"), std::string::npos) << s.error_message();
  r.set_tokenizer(ours);
  EXPECT_TRUE(Register(r).ok());
}

TEST(PromptEncoderIdentityTest, EverythingThatChangesTokenIdsChangesTheIdentity) {
  absl::StatusOr<model::LoadedModel> m = model::MakeTinyModel({});
  ASSERT_TRUE(m.ok());
  const tokenizer::TokenizerSpec base = m->tokenizer;
  auto identity = [](const tokenizer::TokenizerSpec& spec) {
    absl::StatusOr<tokenizer::PromptEncoder> e = tokenizer::PromptEncoder::Create(spec);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? e->identity() : std::string();
  };
  EXPECT_EQ(identity(base), identity(base));
  tokenizer::TokenizerSpec other = base;
  ASSERT_FALSE(other.merges.empty());
  other.merges.pop_back();
  EXPECT_NE(identity(other), identity(base));
  other = base;
  other.add_bos = !other.add_bos;
  EXPECT_NE(identity(other), identity(base));
  other = base;
  other.chat_template += " ";
  EXPECT_NE(identity(other), identity(base));
}

TEST_F(RouterServiceTest, HeartbeatsNeedTheRegisteredIncarnationAndDrainingLeaves) {
  Start({});
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  hb.set_incarnation(42);
  EXPECT_EQ(Heartbeat(hb).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Register(Registration("w1", "127.0.0.1:1")).ok());
  EXPECT_TRUE(Heartbeat(hb).ok());
  hb.set_incarnation(43);  // the worker restarted without registering again
  EXPECT_EQ(Heartbeat(hb).error_code(), grpc::StatusCode::NOT_FOUND);
  hb.set_incarnation(42);
  hb.add_stored_page_keys("bad");
  EXPECT_EQ(Heartbeat(hb).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  hb.clear_stored_page_keys();
  EXPECT_EQ(AvailableWorkers(), 1u);
  hb.mutable_load()->set_draining(true);
  EXPECT_TRUE(Heartbeat(hb).ok());
  EXPECT_EQ(AvailableWorkers(), 0u);
  hb.mutable_load()->set_draining(false);
  EXPECT_EQ(Heartbeat(hb).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RouterServiceTest, SilentWorkerIsDroppedAndMustRegisterAgain) {
  Start({});
  ASSERT_TRUE(Register(Registration("w1", "127.0.0.1:1")).ok());
  EXPECT_EQ(AvailableWorkers(), 1u);
  clock_.Advance(absl::Seconds(10));  // far past 3 x 20 ms
  EXPECT_TRUE(WaitUntil([&] { return AvailableWorkers() == 0; }));
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w1");
  hb.set_incarnation(42);
  EXPECT_EQ(Heartbeat(hb).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(registry_.Render().find("kvstrata_router_workers_dropped_total{reason=\"silent\"} 1"),
            std::string::npos);
}

TEST_F(RouterServiceTest, NoWorkerIsUnavailableAndBadInputIsInvalidArgument) {
  Start({});
  v1::GenerateRequest g;
  g.set_text("hello");
  Result r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE);

  g.set_request_id("bad\nid");
  r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("request_id"), std::string::npos);

  g.clear_request_id();
  g.mutable_token_ids()->add_ids(1u << 30);
  r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("token_ids.ids[0]"), std::string::npos);

  g.clear_token_ids();
  g.mutable_chat();
  r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("chat.messages"), std::string::npos);
  EXPECT_TRUE(r.messages.empty());
}

// With API keys, the tenant of the key, not the client, decides the cache namespace: what the
// router hashes for routing and the salt the worker gets. A client cannot reach another
// tenant's namespace by sending that tenant's salt.
TEST_F(RouterServiceTest, TenantsFromApiKeysAreBoundIntoTheNamespace) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/router-api-keys-", getpid());
  std::ofstream(path) << "acme " << HashApiKey("key-a") << "\nglobex " << HashApiKey("key-b")
                      << "\n";
  absl::StatusOr<std::unique_ptr<TenantKeys>> keys = TenantKeys::Load(path, absl::Seconds(10));
  ASSERT_TRUE(keys.ok()) << keys.status();
  Start({.policy = "prefix-affinity", .tenant_keys = keys->get()});
  Worker w = StartWorker("w");
  ASSERT_TRUE(Register(Registration("w", w.server->address())).ok());

  auto generate = [&](const std::string& api_key, const std::string& salt) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!api_key.empty()) c.AddMetadata("authorization", "Bearer " + api_key);
    v1::GenerateRequest g;
    g.set_text(Text(3));
    g.set_cache_salt(salt);
    auto reader = gen_stub_->Generate(&c, g);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  const grpc::Status anonymous = generate("", "");
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(generate("key-unknown", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(w.service->received().empty());

  const std::string acme_salt = TenantCacheSalt("acme", "");
  ASSERT_TRUE(generate("key-a", "").ok());
  ASSERT_TRUE(generate("key-b", acme_salt).ok());  // globex sends acme's salt
  const std::vector<v1::GenerateRequest> sent = w.service->received();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].cache_salt(), acme_salt);
  EXPECT_EQ(sent[1].cache_salt(), TenantCacheSalt("globex", acme_salt));
  // The page keys the router computed differ: no page of one is a page of the other.
  ASSERT_GT(sent[0].routing().prefix_page_keys_size(), 0);
  for (const std::string& k : sent[0].routing().prefix_page_keys()) {
    EXPECT_THAT(sent[1].routing().prefix_page_keys(), ::testing::Not(::testing::Contains(k)));
  }
  // The router reads the keys until its last handler returns: stop it before they go.
  server_->Shutdown(absl::Seconds(1));
  server_.reset();
}

TEST_F(RouterServiceTest, ForwardsTokenIdsPageKeysAndRoutesToTheWorkerHoldingThePages) {
  Start({.policy = "prefix-affinity"});
  Worker a = StartWorker("a"), b = StartWorker("b");
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  ASSERT_TRUE(Register(Registration("b", b.server->address())).ok());

  const std::string text = Text(5);
  const std::vector<int32_t> prompt = TinyEncoder().EncodeText(text);
  const std::vector<PageKey> keys = KeysOf(prompt);
  ASSERT_EQ(keys.size(), (prompt.size() - 1) / kPage);
  ASSERT_GE(keys.size(), 4u);

  // b reports the prompt's first four pages in its local tier.
  v1::HeartbeatRequest hb;
  hb.set_worker_id("b");
  hb.set_incarnation(42);
  for (int i = 0; i < 4; ++i) {
    hb.add_stored_page_keys(keys[i].ToBytes());
  }
  ASSERT_TRUE(Heartbeat(hb).ok());

  v1::GenerateRequest g;
  g.set_text(text);
  g.set_request_id("req-1");
  const Result r = Generate(g);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages.back().worker_id(), "b");
  EXPECT_EQ(r.messages.back().usage().predicted_cached_tokens(), 4 * kPage);
  EXPECT_GT(r.messages.back().timings().total_us(), 0u);
  EXPECT_TRUE(a.service->received().empty());

  const std::vector<v1::GenerateRequest> sent = b.service->received();
  ASSERT_EQ(sent.size(), 1u);
  const v1::GenerateRequest& f = sent[0];
  EXPECT_EQ(f.request_id(), "req-1");
  ASSERT_EQ(f.input_case(), v1::GenerateRequest::kTokenIds);
  EXPECT_EQ(std::vector<int32_t>(f.token_ids().ids().begin(), f.token_ids().ids().end()), prompt);
  ASSERT_EQ(f.routing().prefix_page_keys_size(), static_cast<int>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(f.routing().prefix_page_keys(static_cast<int>(i)),
              keys[i].ToBytes());
  }
  EXPECT_EQ(f.routing().predicted_local_cached_tokens(), 4 * kPage);
  EXPECT_EQ(f.routing().router_id(), "router-0");

  // Once b has removed those pages, nothing argues for b: the prediction drops to zero.
  hb.clear_stored_page_keys();
  for (int i = 0; i < 4; ++i) {
    hb.add_removed_page_keys(keys[i].ToBytes());
  }
  ASSERT_TRUE(Heartbeat(hb).ok());
  g.set_request_id("req-2");
  const Result r2 = Generate(g);
  ASSERT_TRUE(r2.status.ok());
  EXPECT_EQ(r2.messages.back().usage().predicted_cached_tokens(), 0u);
  EXPECT_NE(registry_.Render().find("kvstrata_router_requests_total{finish_reason="
                                    "\"FINISH_REASON_LENGTH\"} 2"),
            std::string::npos);
}

TEST_F(RouterServiceTest, APrefixOnAKvstoreNodeGoesToTheWorkerOnThatNodesGpu) {
  const std::string text = Text(5);
  const std::vector<int32_t> prompt = TinyEncoder().EncodeText(text);
  const std::vector<PageKey> keys = KeysOf(prompt);
  // Node "B" holds the prompt's pages; node "A" none. Each has its HBM pool on its own GPU.
  KvStoreNode node_a = StartKvStoreNode("GPU-aaaa", {}), node_b = StartKvStoreNode("GPU-bbbb", keys);
  const std::string b_address = node_b.server->address();
  Start({.policy = "prefix-affinity",
         .kvstore_addresses = {node_a.server->address(), b_address}});
  Worker a = StartWorker("a"), b = StartWorker("b");
  v1::RegisterWorkerRequest ra = Registration("a", a.server->address());
  ra.set_same_gpu_uuid("GPU-aaaa");
  v1::RegisterWorkerRequest rb = Registration("b", b.server->address());
  rb.set_same_gpu_uuid("GPU-bbbb");
  ASSERT_TRUE(Register(ra).ok());
  ASSERT_TRUE(Register(rb).ok());
  ASSERT_TRUE(WaitUntil([&] {
    const PrefixMatch m = router_->prefix_index().Match(keys);
    const std::vector<WorkerInfo> live = router_->LiveWorkers();
    return m.StoreNodePages(b_address) == static_cast<int64_t>(keys.size()) &&
           live.size() == 2 && live[1].colocated_kvstore == b_address;
  }));

  // Equal load (both idle): b, the worker on node B's GPU, rather than a (first by id).
  v1::GenerateRequest g;
  g.set_text(text);
  g.set_request_id("req-1");
  Result r = Generate(g);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.messages.back().worker_id(), "b");
  EXPECT_EQ(r.messages.back().usage().predicted_cached_tokens(), keys.size() * kPage);
  const std::string rendered = registry_.Render();
  EXPECT_NE(rendered.find(absl::StrCat("kvstrata_router_predicted_colocated_kvstore_tokens_total ",
                                       keys.size() * kPage)),
            std::string::npos)
      << rendered;
  EXPECT_NE(rendered.find("reason=\"colocated\""), std::string::npos) << rendered;

  // b registers again without saying which GPU it maps pools on (an older worker): no worker is
  // co-located, and the choice is today's: the kvstore's pages help both alike, a wins by id.
  rb.clear_same_gpu_uuid();
  ASSERT_TRUE(Register(rb).ok());
  EXPECT_TRUE(router_->LiveWorkers()[1].colocated_kvstore.empty());
  g.set_request_id("req-2");
  r = Generate(g);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.messages.back().worker_id(), "a");
  EXPECT_EQ(r.messages.back().usage().predicted_cached_tokens(), keys.size() * kPage);
}

TEST_F(RouterServiceTest, AWorkerWithALocalTierHoldsThePromptRightAfterServingIt) {
  Start({.policy = "prefix-affinity"});
  Worker a = StartWorker("a"), b = StartWorker("b");
  ASSERT_TRUE(RegisterWithLocalTier("a", a).ok());
  ASSERT_TRUE(RegisterWithLocalTier("b", b).ok());
  v1::GenerateRequest g;
  g.set_text(Text(4));
  const Result first = Generate(g);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.messages.back().usage().predicted_cached_tokens(), 0u);
  // No heartbeat in between: the router counts the served prompt's pages itself.
  const Result second = Generate(g);
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(second.messages.back().worker_id(), first.messages.back().worker_id());
  const size_t pages = (TinyEncoder().EncodeText(Text(4)).size() - 1) / kPage;
  EXPECT_EQ(second.messages.back().usage().predicted_cached_tokens(), pages * kPage);
}

// While a worker prefills a prompt, another request with the same prefix goes to that worker
// (which waits for the pages) rather than computing them again elsewhere; an attempt that fails
// withdraws the pages it claimed.
TEST_F(RouterServiceTest, ARequestInFlightClaimsItsPromptForItsWorker) {
  Start({.policy = "prefix-affinity"});
  Worker a = StartWorker("a", grpc::Status::OK, /*hang=*/true);
  Worker b = StartWorker("b", grpc::Status::OK, /*hang=*/true);
  ASSERT_TRUE(RegisterWithLocalTier("a", a).ok());
  ASSERT_TRUE(RegisterWithLocalTier("b", b).ok());
  v1::GenerateRequest g;
  g.set_text(Text(4));
  OpenCall first(*gen_stub_, g);
  ASSERT_TRUE(WaitUntil([&] { return a.service->received().size() == 1; }))
      << "ties go to the first id";
  OpenCall second(*gen_stub_, g);
  ASSERT_TRUE(WaitUntil([&] { return a.service->received().size() == 2; }));
  EXPECT_TRUE(b.service->received().empty());
  EXPECT_GT(a.service->received()[1].routing().predicted_local_cached_tokens(), 0u);
  first.CancelAndFinish();
  second.CancelAndFinish();
}

// Heartbeats report queues up to an interval late; the router counts what it sent itself.
TEST_F(RouterServiceTest, LoadCountsTheRoutersOwnRequestsInFlight) {
  Start({.policy = "least-load"});
  Worker a = StartWorker("a", grpc::Status::OK, /*hang=*/true);
  Worker b = StartWorker("b", grpc::Status::OK, /*hang=*/true);
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  ASSERT_TRUE(Register(Registration("b", b.server->address())).ok());
  v1::GenerateRequest g;
  g.set_text("first");
  OpenCall first(*gen_stub_, g);
  ASSERT_TRUE(WaitUntil([&] { return a.service->received().size() == 1; }));
  g.set_text("second");
  OpenCall second(*gen_stub_, g);  // no heartbeat in between: a still reports 0
  EXPECT_TRUE(WaitUntil([&] { return b.service->received().size() == 1; }));
  EXPECT_EQ(a.service->received().size(), 1u);
  first.CancelAndFinish();
  second.CancelAndFinish();
}

// A heartbeat's queue still counts requests that ended after it; the router takes off those it
// saw end, instead of steering around a worker that is idle by now.
TEST_F(RouterServiceTest, RequestsThatEndedSinceTheHeartbeatComeOffItsLoad) {
  Start({.policy = "prefix-affinity"});
  Worker a = StartWorker("a"), b = StartWorker("b");
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  ASSERT_TRUE(Register(Registration("b", b.server->address())).ok());
  const std::string held = Text(5);
  const std::vector<PageKey> keys = KeysOf(TinyEncoder().EncodeText(held));
  v1::HeartbeatRequest hb;
  hb.set_worker_id("a");
  hb.set_incarnation(42);
  hb.mutable_load()->set_running_requests(1);  // the request below, as a reports it
  hb.mutable_load()->set_free_pages(100);
  hb.mutable_load()->set_total_pages(100);
  for (const PageKey& k : keys) {
    hb.add_stored_page_keys(k.ToBytes());
  }
  ASSERT_TRUE(Heartbeat(hb).ok());
  v1::GenerateRequest g;
  g.set_text(held);
  const Result first = Generate(g);  // a, for its pages, although it reports a request running
  ASSERT_TRUE(first.status.ok());
  ASSERT_EQ(first.messages.back().worker_id(), "a");
  // No heartbeat since: a still reports 1 running, but that request has ended.
  g.set_text("an unrelated prompt");
  const Result second = Generate(g);
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(second.messages.back().worker_id(), "a");  // equal loads: ties go to the first id
}

TEST_F(RouterServiceTest, AFailedAttemptWithdrawsThePagesItClaimed) {
  Start({.policy = "prefix-affinity"});
  Worker a = StartWorker("a", grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  Worker b = StartWorker("b");
  ASSERT_TRUE(RegisterWithLocalTier("a", a).ok());
  ASSERT_TRUE(RegisterWithLocalTier("b", b).ok());
  v1::GenerateRequest g;
  g.set_text(Text(4));
  const Result first = Generate(g);  // a fails, retried on b
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.messages.back().worker_id(), "b");
  const Result second = Generate(g);
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(second.messages.back().worker_id(), "b");  // a's claim was withdrawn
  EXPECT_GT(second.messages.back().usage().predicted_cached_tokens(), 0u);
  EXPECT_EQ(a.service->received().size(), 1u);
}

TEST_F(RouterServiceTest, WorkerFailingBeforeOutputIsRetriedOnAnother) {
  Start({.policy = "round-robin"});
  Worker bad = StartWorker("a-bad", grpc::Status(grpc::StatusCode::UNAVAILABLE, "going away"));
  Worker good = StartWorker("b-good");
  ASSERT_TRUE(Register(Registration("a-bad", bad.server->address())).ok());
  ASSERT_TRUE(Register(Registration("b-good", good.server->address())).ok());
  v1::GenerateRequest g;
  g.set_text("hello there");
  for (int i = 0; i < 2; ++i) {  // round-robin starts on either worker; both orders must work
    const Result r = Generate(g);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.messages.back().worker_id(), "b-good");
  }
  EXPECT_GE(bad.service->received().size(), 1u);
  EXPECT_NE(registry_.Render().find("kvstrata_router_retries_total{code=\"UNAVAILABLE\"}"),
            std::string::npos);
}

TEST_F(RouterServiceTest, ClientCancellationReachesTheWorkerBeforeItsFirstToken) {
  Start({});
  Worker w = StartWorker("slow", grpc::Status::OK, /*hang=*/true);
  ASSERT_TRUE(Register(Registration("slow", w.server->address())).ok());
  v1::GenerateRequest g;
  g.set_text("hello");
  OpenCall call(*gen_stub_, g);
  ASSERT_TRUE(WaitUntil([&] { return w.service->received().size() == 1; }));
  const absl::Time cancelled_at = absl::Now();
  EXPECT_EQ(call.CancelAndFinish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitUntil([&] { return w.service->cancelled(); }));
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(2));
}

TEST_F(RouterServiceTest, DeadlineIsPassedToTheWorker) {
  Start({});
  Worker w = StartWorker("slow", grpc::Status::OK, /*hang=*/true);
  ASSERT_TRUE(Register(Registration("slow", w.server->address())).ok());
  v1::GenerateRequest g;
  g.set_text("hello");
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
  auto reader = gen_stub_->Generate(&c, g);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The worker's call ended at the same deadline.
  EXPECT_TRUE(WaitUntil([&] { return w.service->cancelled(); }));
}

TEST_F(RouterServiceTest, RequestErrorsFromTheWorkerAreNotRetried) {
  Start({.policy = "round-robin"});
  Worker a = StartWorker("a", grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "too long"));
  Worker b = StartWorker("b", grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "too long"));
  ASSERT_TRUE(Register(Registration("a", a.server->address())).ok());
  ASSERT_TRUE(Register(Registration("b", b.server->address())).ok());
  v1::GenerateRequest g;
  g.set_text("hello");
  const Result r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(a.service->received().size() + b.service->received().size(), 1u);
}

TEST_F(RouterServiceTest, AllWorkersFailingIsUnavailableNamingTheLastWorker) {
  Start({.policy = "least-load", .max_attempts = 2});
  Worker a = StartWorker("a", grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
  Worker b = StartWorker("b", grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
  Worker c = StartWorker("c", grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"));
  for (Worker* w : {&a, &b, &c}) {
    ASSERT_TRUE(Register(Registration(w == &a ? "a" : w == &b ? "b" : "c",
                                      w->server->address()))
                    .ok());
  }
  v1::GenerateRequest g;
  g.set_text("hello");
  const Result r = Generate(g);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(r.status.error_message().find("queue full"), std::string::npos);
  EXPECT_EQ(a.service->received().size() + b.service->received().size() +
                c.service->received().size(),
            2u);  // max_attempts
}

}  // namespace
}  // namespace kvstrata::router
