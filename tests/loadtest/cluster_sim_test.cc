// The routing simulation on the committed slice of the Mooncake trace: its hit ratio against an
// independent count made from the trace's block ids (not from page keys or caches), and the
// effects every cache model must show.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

#include "loadtest/sim/cluster_sim.h"

namespace kvstrata::loadtest {
namespace {

std::vector<TraceRecord> Slice() {
  absl::StatusOr<std::vector<TraceRecord>> t =
      ReadTrace("tests/loadtest/data/mooncake_conversation_head.jsonl", 0);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : std::vector<TraceRecord>{};
}

// Cached tokens with one worker and an unbounded cache, requests one after another: for each
// request, the leading tokens of its blocks some earlier request covered (block ids name whole
// prefixes, so equal ids at a position mean equal tokens), in whole 64-token pages, at most the
// pages before its last token.
int64_t IndependentCachedTokens(const std::vector<TraceRecord>& trace, int block_tokens) {
  std::map<int64_t, int64_t> covered;  // block id -> most tokens of it an earlier request had
  int64_t cached = 0;
  for (const TraceRecord& r : trace) {
    const int64_t len = std::max<int64_t>(1, std::llround(r.input_length * block_tokens / 512.0));
    int64_t pages = 0;
    for (size_t k = 0; k < r.hash_ids.size(); ++k) {
      const int64_t mine = std::min<int64_t>(block_tokens, len - int64_t(k) * block_tokens);
      if (mine <= 0) break;
      const auto it = covered.find(r.hash_ids[k]);
      const int64_t common = it == covered.end() ? 0 : std::min(mine, it->second);
      // Pages straddling a block boundary need both blocks: count in tokens, then pages.
      pages = (int64_t(k) * block_tokens + common) / 64;
      if (common < block_tokens) break;
    }
    cached += 64 * std::min(pages, (len - 1) / 64);
    for (size_t k = 0; k < r.hash_ids.size(); ++k) {
      const int64_t mine = std::min<int64_t>(block_tokens, len - int64_t(k) * block_tokens);
      if (mine <= 0) break;
      covered[r.hash_ids[k]] = std::max(covered[r.hash_ids[k]], mine);
    }
  }
  return cached;
}

SimOptions Sequential() {
  SimOptions o;
  o.workers = 1;
  o.worker_cache_tokens = int64_t{1} << 40;
  o.policy = "round-robin";
  // Instant prefill and decode, timestamps stretched a million times: a request sees the pages
  // of every earlier one (those with equal timestamps arrive together and see each other's only
  // when one worker serves them in turn).
  o.cost = {1e15, 1e15, 1e15};
  o.speedup = 1e-6;
  return o;
}

TEST(ClusterSimTest, HitRatioMatchesAnIndependentCountFromTheBlockIds) {
  const std::vector<TraceRecord> trace = Slice();
  ASSERT_EQ(trace.size(), 40u);
  for (int block_tokens : {512, 128}) {
    SimOptions o = Sequential();
    o.blocks.block_tokens = block_tokens;
    absl::StatusOr<SimResult> r = Simulate(trace, o);
    ASSERT_TRUE(r.ok()) << r.status();
    const int64_t expect = IndependentCachedTokens(trace, block_tokens);
    EXPECT_GT(expect, 0);
    EXPECT_EQ(r->cached_local_tokens, expect) << block_tokens;
    EXPECT_EQ(r->cached_kvstore_tokens, 0);
    EXPECT_EQ(r->requests_per_worker, std::vector<int64_t>{40});
  }
}

TEST(ClusterSimTest, SmallerCachesAndMoreWorkersWithoutAffinityHitLess) {
  // One request a second, so no two are in prefill at once on different workers.
  std::vector<TraceRecord> trace = Slice();
  for (size_t i = 0; i < trace.size(); ++i) trace[i].timestamp_ms = 1000.0 * i;
  SimOptions o = Sequential();
  const double unbounded = Simulate(trace, o)->hit_ratio();
  o.worker_cache_tokens = 4096;
  const double small = Simulate(trace, o)->hit_ratio();
  EXPECT_LT(small, unbounded);
  o = Sequential();
  o.workers = 4;  // round-robin spreads shared prefixes over four caches
  const SimResult spread = *Simulate(trace, o);
  EXPECT_LT(spread.hit_ratio(), unbounded);
  EXPECT_EQ(spread.requests_per_worker, (std::vector<int64_t>{10, 10, 10, 10}));
  EXPECT_DOUBLE_EQ(spread.request_imbalance, 1.0);
  // A shared kvstore gives the spread workers back what another worker computed.
  o.kvstore_tokens = int64_t{1} << 40;
  const SimResult shared = *Simulate(trace, o);
  EXPECT_GT(shared.cached_kvstore_tokens, 0);
  EXPECT_NEAR(shared.hit_ratio(), unbounded, 1e-12);
}

TEST(ClusterSimTest, QueueingShowsInTimeToFirstToken) {
  const std::vector<TraceRecord> trace = Slice();
  SimOptions o;
  o.workers = 1;
  o.policy = "least-load";
  o.cost = {1000, 50, 1e6};  // 1,000 prompt tokens/s against ~40 requests of several thousand
  const SimResult r = *Simulate(trace, o);
  EXPECT_GT(r.queue_ms.p99, 1000);  // requests waited for the one prefill server
  EXPECT_GT(r.ttft_ms.mean, r.queue_ms.mean);
  EXPECT_FALSE(Simulate(trace, [] {
                 SimOptions bad;
                 bad.policy = "coin-flip";
                 return bad;
               }())
                   .ok());
}

}  // namespace
}  // namespace kvstrata::loadtest
