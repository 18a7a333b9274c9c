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
  return Key(n).ToBytes();
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
  o.worker.set_same_gpu_uuid("GPU-test");  // what a worker with the same-GPU transport sends
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
  EXPECT_EQ(first.same_gpu_uuid(), "GPU-test");
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
  EXPECT_EQ(again.same_gpu_uuid(), "GPU-test");  // a registration again still names the GPU
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

// Two routers behind one name (a headless Service): the worker registers with both, with one
// incarnation, and each router gets every local page change through its own journal; a router
// that leaves the name is dropped, one that joins is registered with.
TEST(RouterRegistrationsTest, RegistersWithEveryRouterANameResolvesTo) {
  std::unique_ptr<Router> a = StartRouter();
  std::unique_ptr<Router> b = StartRouter();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::mutex mu;
  std::vector<std::string> behind_name = {a->server->address(), b->server->address()};
  RouterRegistrationsOptions o;
  o.routers = {"routers.test:50070"};
  o.registration = Options("");
  o.resolve_interval = absl::Milliseconds(50);
  o.resolve = [&](const std::string& name) -> absl::StatusOr<std::vector<std::string>> {
    EXPECT_EQ(name, "routers.test:50070");
    std::lock_guard<std::mutex> lock(mu);
    return behind_name;
  };
  LocalPageCache cache({.capacity_bytes = 1000});
  RouterRegistrations registrations(o, &cache, Load);
  for (Router* r : {a.get(), b.get()}) {
    ASSERT_TRUE(r->registry.WaitFor([](auto& reg, auto& h) { return !reg.empty() && !h.empty(); }));
    EXPECT_EQ(r->registry.registers()[0].incarnation(), registrations.incarnation());
  }
  cache.PutChain(Chain({7}));
  for (Router* r : {a.get(), b.get()}) {
    ASSERT_TRUE(r->registry.WaitFor([](auto&, auto& h) {
      return std::any_of(h.begin(), h.end(), [](const v1::HeartbeatRequest& beat) {
        return Has(beat.stored_page_keys(), 7);
      });
    })) << "a router missed the change";
  }

  {
    std::lock_guard<std::mutex> lock(mu);
    behind_name = {a->server->address()};
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (registrations.Addresses().size() != 1 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(registrations.Addresses(), std::vector<std::string>{a->server->address()});

  registrations.Drain();
  ASSERT_FALSE(a->registry.heartbeats().empty());
  EXPECT_TRUE(a->registry.heartbeats().back().load().draining());
}

TEST(RouterRegistrationsTest, ANameThatFailsToResolveKeepsItsRouters) {
  std::unique_ptr<Router> a = StartRouter();
  ASSERT_NE(a, nullptr);
  std::atomic<bool> dns_down{false};
  RouterRegistrationsOptions o;
  o.routers = {"routers.test:50070"};
  o.registration = Options("");
  o.resolve_interval = absl::Milliseconds(20);
  o.resolve = [&](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
    if (dns_down) return absl::UnavailableError("no DNS");
    return std::vector<std::string>{a->server->address()};
  };
  RouterRegistrations registrations(o, nullptr, Load);
  ASSERT_TRUE(a->registry.WaitFor([](auto& reg, auto&) { return !reg.empty(); }));
  dns_down = true;
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(registrations.Addresses(), std::vector<std::string>{a->server->address()});
}

TEST(ResolveAllTest, LiteralsResolveToThemselvesAndBadEntriesAreErrors) {
  absl::StatusOr<std::vector<std::string>> v4 = ResolveAll("127.0.0.1:50070");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(*v4, std::vector<std::string>{"127.0.0.1:50070"});
  absl::StatusOr<std::vector<std::string>> v6 = ResolveAll("[::1]:50070");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(*v6, std::vector<std::string>{"[::1]:50070"});
  EXPECT_EQ(ResolveAll("no-port").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ResolveAll("name.invalid:1").ok());
}

}  // namespace
}  // namespace kvstrata::decode
