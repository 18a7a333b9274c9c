// RouterRegistration against an in-process fake WorkerRegistry (tests/services/
// decode_fake_registry.h): registration fields, heartbeats with load and local key changes,
// NOT_FOUND and an unreachable router, and the draining heartbeat.

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/server.h"
#include "services/decode/registration.h"
#include "tests/services/decode_fake_registry.h"

namespace kvstrata::decode {
namespace {

PageKey Key(uint8_t n) {
  PageKey k;
  k.bytes[0] = n;
  return k;
}

std::string KeyBytes(uint8_t n) {
  const PageKey k = Key(n);
  return std::string(reinterpret_cast<const char*>(k.bytes.data()), k.bytes.size());
}

std::vector<LocalPage> Chain(std::initializer_list<uint8_t> ids) {
  std::vector<LocalPage> chain;
  for (uint8_t id : ids) chain.push_back({.key = Key(id), .int2 = true, .bytes = "page"});
  return chain;
}

bool Has(const google::protobuf::RepeatedPtrField<std::string>& keys, uint8_t n) {
  return std::find(keys.begin(), keys.end(), KeyBytes(n)) != keys.end();
}

struct Router {
  FakeWorkerRegistry registry;
  std::unique_ptr<rpc::Server> server;
};

std::unique_ptr<Router> StartRouter() {
  auto r = std::make_unique<Router>();
  absl::StatusOr<std::unique_ptr<rpc::Server>> server =
      rpc::Server::Start({.listen_address = "127.0.0.1:0", .services = {&r->registry}});
  if (!server.ok()) return nullptr;
  r->server = *std::move(server);
  return r;
}

RouterRegistrationOptions Options(const std::string& router) {
  RouterRegistrationOptions o;
  o.router_address = router;
  o.initial_interval = absl::Milliseconds(50);
  o.rpc_deadline = absl::Milliseconds(500);
  o.worker.set_worker_id("w-test");
  o.worker.set_address("127.0.0.1:5555");
  o.worker.set_model("m");
  o.worker.set_model_fingerprint("f");
  o.worker.set_capacity_pages(100);
  o.worker.set_max_running_requests(8);
  o.worker.set_server_version("0.1.0");
  return o;
}

WorkerLoadSample Load() {
  return {.running_requests = 2,
          .waiting_requests = 1,
          .free_pages = 10,
          .total_pages = 20,
          .generated_tokens = 0,
          .prefilled_tokens = 0};
}

TEST(RouterRegistrationTest, RegistersHeartbeatsKeyChangesReregistersAndDrains) {
  std::unique_ptr<Router> router = StartRouter();
  ASSERT_NE(router, nullptr);
  LocalPageCache cache({.capacity_bytes = 1000});
  cache.PutChain(Chain({1, 2}));
  RouterRegistration registration(Options(router->server->address()), &cache, Load);

  ASSERT_TRUE(router->registry.WaitFor([](auto& r, auto& h) { return !r.empty() && !h.empty(); }));
  const v1::RegisterWorkerRequest first = router->registry.registers()[0];
  EXPECT_EQ(first.worker_id(), "w-test");
  EXPECT_EQ(first.address(), "127.0.0.1:5555");
  EXPECT_NE(first.incarnation(), 0u);
  EXPECT_EQ(first.incarnation(), registration.incarnation());
  EXPECT_EQ(first.local_page_keys_size(), 2);
  EXPECT_TRUE(Has(first.local_page_keys(), 1));
  EXPECT_TRUE(Has(first.local_page_keys(), 2));
  const v1::HeartbeatRequest beat = router->registry.heartbeats()[0];
  EXPECT_EQ(beat.worker_id(), "w-test");
  EXPECT_EQ(beat.incarnation(), first.incarnation());
  EXPECT_EQ(beat.load().running_requests(), 2u);
  EXPECT_EQ(beat.load().waiting_requests(), 1u);
  EXPECT_EQ(beat.load().free_pages(), 10u);
  EXPECT_EQ(beat.load().total_pages(), 20u);
  EXPECT_FALSE(beat.load().draining());
  EXPECT_EQ(beat.stored_page_keys_size(), 0);  // the snapshot covered 1 and 2

  cache.PutChain(Chain({3}));
  ASSERT_TRUE(router->registry.WaitFor([](auto&, auto& h) {
    return std::any_of(h.begin(), h.end(),
                       [](const v1::HeartbeatRequest& b) { return Has(b.stored_page_keys(), 3); });
  }));

  router->registry.FailHeartbeatsWithNotFound(1);
  ASSERT_TRUE(router->registry.WaitFor([](auto& r, auto&) { return r.size() >= 2; }));
  const v1::RegisterWorkerRequest again = router->registry.registers()[1];
  EXPECT_EQ(again.incarnation(), first.incarnation());
  EXPECT_EQ(again.local_page_keys_size(), 3);
  EXPECT_TRUE(Has(again.local_page_keys(), 3));

  registration.Drain();
  const std::vector<v1::HeartbeatRequest> beats = router->registry.heartbeats();
  ASSERT_FALSE(beats.empty());
  EXPECT_TRUE(beats.back().load().draining());
  EXPECT_EQ(registration.registrations(), 2);
}

TEST(RouterRegistrationTest, UnavailableRouterIsRetriedAndChangesOfFailedHeartbeatsAreKept) {
  std::unique_ptr<Router> router = StartRouter();
  ASSERT_NE(router, nullptr);
  router->registry.FailCallsWithUnavailable(2);  // the first two RegisterWorker calls
  LocalPageCache cache({.capacity_bytes = 1000});
  RouterRegistration registration(Options(router->server->address()), &cache, Load);
  ASSERT_TRUE(router->registry.WaitFor([](auto& r, auto& h) { return !r.empty() && !h.empty(); }));
  EXPECT_EQ(router->registry.registers().size(), 1u);

  router->registry.FailCallsWithUnavailable(1);  // the next heartbeat fails
  cache.PutChain(Chain({5}));
  ASSERT_TRUE(router->registry.WaitFor([](auto&, auto& h) {
    return std::any_of(h.begin(), h.end(),
                       [](const v1::HeartbeatRequest& b) { return Has(b.stored_page_keys(), 5); });
  }));
  EXPECT_GE(router->registry.failed_heartbeats().size(), 1u);
  EXPECT_EQ(registration.registrations(), 1);
}

TEST(RouterRegistrationTest, NoRouterNeverBlocksAndDrainReturnsPromptly) {
  // A port nothing listens on: bind one, note it, let it go.
  std::string address;
  {
    std::unique_ptr<Router> gone = StartRouter();
    ASSERT_NE(gone, nullptr);
    address = gone->server->address();
    gone->server->Shutdown(absl::ZeroDuration());
    gone->server->Wait();
  }
  LocalPageCache cache({.capacity_bytes = 1000});
  RouterRegistration registration(Options(address), &cache, Load);
  absl::SleepFor(absl::Milliseconds(200));  // a few failing ticks
  cache.PutChain(Chain({1}));               // the tier works on regardless
  EXPECT_TRUE(cache.Contains(Key(1)));
  const absl::Time start = absl::Now();
  registration.Drain();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(registration.registrations(), 0);
}

}  // namespace
}  // namespace kvstrata::decode
