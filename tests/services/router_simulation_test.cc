// The router's policies on a small shared-prefix workload: 4 workers with LRU page caches
// reporting to the prefix index, comparing hit ratios and the worst queue (docs/routing.md).

#include <cmath>
#include <cstdint>
#include <deque>
#include <iostream>
#include <list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/radix_hash.h"
#include "gtest/gtest.h"
#include "services/router/policy.h"
#include "services/router/prefix_index.h"
#include "services/router/worker_table.h"
#include "tests/services/router_policy_testing.h"

namespace kvstrata::router {
namespace {

using namespace ::kvstrata::router::test;  // NOLINT: the shared helpers

// A worker's page cache: LRU over page keys with a capacity, reporting its events to the index.
class SimCache {
 public:
  SimCache(std::string id, size_t capacity) : id_(std::move(id)), capacity_(capacity) {}

  // Leading pages of `keys` held now.
  int64_t Hits(const std::vector<PageKey>& keys) const {
    int64_t n = 0;
    for (const PageKey& k : keys) {
      if (!pos_.contains(k)) break;
      ++n;
    }
    return n;
  }

  void Insert(const std::vector<PageKey>& keys, PrefixIndex& index) {
    std::vector<PageKey> stored, removed;
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      auto found = pos_.find(*it);
      if (found != pos_.end()) {
        lru_.splice(lru_.begin(), lru_, found->second);
        continue;
      }
      lru_.push_front(*it);
      pos_[*it] = lru_.begin();
      stored.push_back(*it);
    }
    while (lru_.size() > capacity_) {
      removed.push_back(lru_.back());
      pos_.erase(lru_.back());
      lru_.pop_back();
    }
    index.OnWorkerStored(id_, stored);
    index.OnWorkerRemoved(id_, removed);
  }

 private:
  std::string id_;
  size_t capacity_;
  std::list<PageKey> lru_;
  absl::flat_hash_map<PageKey, std::list<PageKey>::iterator> pos_;
};

struct SimResult {
  double hit_ratio = 0;
  int64_t max_load_at_route = 0;  // the chosen worker's queue including the new request
  int64_t max_allowed = 0;        // the bound at that decision
  bool bound_held = true;
};

// 4 workers with 48-page caches; 8 system prompts of 8 pages, each request adding 2 pages of
// its own; a request runs for the next 8 arrivals (so ~8 in flight, ~2 per worker).
SimResult Simulate(absl::string_view policy_name) {
  constexpr int kWorkers = 4, kPrompts = 8, kSystemPages = 8, kUserPages = 2, kRequests = 2000;
  constexpr int kDuration = 8;
  constexpr size_t kCachePages = 48;
  auto policy = Make(policy_name);
  PrefixIndex index;
  std::vector<WorkerInfo> workers;
  std::vector<SimCache> caches;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back(Worker("w" + std::to_string(w), 0));
    caches.emplace_back(workers.back().id, kCachePages);
  }
  std::mt19937 rng(42);
  std::deque<std::pair<int, int>> in_flight;  // (finishes at arrival, worker)
  int64_t hits = 0, pages = 0;
  SimResult result;
  for (int r = 0; r < kRequests; ++r) {
    while (!in_flight.empty() && in_flight.front().first <= r) {
      --workers[in_flight.front().second].load.running;
      in_flight.pop_front();
    }
    const uint32_t prompt = rng() % kPrompts;
    std::vector<PageKey> keys = Chain(prompt, kSystemPages);
    for (int u = 0; u < kUserPages; ++u) keys.push_back(Key(1000 + r, u));

    auto d = policy->Route(Request(keys, /*extra_tokens=*/17), workers, index);
    EXPECT_TRUE(d.ok()) << d.status();
    int chosen = 0;
    while (workers[chosen].id != d->worker_id) ++chosen;

    int64_t total = 0;
    for (const WorkerInfo& w : workers) total += w.load.requests();
    const int64_t bound = static_cast<int64_t>(std::ceil(1.25 * (total + 1) / kWorkers));
    const int64_t load = workers[chosen].load.requests() + 1;
    result.max_load_at_route = std::max(result.max_load_at_route, load);
    result.max_allowed = std::max(result.max_allowed, bound);
    if (load > bound) result.bound_held = false;

    const int64_t h = caches[chosen].Hits(keys);
    EXPECT_EQ(d->local_pages, h) << "the index must mirror the caches exactly here";
    hits += h;
    pages += static_cast<int64_t>(keys.size());
    caches[chosen].Insert(keys, index);
    ++workers[chosen].load.running;
    in_flight.emplace_back(r + kDuration, chosen);
  }
  result.hit_ratio = static_cast<double>(hits) / static_cast<double>(pages);
  return result;
}

TEST(RoutingSimulationTest, PrefixAffinityBeatsRoundRobinWithinTheLoadBound) {
  const SimResult rr = Simulate("round-robin");
  const SimResult pa = Simulate("prefix-affinity");
  const SimResult ca = Simulate("cache-aware");
  std::cout << "hit ratio / max load: round-robin " << rr.hit_ratio << " / " << rr.max_load_at_route
            << ", cache-aware " << ca.hit_ratio << " / " << ca.max_load_at_route
            << ", prefix-affinity " << pa.hit_ratio << " / " << pa.max_load_at_route
            << " (bound up to " << pa.max_allowed << ")\n";
  // The best possible is 8/10 (user pages never hit).
  EXPECT_GT(pa.hit_ratio, rr.hit_ratio + 0.2);
  EXPECT_LE(pa.hit_ratio, 0.8);
  EXPECT_TRUE(pa.bound_held);
  // SGLang's policy buys its hits with hot spots: below its 64-request trigger it ignores load.
  EXPECT_FALSE(ca.bound_held);
  EXPECT_GT(ca.max_load_at_route, pa.max_load_at_route);
}

}  // namespace
}  // namespace kvstrata::router
