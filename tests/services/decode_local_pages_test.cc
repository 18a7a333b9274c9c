// LocalPageCache: LRU by bytes with ancestors kept over leaves, and the change journal.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "services/decode/local_pages.h"

namespace kvstrata::decode {
namespace {

PageKey Key(uint8_t n) {
  PageKey k;
  k.bytes[0] = n;
  return k;
}

std::vector<LocalPage> Chain(std::initializer_list<uint8_t> ids, size_t bytes = 100,
                             bool int2 = true) {
  std::vector<LocalPage> chain;
  for (uint8_t id : ids)
    chain.push_back({.key = Key(id), .int2 = int2, .bytes = std::string(bytes, char(id))});
  return chain;
}

std::vector<PageKey> Sorted(std::vector<PageKey> keys) {
  std::sort(keys.begin(), keys.end());
  return keys;
}

TEST(LocalPageCacheTest, GetPrefixReturnsTheLeadingRunInOrder) {
  LocalPageCache cache({.capacity_bytes = 1000});
  cache.PutChain(Chain({1, 2, 3}));
  const std::vector<PageKey> keys = {Key(1), Key(2), Key(9), Key(3)};
  const std::vector<LocalPage> run = cache.GetPrefix(keys);
  ASSERT_EQ(run.size(), 2u);
  EXPECT_EQ(run[0].key, Key(1));
  EXPECT_EQ(run[0].bytes, std::string(100, char(1)));
  EXPECT_EQ(run[1].bytes, std::string(100, char(2)));
  EXPECT_TRUE(cache.GetPrefix(std::vector<PageKey>{Key(2)}).size() == 1);
  EXPECT_TRUE(cache.GetPrefix(std::vector<PageKey>{Key(7), Key(1)}).empty());
  EXPECT_EQ(cache.pages(), 3);
  EXPECT_EQ(cache.bytes(), 300);
}

TEST(LocalPageCacheTest, CapacityIsInBytesAndLeavesGoBeforeTheirAncestors) {
  LocalPageCache cache({.capacity_bytes = 500});
  cache.PutChain(Chain({1, 2, 3}));  // ancestors more recent: 1, 2, 3 from hot to cold
  cache.PutChain(Chain({4, 5}));     // 4, 5, 1, 2, 3
  EXPECT_EQ(cache.bytes(), 500);
  // One more page evicts the coldest: the leaf 3 of the older chain, not its root.
  const LocalPageCache::PutResult put = cache.PutChain(Chain({6}));
  EXPECT_EQ(put.stored, 1);
  EXPECT_EQ(put.evicted, 1);
  EXPECT_FALSE(cache.Contains(Key(3)));
  EXPECT_TRUE(cache.Contains(Key(1)));
  EXPECT_TRUE(cache.Contains(Key(2)));
  EXPECT_EQ(cache.evictions(), 1);
  // Touching chain 1-2 makes it hot: the next evictions take 5 and then 4 (leaf first).
  EXPECT_EQ(cache.GetPrefix(std::vector<PageKey>{Key(1), Key(2)}).size(), 2u);
  cache.PutChain(Chain({7, 8}, 100));  // 7, 8, 1, 2, 6, 4, 5 -> evict 5 and 4
  EXPECT_FALSE(cache.Contains(Key(5)));
  EXPECT_FALSE(cache.Contains(Key(4)));
  EXPECT_TRUE(cache.Contains(Key(6)));
  EXPECT_TRUE(cache.Contains(Key(1)));
  EXPECT_EQ(cache.bytes(), 500);
  EXPECT_EQ(cache.pages(), 5);
}

TEST(LocalPageCacheTest, OversizePageIsRefusedAndZeroCapacityHoldsNothing) {
  LocalPageCache cache({.capacity_bytes = 150});
  const LocalPageCache::PutResult put = cache.PutChain(Chain({1}, 200));
  EXPECT_EQ(put.refused, 1);
  EXPECT_EQ(put.stored, 0);
  EXPECT_EQ(cache.pages(), 0);
  EXPECT_TRUE(cache.TakeChanges().empty());
  LocalPageCache off({.capacity_bytes = 0});
  EXPECT_EQ(off.PutChain(Chain({1}, 1)).refused, 1);
  EXPECT_EQ(off.bytes(), 0);
}

// BF16 is exact wherever the page lands (the engine demotes it on import when it is history
// there), INT2 only as history: the BF16 form is kept, and replaces an INT2 one.
TEST(LocalPageCacheTest, Bf16FormIsKeptAndReplacesInt2) {
  LocalPageCache cache({.capacity_bytes = 1000});
  cache.PutChain(Chain({1}, 100, /*int2=*/true));
  cache.TakeChanges();
  cache.PutChain(Chain({1}, 300, /*int2=*/false));
  std::vector<LocalPage> run = cache.GetPrefix(std::vector<PageKey>{Key(1)});
  ASSERT_EQ(run.size(), 1u);
  EXPECT_FALSE(run[0].int2);
  EXPECT_EQ(run[0].bytes.size(), 300u);
  EXPECT_EQ(cache.bytes(), 300);
  EXPECT_TRUE(cache.TakeChanges().empty());  // the key never left
  // An INT2 form does not replace a BF16 one.
  cache.PutChain(Chain({1}, 100, /*int2=*/true));
  EXPECT_FALSE(cache.GetPrefix(std::vector<PageKey>{Key(1)})[0].int2);
  EXPECT_EQ(cache.bytes(), 300);
}

TEST(LocalPageCacheTest, JournalHoldsNetChangesSinceTheCheckpoint) {
  LocalPageCache cache({.capacity_bytes = 300});
  cache.PutChain(Chain({1, 2}));
  PageKeyChanges c = cache.TakeChanges();
  EXPECT_EQ(Sorted(c.stored), (std::vector<PageKey>{Key(1), Key(2)}));
  EXPECT_TRUE(c.removed.empty());
  EXPECT_TRUE(cache.TakeChanges().empty());

  // Store then remove before the next checkpoint (3): no change. LRU order after each put:
  cache.PutChain(Chain({3}));  // 3, 1, 2
  cache.PutChain(Chain({4}));  // 4, 3, 1 (2 evicted)
  cache.PutChain(Chain({5}));  // 5, 4, 3 (1 evicted)
  cache.PutChain(Chain({6}));  // 6, 5, 4 (3 evicted: stored and removed since the checkpoint)
  c = cache.TakeChanges();
  EXPECT_EQ(Sorted(c.stored), (std::vector<PageKey>{Key(4), Key(5), Key(6)}));
  EXPECT_EQ(Sorted(c.removed), (std::vector<PageKey>{Key(1), Key(2)}));

  // Remove then store again: no change.
  cache.PutChain(Chain({7}));  // 7, 6, 5 (4 evicted)
  cache.PutChain(Chain({4}));  // 4, 7, 6 (5 evicted)
  c = cache.TakeChanges();
  EXPECT_EQ(Sorted(c.stored), (std::vector<PageKey>{Key(7)}));
  EXPECT_EQ(Sorted(c.removed), (std::vector<PageKey>{Key(5)}));
}

TEST(LocalPageCacheTest, ReturnedChangesComposeWithNewerOnes) {
  LocalPageCache cache({.capacity_bytes = 200});
  cache.PutChain(Chain({1, 2}));
  PageKeyChanges failed = cache.TakeChanges();  // stored 1, 2: the send fails
  cache.PutChain(Chain({3}));                   // 3, 1 (2 evicted)
  cache.ReturnChanges(failed);
  const PageKeyChanges c = cache.TakeChanges();
  EXPECT_EQ(Sorted(c.stored), (std::vector<PageKey>{Key(1), Key(3)}));
  EXPECT_TRUE(c.removed.empty());
}

TEST(LocalPageCacheTest, OverflowAsksForASnapshot) {
  LocalPageCache cache({.capacity_bytes = 10000, .max_journal_entries = 3});
  cache.PutChain(Chain({1, 2, 3, 4}));
  PageKeyChanges c = cache.TakeChanges();
  EXPECT_TRUE(c.overflowed);
  EXPECT_TRUE(c.stored.empty());
  cache.ReturnChanges(c);  // still overflowed until a snapshot
  EXPECT_TRUE(cache.TakeChanges().overflowed);
  cache.ReturnChanges(c);
  EXPECT_EQ(Sorted(cache.TakeSnapshot()), (std::vector<PageKey>{Key(1), Key(2), Key(3), Key(4)}));
  EXPECT_TRUE(cache.TakeChanges().empty());
}

TEST(LocalPageCacheTest, EveryJournalGetsEveryChangeWithItsOwnCheckpoints) {
  LocalPageCache cache({.capacity_bytes = 1 << 20});
  const LocalPageCache::JournalId second = cache.OpenJournal();
  ASSERT_NE(second, LocalPageCache::kDefaultJournal);
  cache.PutChain(Chain({1, 2}));
  PageKeyChanges first_read = cache.TakeChanges();
  EXPECT_EQ(first_read.stored.size(), 2u);
  // The default journal's checkpoint does not touch the second one.
  cache.PutChain(Chain({3}));
  EXPECT_EQ(cache.TakeChanges().stored.size(), 1u);
  EXPECT_EQ(cache.TakeChanges(second).stored.size(), 3u);
  cache.CloseJournal(second);
  cache.PutChain(Chain({4}));
  EXPECT_EQ(cache.TakeChanges().stored.size(), 1u);
  EXPECT_TRUE(cache.TakeChanges(second).empty());  // closed: nothing recorded
}

}  // namespace
}  // namespace kvstrata::decode
