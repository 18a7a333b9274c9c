// The router's picture of a kvstore node against a real kvstore service in process: a node
// that restarts (empty, on the same address) or stays unreachable must not keep drawing
// requests for pages it no longer holds.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/metrics.h"
#include "rpc/server.h"
#include "services/kvstore/kvstore_service.h"
#include "services/kvstore/page_store.h"
#include "services/router/router_service.h"
#include "tests/services/router_test_util.h"
#include "tests/services/test_pages.h"
#include "tests/testing/wait_until.h"

namespace kvstrata::router {
namespace {

using kvstore::testing::MakeChain;
using kvstore::testing::TestPage;
using test::TinyEncoder;
using test_util::WaitUntil;

// One kvstore process's worth: a page store, its service and a server on `address`.
struct StoreNode {
  std::unique_ptr<kvstore::PageStore> store;
  std::unique_ptr<kvstore::KvStoreService> service;
  std::unique_ptr<rpc::Server> server;

  StoreNode(const std::string& address, const std::vector<TestPage>& pages,
            MetricsRegistry* registry, const Clock* clock) {
    kvstore::PageStoreOptions options;
    options.capacity_bytes = 64 << 20;
    store = std::make_unique<kvstore::PageStore>(options, clock);
    for (const TestPage& p : pages) {
      absl::StatusOr<kvstore::PutResult> put = store->Put(p.meta, p.bytes);
      EXPECT_TRUE(put.ok()) << put.status();
    }
    service = std::make_unique<kvstore::KvStoreService>(
        store.get(), kvstore::KvStoreServiceOptions{.store_id = "watched"}, registry);
    absl::StatusOr<std::unique_ptr<rpc::Server>> s =
        rpc::Server::Start({.listen_address = address, .services = {service.get()}});
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server = *std::move(s);
  }
  ~StoreNode() {
    if (server) server->Shutdown(absl::ZeroDuration());
  }
};

std::vector<PageKey> KeysOf(const std::vector<TestPage>& pages) {
  std::vector<PageKey> keys;
  for (const TestPage& p : pages) keys.push_back(p.meta.key);
  return keys;
}

class RouterKvStoreWatchTest : public ::testing::Test {
 protected:
  void StartRouter(const std::string& store_address, absl::Duration forget_after) {
    RouterOptions options;
    options.policy = "prefix-affinity";
    options.log_requests = false;
    options.kvstore_addresses = {store_address};
    options.kvstore_forget_after = forget_after;
    absl::StatusOr<std::unique_ptr<Router>> r =
        Router::Create(TinyEncoder(), options, &router_registry_);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
  }

  int64_t NodePages(const std::vector<PageKey>& keys, const std::string& node) {
    return router_->prefix_index().Match(keys).StoreNodePages(node);
  }

  std::string Resets(const char* reason) {
    return absl::StrCat("kvstrata_router_kvstore_index_resets_total{reason=\"", reason, "\"} ");
  }
  bool Rendered(const std::string& line) {
    return router_registry_.Render().find(line) != std::string::npos;
  }

  SystemClock clock_;
  MetricsRegistry store_registry_, router_registry_;
  std::unique_ptr<Router> router_;
};

TEST_F(RouterKvStoreWatchTest, ARestartedNodesSnapshotReplacesWhatTheIndexHeld) {
  const std::vector<TestPage> before = MakeChain({1, 2, 3}), after = MakeChain({7});
  auto node = std::make_unique<StoreNode>("127.0.0.1:0", before, &store_registry_, &clock_);
  const std::string address = node->server->address();
  StartRouter(address, absl::ZeroDuration());  // never forget for being unreachable
  ASSERT_TRUE(WaitUntil([&] { return NodePages(KeysOf(before), address) == 3; }));
  EXPECT_TRUE(Rendered(Resets("resync") + "0"));

  // The node restarts on the same address holding another chain only.
  node.reset();
  MetricsRegistry restarted_registry;
  node = std::make_unique<StoreNode>(address, after, &restarted_registry, &clock_);
  ASSERT_NE(node->server, nullptr);
  ASSERT_TRUE(WaitUntil([&] {
    return NodePages(KeysOf(after), address) == 1 && NodePages(KeysOf(before), address) == 0;
  })) << "pages before the restart: " << NodePages(KeysOf(before), address);
  EXPECT_TRUE(Rendered(Resets("resync") + "1")) << router_registry_.Render();
  EXPECT_TRUE(Rendered(Resets("unreachable") + "0"));
  node.reset();
  router_.reset();
}

TEST_F(RouterKvStoreWatchTest, AnUnreachableNodesPagesAreForgottenAfterTheGrace) {
  const std::vector<TestPage> pages = MakeChain({4, 5});
  auto node = std::make_unique<StoreNode>("127.0.0.1:0", pages, &store_registry_, &clock_);
  const std::string address = node->server->address();
  StartRouter(address, absl::Seconds(2));
  ASSERT_TRUE(WaitUntil([&] { return NodePages(KeysOf(pages), address) == 2; }));

  const absl::Time down = absl::Now();
  node.reset();
  // Within the grace the pages stay (a short outage should not reshuffle routing).
  EXPECT_EQ(NodePages(KeysOf(pages), address), 2);
  ASSERT_TRUE(WaitUntil([&] { return NodePages(KeysOf(pages), address) == 0; },
                        absl::Seconds(15)));
  EXPECT_GE(absl::Now() - down, absl::Seconds(1.5));
  EXPECT_TRUE(Rendered(Resets("unreachable") + "1")) << router_registry_.Render();

  // Back with the same pages: its snapshot restores them, and no second reset is counted.
  MetricsRegistry back_registry;
  node = std::make_unique<StoreNode>(address, pages, &back_registry, &clock_);
  ASSERT_TRUE(WaitUntil([&] { return NodePages(KeysOf(pages), address) == 2; },
                        absl::Seconds(15)));
  EXPECT_TRUE(Rendered(Resets("resync") + "0")) << router_registry_.Render();
  node.reset();
  router_.reset();
}

}  // namespace
}  // namespace kvstrata::router
