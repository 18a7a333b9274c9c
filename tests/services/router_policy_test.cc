// The router's policy library: worker table expiry, the prefix index, and each routing policy on
// constructed loads and prefixes (the shared-prefix simulation is router_simulation_test.cc).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "core/radix_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/policy.h"
#include "services/router/prefix_index.h"
#include "services/router/worker_table.h"
#include "tests/services/router_policy_testing.h"
#include "tests/testing/fake_clock.h"

namespace kvstrata::router {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using ::kvstrata::test_util::FakeClock;
using namespace ::kvstrata::router::test;  // NOLINT: the shared helpers

std::vector<std::string> Ids(const std::vector<WorkerInfo>& workers) {
  std::vector<std::string> ids;
  for (const WorkerInfo& w : workers) ids.push_back(w.id);
  return ids;
}

// --- WorkerTable ---

TEST(WorkerTableTest, DropsWorkersSilentForMoreThanMaxMissedIntervals) {
  FakeClock clock;
  WorkerTable table({/*heartbeat_interval=*/absl::Seconds(1), /*max_missed_heartbeats=*/3}, &clock);
  ASSERT_TRUE(table.Register("a", "a:1", {1, 0, 10, 10}).ok());
  ASSERT_TRUE(table.Register("b", "b:1", {}).ok());
  ASSERT_TRUE(table.AddStatic("s", "s:1").ok());

  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(table.Heartbeat("a", {2, 1, 5, 10}).ok());
  clock.Advance(absl::Seconds(1));  // b silent exactly 3 s: still alive
  EXPECT_THAT(Ids(table.Snapshot()), ElementsAre("a", "b", "s"));

  clock.Advance(absl::Milliseconds(1));  // b silent 3.001 s: dropped
  EXPECT_THAT(table.ExpireStale(), ElementsAre("b"));
  const std::vector<WorkerInfo> live = table.Snapshot();
  ASSERT_THAT(Ids(live), ElementsAre("a", "s"));
  EXPECT_EQ(live[0].load.running, 2);
  EXPECT_EQ(live[0].load.requests(), 3);

  EXPECT_EQ(table.Heartbeat("b", {}).code(), absl::StatusCode::kNotFound);
  clock.Advance(absl::Seconds(100));  // static workers never expire
  EXPECT_THAT(Ids(table.Snapshot()), ElementsAre("s"));
  ASSERT_TRUE(table.Register("b", "b:2", {}).ok());  // re-registration brings it back
  EXPECT_THAT(Ids(table.Snapshot()), ElementsAre("b", "s"));
}

TEST(WorkerTableTest, TrafficFromAWorkerCountsAsAHeartbeatButKeepsItsLoad) {
  FakeClock clock;
  WorkerTable table({/*heartbeat_interval=*/absl::Seconds(1), /*max_missed_heartbeats=*/3}, &clock);
  ASSERT_TRUE(table.Register("busy", "busy:1", {4, 2, 10, 10}).ok());
  ASSERT_TRUE(table.Register("idle", "idle:1", {}).ok());
  clock.Advance(absl::Seconds(2));
  table.Touch("busy");     // it streamed a message: alive, though its heartbeat is late
  table.Touch("unknown");  // no effect
  clock.Advance(absl::Seconds(2));
  EXPECT_THAT(table.ExpireStale(), ElementsAre("idle"));
  const std::vector<WorkerInfo> live = table.Snapshot();
  ASSERT_THAT(Ids(live), ElementsAre("busy"));
  EXPECT_EQ(live[0].load.requests(), 6);
  clock.Advance(absl::Seconds(2));  // silent 4 s since the touch
  EXPECT_THAT(table.ExpireStale(), ElementsAre("busy"));
}

TEST(WorkerTableTest, RejectsBadRegistrations) {
  FakeClock clock;
  WorkerTable table({}, &clock);
  EXPECT_EQ(table.Register("", "x:1", {}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.Register("x", "", {}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(table.AddStatic("x", "x:1").ok());
  EXPECT_EQ(table.AddStatic("x", "x:2").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(table.Remove("x"));
  EXPECT_FALSE(table.Remove("x"));
  EXPECT_EQ(table.size(), 0u);
}

// --- PrefixIndex ---

TEST(PrefixIndexTest, LongestLeadingMatchPerHolder) {
  PrefixIndex index;
  const std::vector<PageKey> req = Chain(1, 6);
  index.OnWorkerStored("w1", std::span(req).first(4));
  // w2 holds pages 0, 1 and 3 but not 2: its match stops at 2.
  index.OnWorkerStored("w2", std::span(req).first(2));
  index.OnWorkerStored("w2", std::span(req).subspan(3, 1));
  index.OnStoreStored(std::span(req).first(5));
  index.OnWorkerStored("w3", Chain(2, 3));  // another chain

  PrefixMatch m = index.Match(req);
  EXPECT_THAT(m.worker_pages, UnorderedElementsAre(Pair("w1", 4), Pair("w2", 2)));
  EXPECT_EQ(m.store_pages, 5);
  EXPECT_EQ(m.WorkerPages("w3"), 0);

  // A chain whose first page nobody holds matches nothing, whatever follows.
  std::vector<PageKey> skewed = {Key(9, 0), req[1], req[2]};
  EXPECT_THAT(index.Match(skewed).worker_pages, IsEmpty());
  EXPECT_EQ(index.Match({}).store_pages, 0);
}

TEST(PrefixIndexTest, RemovalAndForgettingAWorker) {
  PrefixIndex index;
  const std::vector<PageKey> req = Chain(1, 4);
  index.OnWorkerStored("w1", req);
  index.OnWorkerStored("w2", req);
  index.OnStoreStored(req);
  index.OnWorkerRemoved("w1", std::span(req).subspan(1, 1));
  index.OnWorkerRemoved("w1", std::span(req).subspan(1, 1));  // idempotent
  index.OnWorkerRemoved("nobody", req);
  index.OnStoreRemoved(std::span(req).subspan(2));

  PrefixMatch m = index.Match(req);
  EXPECT_THAT(m.worker_pages, UnorderedElementsAre(Pair("w1", 1), Pair("w2", 4)));
  EXPECT_EQ(m.store_pages, 2);

  index.ForgetWorker("w2");
  m = index.Match(req);
  EXPECT_THAT(m.worker_pages, UnorderedElementsAre(Pair("w1", 1)));
  // Keys nobody holds any more are gone: w1 keeps 0, 2, 3; the store keeps 0, 1.
  EXPECT_EQ(index.size(), 4u);
}

TEST(PrefixIndexTest, KeepsEachKvstoreNodesPagesApart) {
  PrefixIndex index;
  const std::vector<PageKey> req = Chain(1, 6);
  index.OnStoreStored("kv-a", std::span(req).first(5));
  index.OnStoreStored("kv-b", std::span(req).first(3));
  index.OnStoreStored("kv-b", Chain(2, 4));
  PrefixMatch m = index.Match(req);
  EXPECT_EQ(m.store_pages, 5);
  EXPECT_THAT(m.store_node_pages, UnorderedElementsAre(Pair("kv-a", 5), Pair("kv-b", 3)));
  EXPECT_THAT(m.worker_pages, IsEmpty());
  EXPECT_EQ(m.StoreNodePages(""), 0);
  EXPECT_EQ(m.StoreNodePages("kv-c"), 0);

  // Removal on one node leaves the other's copy, and the store as a whole still holds it.
  index.OnStoreRemoved("kv-a", std::span(req).subspan(1));
  index.OnStoreRemoved("kv-c", req);  // an unknown node: a no-op
  m = index.Match(req);
  EXPECT_EQ(m.store_pages, 3);
  EXPECT_THAT(m.store_node_pages, UnorderedElementsAre(Pair("kv-a", 1), Pair("kv-b", 3)));

  // A chain split over two nodes: the store as a whole holds its leading run (any worker can
  // fetch from either node); each node only the part it holds from page 0.
  PrefixIndex split;
  split.OnStoreStored("kv-a", std::span(req).first(2));
  split.OnStoreStored("kv-b", std::span(req).subspan(2, 2));
  m = split.Match(req);
  EXPECT_EQ(m.store_pages, 4);
  EXPECT_THAT(m.store_node_pages, UnorderedElementsAre(Pair("kv-a", 2)));
}

TEST(PrefixIndexTest, ForgetsLeastRecentlyUsedChainsFromTheLeaves) {
  PrefixIndex index({/*max_keys=*/4});
  index.OnWorkerStored("w", Chain(1, 3));
  index.OnWorkerStored("w", Chain(2, 3));  // 6 keys > 4: chain 1's two last pages go
  EXPECT_EQ(index.size(), 4u);
  EXPECT_EQ(index.Match(Chain(1, 3)).WorkerPages("w"), 1);
  EXPECT_EQ(index.Match(Chain(2, 3)).WorkerPages("w"), 3);

  // Matching chain 1 made its first page the most recent; a new chain evicts chain 2's leaves.
  index.Match(Chain(1, 3));
  index.OnWorkerStored("w", Chain(3, 2));
  EXPECT_EQ(index.Match(Chain(1, 3)).WorkerPages("w"), 1);
  EXPECT_EQ(index.Match(Chain(2, 3)).WorkerPages("w"), 1);
  EXPECT_EQ(index.Match(Chain(3, 2)).WorkerPages("w"), 2);
}

// --- Policies ---

TEST(RoutingPolicyTest, FactoryAndErrors) {
  for (const std::string& name : RoutingPolicyNames()) EXPECT_EQ(Make(name)->name(), name);
  auto unknown = MakeRoutingPolicy("random");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), testing::HasSubstr("prefix-affinity"));
  RoutingPolicyOptions bad;
  bad.prefix_affinity.load_bound = 0.9;
  EXPECT_EQ(MakeRoutingPolicy("prefix-affinity", bad).status().code(),
            absl::StatusCode::kInvalidArgument);

  PrefixIndex index;
  const std::vector<PageKey> keys = Chain(1, 2);
  for (const std::string& name : RoutingPolicyNames()) {
    auto policy = Make(name);
    EXPECT_EQ(policy->Route(Request(keys), {}, index).status().code(),
              absl::StatusCode::kUnavailable)
        << name;
    const std::vector<WorkerInfo> one = {Worker("a", 0)};
    RouteRequest short_prompt = Request(keys, /*extra_tokens=*/-1);
    EXPECT_EQ(policy->Route(short_prompt, one, index).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

TEST(RoutingPolicyTest, RoundRobinCycles) {
  PrefixIndex index;
  auto policy = Make("round-robin");
  const std::vector<WorkerInfo> workers = {Worker("a", 9), Worker("b", 0), Worker("c", 0)};
  const std::vector<PageKey> keys = Chain(1, 1);
  std::vector<std::string> picked;
  for (int i = 0; i < 6; ++i) {
    auto d = policy->Route(Request(keys), workers, index);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->reason, RouteReason::kRoundRobin);
    picked.push_back(d->worker_id);
  }
  EXPECT_THAT(picked, ElementsAre("a", "b", "c", "a", "b", "c"));
}

TEST(RoutingPolicyTest, LeastLoadPicksTheIdleOneTiesByFreePages) {
  PrefixIndex index;
  auto policy = Make("least-load");
  const std::vector<PageKey> keys = Chain(1, 2);
  index.OnWorkerStored("a", keys);  // cache is ignored
  std::vector<WorkerInfo> workers = {Worker("a", 2, 1), Worker("b", 0, 0, /*free_pages=*/10),
                                     Worker("c", 0, 0, /*free_pages=*/50)};
  auto d = policy->Route(Request(keys), workers, index);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->worker_id, "c");
  EXPECT_EQ(d->reason, RouteReason::kLeastLoad);
  EXPECT_EQ(d->local_pages, 0);

  workers[1].load.waiting = 0;
  workers[2].load.waiting = 1;
  EXPECT_EQ(policy->Route(Request(keys), workers, index)->worker_id, "b");
}

TEST(RoutingPolicyTest, CacheAwareReproducesSglangRegimes) {
  PrefixIndex index;
  auto policy = Make("cache-aware");
  const std::vector<PageKey> keys = Chain(1, 4);        // 256 tokens
  index.OnWorkerStored("a", std::span(keys).first(2));  // ratio 0.5 on a

  auto route = [&](int64_t qa, int64_t qb) {
    const std::vector<WorkerInfo> workers = {Worker("a", qa, 0, 10), Worker("b", qb, 0, 90)};
    auto d = policy->Route(Request(keys), workers, index);
    EXPECT_TRUE(d.ok()) << d.status();
    return *d;
  };
  // Imbalanced: 100 − 30 = 70 > 64 and 100 > 1.5 × 30 → shortest queue despite the match.
  RouteDecision d = route(100, 30);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.reason, RouteReason::kLoadBalance);
  // 100 − 36 = 64, not > 64: balanced → the best match.
  d = route(100, 36);
  EXPECT_EQ(d.worker_id, "a");
  EXPECT_EQ(d.reason, RouteReason::kAffinity);
  EXPECT_EQ(d.local_pages, 2);
  // 300 − 230 = 70 > 64 but 300 < 1.5 × 230: balanced → the best match.
  EXPECT_EQ(route(300, 230).worker_id, "a");
  // 195 − 130 = 65 > 64 but 195 = 1.5 × 130 exactly, not more: balanced; 196 tips it.
  EXPECT_EQ(route(195, 130).worker_id, "a");
  EXPECT_EQ(route(196, 130).worker_id, "b");

  // Below the cache threshold (1 of 4 pages: 0.25 ≤ 0.3) → the smallest cache (b: most free).
  PrefixIndex low;
  low.OnWorkerStored("a", std::span(keys).first(1));
  const std::vector<WorkerInfo> workers = {Worker("a", 0, 0, 10), Worker("b", 5, 0, 90)};
  d = *policy->Route(Request(keys), workers, low);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.reason, RouteReason::kSmallestCache);
  // 1 of 3 pages: 0.33 > 0.3 → a.
  const std::vector<PageKey> three(keys.begin(), keys.begin() + 3);
  EXPECT_EQ(policy->Route(Request(three), workers, low)->worker_id, "a");
}

TEST(RoutingPolicyTest, PrefixAffinitySendsToHolderUntilBoundedLoad) {
  PrefixIndex index;
  auto policy = Make("prefix-affinity");
  const std::vector<PageKey> keys = Chain(1, 4);
  index.OnWorkerStored("b", keys);

  std::vector<WorkerInfo> workers = {Worker("a", 2), Worker("b", 2), Worker("c", 2),
                                     Worker("d", 2)};
  // m = 8: capacity ⌈1.25 × 9 / 4⌉ = 3, b at 2 fits.
  RouteDecision d = *policy->Route(Request(keys), workers, index);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.reason, RouteReason::kAffinity);
  EXPECT_EQ(d.local_pages, 4);
  EXPECT_EQ(d.store_pages, 0);

  workers[1].load.running = 3;  // m = 9: capacity ⌈1.25 × 10 / 4⌉ = 4, b + 1 = 4 fits
  EXPECT_EQ(policy->Route(Request(keys), workers, index)->worker_id, "b");

  workers[1].load.running = 4;  // m = 10: capacity ⌈1.25 × 11 / 4⌉ = 4, b + 1 = 5 does not
  d = *policy->Route(Request(keys), workers, index);
  EXPECT_EQ(d.worker_id, "a");
  EXPECT_EQ(d.reason, RouteReason::kLoadBalance);
  EXPECT_EQ(d.local_pages, 0);

  // A looser bound lets b take it.
  RoutingPolicyOptions loose;
  loose.prefix_affinity.load_bound = 2.0;
  EXPECT_EQ(Make("prefix-affinity", loose)->Route(Request(keys), workers, index)->worker_id, "b");

  // No match anywhere → the least loaded.
  workers[2].load.running = 0;
  d = *policy->Route(Request(Chain(7, 4)), workers, index);
  EXPECT_EQ(d.worker_id, "c");
  EXPECT_EQ(d.reason, RouteReason::kLeastLoad);
}

TEST(RoutingPolicyTest, PrefixAffinityDiscountsWhatTheKvstoreHolds) {
  auto policy = Make("prefix-affinity");
  const std::vector<PageKey> keys = Chain(1, 4);
  const std::vector<WorkerInfo> workers = {Worker("a", 2), Worker("b", 3), Worker("c", 2),
                                           Worker("d", 2)};
  // Only b holds the prefix: worth a slightly busier worker.
  PrefixIndex local_only;
  local_only.OnWorkerStored("b", keys);
  RouteDecision d = *policy->Route(Request(keys), workers, local_only);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.reason, RouteReason::kAffinity);

  // The kvstore holds it too: any worker fetches it for r = 0.1 of the compute, so b's edge
  // (0.4 pages of 4) no longer pays for its extra queue; the prediction counts the fetch.
  PrefixIndex with_store;
  with_store.OnWorkerStored("b", keys);
  with_store.OnStoreStored(keys);
  d = *policy->Route(Request(keys), workers, with_store);
  EXPECT_EQ(d.worker_id, "a");
  EXPECT_EQ(d.reason, RouteReason::kLeastLoad);
  EXPECT_EQ(d.local_pages, 0);
  EXPECT_EQ(d.store_pages, 4);
  EXPECT_EQ(d.PredictedCachedPages(), 4);

  // With fetching as dear as computing (r = 1) the store no longer helps: back to b.
  RoutingPolicyOptions dear;
  dear.prefix_affinity.fetch_cost_ratio = 1.0;
  EXPECT_EQ(Make("prefix-affinity", dear)->Route(Request(keys), workers, with_store)->worker_id,
            "b");
}

// Workers on the GPUs of kvstore nodes kv-a and kv-b (one each), and one on neither.
std::vector<WorkerInfo> ColocatedWorkers(int64_t qa, int64_t qb, int64_t qc) {
  std::vector<WorkerInfo> workers = {Worker("a", qa), Worker("b", qb), Worker("c", qc)};
  workers[0].colocated_kvstore = "kv-a";
  workers[1].colocated_kvstore = "kv-b";
  return workers;
}

TEST(RoutingPolicyTest, PrefixAffinityPrefersTheWorkerOnTheNodeHoldingThePrefix) {
  auto policy = Make("prefix-affinity");
  const std::vector<PageKey> on_b = Chain(1, 8), on_a = Chain(2, 8);
  PrefixIndex index;
  index.OnStoreStored("kv-b", on_b);
  index.OnStoreStored("kv-a", on_a);
  const std::vector<WorkerInfo> workers = ColocatedWorkers(2, 2, 2);

  // Equal load: the prefix on kv-b goes to b, the one on kv-a to a, the node's pages counted.
  RouteDecision d = *policy->Route(Request(on_b, 10), workers, index);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.reason, RouteReason::kColocated);
  EXPECT_EQ(d.local_pages, 0);
  EXPECT_EQ(d.store_pages, 8);
  EXPECT_EQ(d.colocated_store_pages, 8);
  d = *policy->Route(Request(on_a, 10), workers, index);
  EXPECT_EQ(d.worker_id, "a");
  EXPECT_EQ(d.colocated_store_pages, 8);

  // The preference is r − r_c = 0.09 of the prompt's share in the store; one more request on b
  // (a relative load penalty of 0.5 × 1 / 2.33) outweighs it, as load did before.
  d = *policy->Route(Request(on_b, 10), ColocatedWorkers(2, 3, 2), index);
  EXPECT_EQ(d.worker_id, "a");
  EXPECT_EQ(d.colocated_store_pages, 0);
  EXPECT_EQ(d.store_pages, 8);

  // r_c = r: a co-located page costs what any fetch does; the tie goes by id, as without it.
  RoutingPolicyOptions flat;
  flat.prefix_affinity.colocated_fetch_cost_ratio = flat.prefix_affinity.fetch_cost_ratio;
  EXPECT_EQ(Make("prefix-affinity", flat)->Route(Request(on_b, 10), workers, index)->worker_id,
            "a");

  // The other policies choose as before but report the co-located pages of their choice.
  std::vector<WorkerInfo> b_idle = ColocatedWorkers(2, 0, 2);
  d = *Make("least-load")->Route(Request(on_b), b_idle, index);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.colocated_store_pages, 8);
  EXPECT_EQ(d.reason, RouteReason::kLeastLoad);
}

TEST(RoutingPolicyTest, PrefixAffinityLocalHitStillBeatsTheColocatedNode) {
  auto policy = Make("prefix-affinity");
  const std::vector<PageKey> keys = Chain(1, 8);
  PrefixIndex index;
  index.OnStoreStored("kv-b", keys);
  index.OnWorkerStored("c", keys);  // c, on no node's GPU, holds the whole prefix itself
  RouteDecision d = *policy->Route(Request(keys, 10), ColocatedWorkers(2, 2, 2), index);
  EXPECT_EQ(d.worker_id, "c");
  EXPECT_EQ(d.reason, RouteReason::kAffinity);
  EXPECT_EQ(d.local_pages, 8);
  EXPECT_EQ(d.store_pages, 0);
  EXPECT_EQ(d.colocated_store_pages, 0);

  // b holding some pages itself and fetching the rest from its node predicts both.
  index.OnWorkerStored("b", std::span(keys).first(3));
  index.OnWorkerRemoved("c", keys);
  d = *policy->Route(Request(keys, 10), ColocatedWorkers(2, 2, 2), index);
  EXPECT_EQ(d.worker_id, "b");
  EXPECT_EQ(d.reason, RouteReason::kAffinity);
  EXPECT_EQ(d.local_pages, 3);
  EXPECT_EQ(d.store_pages, 5);
  EXPECT_EQ(d.colocated_store_pages, 5);
}

TEST(RoutingPolicyTest, PrefixAffinityWithoutColocationChoosesAsBefore) {
  auto policy = Make("prefix-affinity");
  const std::vector<PageKey> keys = Chain(1, 8);
  // The same pages in a store of one unnamed node (today's view) and on node kv-b.
  PrefixIndex unnamed, per_node;
  unnamed.OnStoreStored(keys);
  per_node.OnStoreStored("kv-b", keys);
  unnamed.OnWorkerStored("b", std::span(keys).first(2));
  per_node.OnWorkerStored("b", std::span(keys).first(2));
  for (int64_t qb : {0, 1, 2, 3, 6}) {
    // No worker knows a co-located node, or only of a node that holds nothing of the prompt.
    std::vector<WorkerInfo> none = {Worker("a", 2), Worker("b", qb), Worker("c", 1)};
    std::vector<WorkerInfo> elsewhere = none;
    elsewhere[0].colocated_kvstore = "kv-a";
    const RouteDecision before = *policy->Route(Request(keys, 10), none, unnamed);
    for (const auto* workers : {&none, &elsewhere}) {
      const RouteDecision d = *policy->Route(Request(keys, 10), *workers, per_node);
      EXPECT_EQ(d.worker_id, before.worker_id) << qb;
      EXPECT_EQ(d.reason, before.reason) << qb;
      EXPECT_EQ(d.store_pages, before.store_pages) << qb;
      EXPECT_EQ(d.colocated_store_pages, 0) << qb;
    }
  }
  // And that choice is the one the formula gives without a co-located term: c (q = 1) while b
  // is busier than it, b once b is as idle (its 2 local pages).
  EXPECT_EQ(policy->Route(Request(keys, 10),
                          std::vector<WorkerInfo>{Worker("a", 2), Worker("b", 3), Worker("c", 1)},
                          per_node)->worker_id,
            "c");
  EXPECT_EQ(policy->Route(Request(keys, 10),
                          std::vector<WorkerInfo>{Worker("a", 2), Worker("b", 1), Worker("c", 1)},
                          per_node)->worker_id,
            "b");

  RoutingPolicyOptions bad;
  bad.prefix_affinity.colocated_fetch_cost_ratio = 0.2;  // above r = 0.1
  auto refused = MakeRoutingPolicy("prefix-affinity", bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()),
              testing::HasSubstr("colocated_fetch_cost_ratio"));
  bad.prefix_affinity.colocated_fetch_cost_ratio = -0.01;
  EXPECT_EQ(MakeRoutingPolicy("prefix-affinity", bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvstrata::router
