// The page store's two tiers: a fast tier (HBM on a GPU store; host memory behind the same
// TierMemory seam here) in front of the host tier. Pages that no longer fit in the fast tier
// move down instead of being dropped, leased pages never move, a same-GPU transfer brings pages
// back up, and every stored page stays readable with its own bytes whatever moved.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/kvstore/page_store.h"
#include "core/page_digest.h"
#include "services/kvstore/range_allocator.h"
#include "tests/services/host_tier_memory.h"
#include "tests/services/test_pages.h"
#include "tests/testing/fake_clock.h"

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::kvstore::testing::HostTierMemory;
using ::kvstrata::kvstore::testing::Key;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::MakePage;
using ::kvstrata::kvstore::testing::TestPage;
using ::kvstrata::test_util::FakeClock;
using ::testing::HasSubstr;

constexpr uint64_t kBf16PageBytes = 16448;
constexpr uint64_t kSlot = 16640;  // kBf16PageBytes rounded up to the allocator's 256 bytes

class PageStoreTiersTest : public ::testing::Test {
 protected:
  void MakeStore(uint64_t fast_pages, uint64_t host_pages) {
    tier_ = std::make_shared<HostTierMemory>(fast_pages * kSlot);
    PageStoreOptions options;
    options.capacity_bytes = host_pages * kBf16PageBytes;
    options.fast_tier = tier_;
    options.max_lease_ttl = absl::Seconds(10);
    store_ = std::make_unique<PageStore>(options, &clock_);
  }
  void PutAll(const std::vector<TestPage>& pages) {
    for (const TestPage& page : pages) {
      ASSERT_TRUE(store_->Put(page.meta, page.bytes).ok()) << page.meta.key.ToHex();
    }
  }
  // Fetch returns exactly the bytes that were Put.
  void ExpectStored(const TestPage& page) {
    absl::StatusOr<StoredPage> got = store_->Fetch(page.meta.key, false, 0);
    ASSERT_TRUE(got.ok()) << page.meta.key.ToHex() << ": " << got.status();
    EXPECT_EQ(*got->bytes, page.bytes) << page.meta.key.ToHex();
  }

  FakeClock clock_;
  std::shared_ptr<HostTierMemory> tier_;
  std::unique_ptr<PageStore> store_;
};

TEST_F(PageStoreTiersTest, NewPagesGoToTheFastTier) {
  MakeStore(/*fast_pages=*/4, /*host_pages=*/4);
  const std::vector<TestPage> chain = MakeChain({1, 2, 3});
  PutAll(chain);
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.fast_forms, 3u);
  EXPECT_EQ(stats.fast_bytes_used, 3 * kBf16PageBytes);
  EXPECT_EQ(stats.host_forms, 0u);
  EXPECT_EQ(stats.host_bytes_used, 0u);
  EXPECT_EQ(stats.bytes_used, 3 * kBf16PageBytes);
  EXPECT_EQ(stats.bytes_capacity, 4 * kSlot + 4 * kBf16PageBytes);
  for (const TestPage& page : chain) ExpectStored(page);
  EXPECT_EQ(store_->Stats().fetched_fast_pages_total, 3u);
}

TEST_F(PageStoreTiersTest, AFullFastTierMovesItsOldestPagesDownInsteadOfDroppingThem) {
  MakeStore(/*fast_pages=*/2, /*host_pages=*/8);
  const std::vector<TestPage> chain = MakeChain({1, 2, 3, 4, 5});
  PutAll(chain);
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages, 5u);
  EXPECT_EQ(stats.evictions_total, 0u);
  EXPECT_EQ(stats.demotions_total, 3u);
  EXPECT_EQ(stats.fast_forms, 2u);
  EXPECT_EQ(stats.host_forms, 3u);
  for (const TestPage& page : chain) ExpectStored(page);
  // Pages 4 and 5 (the newest) are in the fast tier.
  absl::StatusOr<LookupResult> lookup = store_->Lookup(
      {Key(1), Key(2), Key(3), Key(4), Key(5)}, /*lease_ttl=*/absl::Seconds(5));
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->pages.size(), 5u);
}

// A run touched in order (a Lookup, a transfer) becomes the newest in the fast tier, page by
// page, whether or not it was touched in that order before: what moves down next is the page
// used least recently.
TEST_F(PageStoreTiersTest, TouchingARunInOrderKeepsTheUseOrderOfTheFastTier) {
  MakeStore(/*fast_pages=*/3, /*host_pages=*/8);
  const std::vector<TestPage> chain = MakeChain({1, 2, 3});
  // Pages that make room as they come: first pages of other chains (a new page's own parent
  // never moves down for it).
  const TestPage other = MakePage(Key(10), Key(0xEE), 0);
  const TestPage another = MakePage(Key(11), Key(0xEE), 0);
  auto in_fast = [&](uint8_t id) {
    const uint64_t before = store_->Stats().fetched_fast_pages_total;
    EXPECT_TRUE(store_->Fetch(Key(id), false, 0).ok());
    return store_->Stats().fetched_fast_pages_total > before;
  };
  PutAll(chain);
  ASSERT_TRUE(store_->Lookup({Key(1), Key(2)}, absl::ZeroDuration()).ok());  // use: 3, 1, 2
  PutAll({other});                                                           // moves 3 down
  EXPECT_FALSE(in_fast(3));
  EXPECT_TRUE(in_fast(2));
  EXPECT_TRUE(in_fast(1));
  EXPECT_TRUE(in_fast(10));                                                  // use: 2, 1, 10
  ASSERT_TRUE(store_->Lookup({Key(1), Key(2)}, absl::ZeroDuration()).ok());  // 10, 1, 2
  PutAll({another});                                                         // moves 10 down
  EXPECT_FALSE(in_fast(10));
  EXPECT_TRUE(in_fast(1));
  EXPECT_TRUE(in_fast(2));
  EXPECT_TRUE(in_fast(11));
  for (const TestPage& page : chain) ExpectStored(page);
  ExpectStored(other);
}

TEST_F(PageStoreTiersTest, BothTiersFullEvictsLeavesOnly) {
  MakeStore(/*fast_pages=*/2, /*host_pages=*/2);
  const std::vector<TestPage> a = MakeChain({1, 2, 3});
  PutAll(a);
  TestPage b = MakePage(Key(9), Key(0xEE), 0);
  PutAll({b});
  // Four pages fit (2 + 2); a fifth evicts the least recently used leaf.
  TestPage c = MakePage(Key(8), Key(0xEE), 0);
  PutAll({c});
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages, 4u);
  EXPECT_EQ(stats.evictions_total, 1u);
  // Page 3 was the oldest leaf: gone; its parents stay (whole prefixes only).
  EXPECT_FALSE(store_->Fetch(Key(3), false, 0).ok());
  ExpectStored(a[0]);
  ExpectStored(a[1]);
  ExpectStored(b);
  ExpectStored(c);
}

TEST_F(PageStoreTiersTest, LeasedPagesDoNotMoveAndATransferBringsPagesBackUp) {
  MakeStore(/*fast_pages=*/2, /*host_pages=*/8);
  const std::vector<TestPage> chain = MakeChain({1, 2, 3, 4});
  PutAll(chain);  // 1, 2 moved down; 3, 4 in the fast tier
  absl::StatusOr<PinResult> lease = store_->Pin({Key(1), Key(2)}, absl::Seconds(5), 0);
  ASSERT_TRUE(lease.ok());
  absl::StatusOr<std::vector<FastTierPlacement>> placed =
      store_->PlaceInFastTier({{Key(1), false}, {Key(2), false}}, lease->lease_id);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_EQ(placed->size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const FastTierPlacement& p = (*placed)[i];
    EXPECT_EQ(p.meta.key, chain[i].meta.key);
    EXPECT_EQ(p.meta.byte_length, kBf16PageBytes);
    EXPECT_EQ(p.meta.digest64, PageDigest64(chain[i].bytes.data(), chain[i].bytes.size()));
    // The bytes are at the offset given, for a reader that maps the tier's memory.
    EXPECT_EQ(std::memcmp(tier_->at(p.offset), chain[i].bytes.data(), kBf16PageBytes), 0);
  }
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.promotions_total, 2u);
  EXPECT_EQ(stats.fast_forms, 2u);
  // While leased, 1 and 2 stay where they are: new pages go to the host tier.
  PutAll({MakePage(Key(7), Key(0xEE), 0)});
  absl::StatusOr<std::vector<FastTierPlacement>> again =
      store_->PlaceInFastTier({{Key(1), false}, {Key(2), false}}, lease->lease_id);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].offset, (*placed)[0].offset);
  EXPECT_EQ((*again)[1].offset, (*placed)[1].offset);
  EXPECT_EQ(store_->Stats().host_forms, 3u);
  // A transfer needing a third page cannot place it while two leased pages fill the tier.
  absl::StatusOr<PinResult> more = store_->Pin({Key(3)}, absl::Seconds(5), lease->lease_id);
  ASSERT_TRUE(more.ok());
  absl::StatusOr<std::vector<FastTierPlacement>> full =
      store_->PlaceInFastTier({{Key(3), false}}, lease->lease_id);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("full of leased pages"));
  ASSERT_TRUE(store_->Release(lease->lease_id));
  for (const TestPage& page : chain) ExpectStored(page);
}

TEST_F(PageStoreTiersTest, TransfersNeedALiveLeaseCoveringEveryPage) {
  MakeStore(/*fast_pages=*/4, /*host_pages=*/4);
  PutAll(MakeChain({1, 2}));
  EXPECT_EQ(store_->PlaceInFastTier({{Key(1), false}}, 12345).status().code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<PinResult> lease = store_->Pin({Key(1)}, absl::Seconds(5), 0);
  ASSERT_TRUE(lease.ok());
  absl::StatusOr<std::vector<FastTierPlacement>> uncovered =
      store_->PlaceInFastTier({{Key(1), false}, {Key(2), false}}, lease->lease_id);
  EXPECT_EQ(uncovered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(uncovered.status().message(), HasSubstr("does not cover"));
  EXPECT_EQ(store_->PlaceInFastTier({{Key(1), true}}, lease->lease_id).status().code(),
            absl::StatusCode::kNotFound);
  clock_.Advance(absl::Seconds(6));
  EXPECT_THAT(store_->PlaceInFastTier({{Key(1), false}}, lease->lease_id).status().message(),
              HasSubstr("expired"));
}

TEST(PageStoreWithoutAFastTier, RefusesTransfersAndKeepsEverythingInHostMemory) {
  FakeClock clock;
  PageStoreOptions options;
  options.capacity_bytes = 4 * kBf16PageBytes;
  PageStore store(options, &clock);
  const std::vector<TestPage> chain = MakeChain({1});
  ASSERT_TRUE(store.Put(chain[0].meta, chain[0].bytes).ok());
  absl::StatusOr<PinResult> lease = store.Pin({Key(1)}, absl::Seconds(5), 0);
  ASSERT_TRUE(lease.ok());
  absl::StatusOr<std::vector<FastTierPlacement>> placed =
      store.PlaceInFastTier({{Key(1), false}}, lease->lease_id);
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(placed.status().message(), HasSubstr("--device"));
  PageStoreStats stats = store.Stats();
  EXPECT_EQ(stats.host_forms, 1u);
  EXPECT_EQ(stats.fast_bytes_capacity, 0u);
}

TEST_F(PageStoreTiersTest, AFastTierThatCannotBeReadLosesPagesAsMissesNotWrongBytes) {
  MakeStore(/*fast_pages=*/2, /*host_pages=*/8);
  const std::vector<TestPage> chain = MakeChain({1, 2});
  PutAll(chain);
  tier_->fail_reads = true;
  absl::StatusOr<StoredPage> got = store_->Fetch(Key(2), false, 0);
  EXPECT_FALSE(got.ok());
  tier_->fail_reads = false;
  ExpectStored(chain[1]);
}

// Random puts, lookups with leases, transfers and releases over small tiers: afterwards every
// page the store says it holds reads back with its own bytes, parents are present, and the
// per-tier accounting adds up.
TEST_F(PageStoreTiersTest, RandomWorkKeepsEveryPageIntact) {
  MakeStore(/*fast_pages=*/5, /*host_pages=*/7);
  std::mt19937 rng(7);
  std::map<uint8_t, TestPage> made;  // id -> page
  std::vector<uint64_t> leases;
  for (int step = 0; step < 600; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      // Extend a random chain (or start one).
      const uint8_t id = static_cast<uint8_t>(1 + rng() % 200);
      if (made.contains(id)) continue;
      std::vector<uint8_t> roots;
      for (const auto& [other, page] : made) roots.push_back(other);
      const bool child = !roots.empty() && rng() % 3 != 0;
      const uint8_t parent = child ? roots[rng() % roots.size()] : 0;
      TestPage page = child ? MakePage(Key(id), Key(parent), made[parent].meta.page_index + 1)
                            : MakePage(Key(id), Key(0xEE), 0);
      absl::StatusOr<PutResult> put = store_->Put(page.meta, page.bytes);
      if (put.ok()) made[id] = page;
    } else if (op < 7 && !made.empty()) {
      auto it = made.begin();
      std::advance(it, rng() % made.size());
      absl::StatusOr<PinResult> lease = store_->Pin({it->second.meta.key}, absl::Seconds(5), 0);
      if (!lease.ok()) continue;
      leases.push_back(lease->lease_id);
      absl::StatusOr<std::vector<FastTierPlacement>> placed =
          store_->PlaceInFastTier({{it->second.meta.key, false}}, lease->lease_id);
      if (placed.ok()) {
        ASSERT_EQ(std::memcmp(tier_->at((*placed)[0].offset), it->second.bytes.data(),
                              it->second.bytes.size()),
                  0);
      }
    } else if (!leases.empty()) {
      const size_t i = rng() % leases.size();
      store_->Release(leases[i]);
      leases.erase(leases.begin() + static_cast<long>(i));
    }
  }
  uint64_t held = 0;
  for (const auto& [id, page] : made) {
    absl::StatusOr<StoredPage> got = store_->Fetch(page.meta.key, false, 0);
    if (!got.ok()) {
      ASSERT_EQ(got.status().code(), absl::StatusCode::kNotFound) << got.status();
      continue;
    }
    ++held;
    ASSERT_EQ(*got->bytes, page.bytes) << "page " << int{id};
    if (page.meta.page_index > 0) {
      EXPECT_TRUE(store_->Fetch(page.meta.parent_key, false, 0).ok()) << "parent of " << int{id};
    }
  }
  const PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages, held);
  EXPECT_EQ(stats.fast_forms + stats.host_forms, held);
  EXPECT_EQ(stats.fast_bytes_used + stats.host_bytes_used, held * kBf16PageBytes);
  EXPECT_LE(stats.fast_bytes_used, 5 * kSlot);
  EXPECT_LE(stats.host_bytes_used, 7 * kBf16PageBytes);
  EXPECT_GT(stats.demotions_total, 0u);
  EXPECT_GT(stats.promotions_total, 0u);
  EXPECT_GT(stats.evictions_total, 0u);
}

TEST(RangeAllocator, FirstFitMergesNeighboursOnFree) {
  RangeAllocator ranges(4096, 256);
  std::optional<uint64_t> a = ranges.Allocate(1000);  // 1024
  std::optional<uint64_t> b = ranges.Allocate(1024);
  std::optional<uint64_t> c = ranges.Allocate(2048);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(*a, 0u);
  EXPECT_EQ(*b, 1024u);
  EXPECT_EQ(*c, 2048u);
  EXPECT_FALSE(ranges.Allocate(1).has_value());
  ranges.Free(*a, 1000);
  ranges.Free(*c, 2048);
  EXPECT_EQ(ranges.largest_free(), 2048u);
  EXPECT_FALSE(ranges.Allocate(3000).has_value());  // 1024 + 2048 free, apart
  ranges.Free(*b, 1024);
  EXPECT_EQ(ranges.largest_free(), 4096u);  // merged into one
  EXPECT_EQ(ranges.used(), 0u);
  EXPECT_EQ(ranges.Allocate(4096), std::optional<uint64_t>(0));
}

}  // namespace
}  // namespace kvstrata::kvstore
