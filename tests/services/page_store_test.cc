#include "services/kvstore/page_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/page_format.h"
#include "tests/services/test_pages.h"
#include "tests/testing/fake_clock.h"

namespace kvstrata::kvstore {
namespace {

using ::kvstrata::kvstore::testing::Key;
using ::kvstrata::kvstore::testing::MakeChain;
using ::kvstrata::kvstore::testing::MakePage;
using ::kvstrata::kvstore::testing::TestPage;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using ::kvstrata::test_util::FakeClock;

constexpr uint64_t kBf16PageBytes = 16448;

class PageStoreTest : public ::testing::Test {
 protected:
  // Room for `pages` tiny BF16 pages.
  void MakeStore(uint64_t pages) {
    PageStoreOptions options;
    options.capacity_bytes = pages * kBf16PageBytes;
    options.max_leases = 4;
    options.max_lease_ttl = absl::Seconds(10);
    options.event_backlog = 8;
    store_ = std::make_unique<PageStore>(options, &clock_);
  }

  absl::StatusOr<PutResult> Put(const TestPage& page) { return store_->Put(page.meta, page.bytes); }

  void PutAll(const std::vector<TestPage>& pages) {
    for (const TestPage& page : pages) ASSERT_TRUE(Put(page).ok()) << page.meta.key.ToHex();
  }

  std::vector<uint8_t> Present(const std::vector<uint8_t>& ids) {
    std::vector<uint8_t> present;
    for (uint8_t id : ids) {
      if (store_->Fetch(Key(id), /*bf16_recent=*/false, /*lease_id=*/0).ok()) present.push_back(id);
    }
    return present;
  }

  FakeClock clock_;
  std::unique_ptr<PageStore> store_;
};

TEST_F(PageStoreTest, LookupFindsLongestPrefix) {
  MakeStore(10);
  PutAll(MakeChain({1, 2, 3}));
  absl::StatusOr<LookupResult> lookup =
      store_->Lookup({Key(1), Key(2), Key(3), Key(4)}, absl::ZeroDuration());
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  ASSERT_EQ(lookup->pages.size(), 3u);
  EXPECT_EQ(lookup->pages[2].key, Key(3));
  EXPECT_EQ(lookup->pages[0].primary_bytes, kBf16PageBytes);
  EXPECT_EQ(lookup->lease_id, 0u);
  // Stops at the first absent key even if later ones are present.
  lookup = store_->Lookup({Key(1), Key(9), Key(3)}, absl::ZeroDuration());
  ASSERT_TRUE(lookup.ok());
  EXPECT_EQ(lookup->pages.size(), 1u);
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.lookups_total, 2u);
  EXPECT_EQ(stats.lookup_pages_total, 7u);
  EXPECT_EQ(stats.lookup_hit_pages_total, 4u);
}

TEST_F(PageStoreTest, AChainIsFoundFromItsLastPageByParentLinks) {
  MakeStore(10);
  PutAll(MakeChain({1, 2, 3, 4}));
  // The whole chain (its first page's parent is the namespace key), and a run in its middle.
  absl::StatusOr<std::vector<PageKey>> all = store_->ChainEndingAt(Key(4), 4, Key(0xEE));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_THAT(*all, ElementsAre(Key(1), Key(2), Key(3), Key(4)));
  absl::StatusOr<std::vector<PageKey>> middle = store_->ChainEndingAt(Key(3), 2, Key(1));
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_THAT(*middle, ElementsAre(Key(2), Key(3)));
  absl::StatusOr<std::vector<PageKey>> one = store_->ChainEndingAt(Key(1), 1, Key(0xEE));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_THAT(*one, ElementsAre(Key(1)));
  // Read-only: no lease, and a lookup's counters do not move.
  EXPECT_EQ(store_->Stats().active_leases, 0u);
  EXPECT_EQ(store_->Stats().lookups_total, 0u);
}

TEST_F(PageStoreTest, AChainTheLinksDoNotConfirmIsAMissAndABadCountIsInvalid) {
  MakeStore(10);
  PutAll(MakeChain({1, 2, 3}));
  // Another first parent: the run does not start where the caller thinks (one page too many
  // or too few, or another sequence).
  absl::StatusOr<std::vector<PageKey>> shifted = store_->ChainEndingAt(Key(3), 2, Key(0xEE));
  EXPECT_EQ(shifted.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(shifted.status().message(), HasSubstr(Key(1).ToHex()));
  absl::StatusOr<std::vector<PageKey>> absent = store_->ChainEndingAt(Key(9), 1, Key(0xEE));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr(Key(9).ToHex()));
  // No chain ending at page_index 2 has 4 pages, and none has 0.
  absl::StatusOr<std::vector<PageKey>> too_long = store_->ChainEndingAt(Key(3), 4, Key(0xEE));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.status().message(), HasSubstr("page_count=4"));
  EXPECT_EQ(store_->ChainEndingAt(Key(3), 0, Key(2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // After the chain's tail is evicted its last key is a miss, and a shorter run still works.
  MakeStore(10);
  PutAll(MakeChain({1, 2}));
  EXPECT_EQ(store_->ChainEndingAt(Key(3), 3, Key(0xEE)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(store_->ChainEndingAt(Key(2), 2, Key(0xEE)).ok());
}

TEST_F(PageStoreTest, PageNeedsItsParent) {
  MakeStore(10);
  std::vector<TestPage> chain = MakeChain({1, 2});
  absl::StatusOr<PutResult> orphan = Put(chain[1]);
  EXPECT_EQ(orphan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(orphan.status().message(), HasSubstr(Key(1).ToHex()));
  PutAll(chain);
  EXPECT_EQ(store_->Stats().pages, 2u);
}

TEST_F(PageStoreTest, PutIsIdempotent) {
  MakeStore(10);
  TestPage page = MakeChain({1})[0];
  absl::StatusOr<PutResult> first = Put(page);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->stored);
  absl::StatusOr<PutResult> second = Put(page);
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->stored);
  EXPECT_TRUE(second->duplicate);
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.pages, 1u);
  EXPECT_EQ(stats.bytes_used, kBf16PageBytes);
  EXPECT_EQ(stats.put_duplicates_total, 1u);
  EXPECT_EQ(stats.pages_stored_total, 1u);
}

TEST_F(PageStoreTest, ChecksumMismatchIsDataLoss) {
  MakeStore(10);
  TestPage page = MakeChain({1})[0];
  page.meta.checksum_xxh3_64 ^= 1;
  EXPECT_EQ(Put(page).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store_->Stats().checksum_failures_total, 1u);
  EXPECT_EQ(store_->Stats().pages, 0u);
}

TEST_F(PageStoreTest, HeaderKeyMustMatch) {
  MakeStore(10);
  TestPage page = MakeChain({1})[0];
  page.meta.key = Key(2);
  absl::StatusOr<PutResult> put = Put(page);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(put.status().message(), HasSubstr("carry key"));
}

TEST_F(PageStoreTest, EvictsLeastRecentlyUsedLeavesBeforeAncestors) {
  MakeStore(4);
  // Chain 1-2-3 and a branch 1-4: leaves are 3 and 4.
  std::vector<TestPage> chain = MakeChain({1, 2, 3});
  PutAll(chain);
  PutAll({MakePage(Key(4), Key(1), 1)});
  // Touch 3 so that 4 is the least recently used leaf, although 1 and 2 are older.
  ASSERT_TRUE(store_->Lookup({Key(1), Key(2), Key(3)}, absl::ZeroDuration()).ok());
  ASSERT_TRUE(store_->Lookup({Key(1), Key(4)}, absl::ZeroDuration()).ok());
  ASSERT_TRUE(store_->Lookup({Key(1), Key(2), Key(3)}, absl::ZeroDuration()).ok());
  absl::StatusOr<PutResult> put = Put(MakePage(Key(5), Key(0xEE), 0));
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->evicted, 1u);
  EXPECT_THAT(Present({1, 2, 3, 4, 5}), ElementsAre(1, 2, 3, 5));
  // Next victims: 3 (older leaf than 5), then 2 (now a leaf), never 1 before its child 2.
  ASSERT_TRUE(Put(MakePage(Key(6), Key(0xEE), 0)).ok());
  EXPECT_THAT(Present({1, 2, 3, 5, 6}), ElementsAre(1, 2, 5, 6));
  ASSERT_TRUE(Put(MakePage(Key(7), Key(0xEE), 0)).ok());
  EXPECT_THAT(Present({1, 2, 5, 6, 7}), ElementsAre(1, 5, 6, 7));
  PageStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.evictions_total, 3u);
  EXPECT_EQ(stats.evicted_bytes_total, 3 * kBf16PageBytes);
  EXPECT_EQ(stats.bytes_used, 4 * kBf16PageBytes);
}

TEST_F(PageStoreTest, ParentOfTheNewPageIsNotEvicted) {
  MakeStore(1);
  std::vector<TestPage> chain = MakeChain({1, 2});
  PutAll({chain[0]});
  // The only evictable page is the new page's parent: the store is full, not evicting it.
  EXPECT_EQ(Put(chain[1]).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(PageStoreTest, CapacityErrors) {
  MakeStore(1);
  PageStoreOptions options;
  options.capacity_bytes = kBf16PageBytes - 1;
  PageStore tiny(options, &clock_);
  TestPage page = MakeChain({1})[0];
  absl::StatusOr<PutResult> put = tiny.Put(page.meta, page.bytes);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(put.status().message(), HasSubstr("capacity"));
}

TEST_F(PageStoreTest, LeasesKeepPagesUntilTheyExpire) {
  MakeStore(2);
  PutAll(MakeChain({1}));
  PutAll({MakePage(Key(2), Key(0xEE), 0)});
  absl::StatusOr<LookupResult> lookup = store_->Lookup({Key(1)}, absl::Seconds(5));
  ASSERT_TRUE(lookup.ok());
  ASSERT_NE(lookup->lease_id, 0u);
  absl::StatusOr<PinResult> pin = store_->Pin({Key(2), Key(9)}, absl::Seconds(2), 0);
  ASSERT_TRUE(pin.ok());
  EXPECT_EQ(pin->pinned_pages, 1u);
  EXPECT_THAT(pin->missing_indices, ElementsAre(1));
  EXPECT_EQ(store_->Stats().active_leases, 2u);
  EXPECT_EQ(store_->Stats().pinned_pages, 2u);
  // Everything is pinned: no room.
  EXPECT_EQ(Put(MakePage(Key(3), Key(0xEE), 0)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // The Pin lease expires first: page 2 goes.
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(Put(MakePage(Key(3), Key(0xEE), 0)).ok());
  EXPECT_THAT(Present({1, 2, 3}), ElementsAre(1, 3));
  EXPECT_EQ(store_->Stats().leases_expired_total, 1u);
  // The Lookup lease still protects page 1; fetching with it works until it expires.
  EXPECT_TRUE(store_->Fetch(Key(1), false, lookup->lease_id).ok());
  clock_.Advance(absl::Seconds(3));
  EXPECT_EQ(store_->Fetch(Key(1), false, lookup->lease_id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(store_->Release(lookup->lease_id));
  EXPECT_EQ(store_->Stats().active_leases, 0u);
}

TEST_F(PageStoreTest, PinValidationAndRelease) {
  MakeStore(2);
  PutAll(MakeChain({1}));
  EXPECT_EQ(store_->Pin({Key(1)}, absl::ZeroDuration(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Pin({Key(1)}, absl::Seconds(11), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Pin({Key(1)}, absl::Seconds(1), 12345).status().code(),
            absl::StatusCode::kNotFound);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(store_->Pin({Key(1)}, absl::Seconds(1), 0)->lease_id);
  EXPECT_EQ(store_->Pin({Key(1)}, absl::Seconds(1), 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Extending is idempotent: pinning the same key again does not double-count it.
  ASSERT_TRUE(store_->Pin({Key(1)}, absl::Seconds(1), ids[0]).ok());
  for (uint64_t id : ids) EXPECT_TRUE(store_->Release(id));
  EXPECT_FALSE(store_->Release(ids[0]));
  EXPECT_EQ(store_->Stats().pinned_pages, 0u);
}

TEST_F(PageStoreTest, ALeaseHeldByAnOpenHolderDoesNotExpireAndGoesWhenItCloses) {
  MakeStore(2);
  PutAll(MakeChain({1}));
  PutAll({MakePage(Key(2), Key(0xEE), 0)});
  absl::StatusOr<PinResult> held = store_->Pin({Key(1)}, absl::Seconds(1), 0);
  absl::StatusOr<PinResult> timed = store_->Pin({Key(2)}, absl::Seconds(1), 0);
  ASSERT_TRUE(held.ok() && timed.ok());
  // A holder the store was never told of, or 0, holds nothing.
  EXPECT_EQ(store_->HoldLease(held->lease_id, 77).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->HoldLease(held->lease_id, 0).code(), absl::StatusCode::kFailedPrecondition);
  store_->OpenHolder(77);
  EXPECT_EQ(store_->HoldLease(12345, 77).code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store_->HoldLease(held->lease_id, 77).ok());
  ASSERT_TRUE(store_->HoldLease(held->lease_id, 77).ok()) << "idempotent";
  EXPECT_EQ(store_->Stats().held_leases, 1u);
  EXPECT_EQ(store_->Stats().open_holders, 1u);
  // Far past both ttls: the timed lease expired, the held one did not (its page stays).
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(Put(MakePage(Key(3), Key(0xEE), 0)).ok());
  EXPECT_THAT(Present({1, 2, 3}), ElementsAre(1, 3));
  EXPECT_TRUE(store_->Fetch(Key(1), false, held->lease_id).ok());
  EXPECT_EQ(store_->Stats().active_leases, 1u);
  // The holder's connection closes: its lease goes, and the page can be evicted.
  EXPECT_EQ(store_->CloseHolder(77), 1);
  EXPECT_EQ(store_->CloseHolder(77), 0);
  EXPECT_EQ(store_->Stats().active_leases, 0u);
  EXPECT_EQ(store_->Stats().pinned_pages, 0u);
  EXPECT_EQ(store_->Stats().open_holders, 0u);
  EXPECT_EQ(store_->Fetch(Key(1), false, held->lease_id).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->HoldLease(timed->lease_id, 77).code(), absl::StatusCode::kNotFound);
}

TEST_F(PageStoreTest, AReleasedHeldLeaseLeavesItsHolderOpen) {
  MakeStore(2);
  PutAll(MakeChain({1}));
  store_->OpenHolder(5);
  absl::StatusOr<PinResult> a = store_->Pin({Key(1)}, absl::Seconds(1), 0);
  absl::StatusOr<PinResult> b = store_->Pin({Key(1)}, absl::Seconds(1), 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(store_->HoldLease(a->lease_id, 5).ok());
  ASSERT_TRUE(store_->HoldLease(b->lease_id, 5).ok());
  EXPECT_EQ(store_->Stats().held_leases, 2u);
  EXPECT_TRUE(store_->Release(a->lease_id));
  EXPECT_EQ(store_->Stats().held_leases, 1u);
  EXPECT_EQ(store_->Stats().open_holders, 1u);
  EXPECT_EQ(store_->CloseHolder(5), 1);
  EXPECT_EQ(store_->Stats().pinned_pages, 0u);
}

TEST_F(PageStoreTest, Bf16RecentCopyNeedsInt2Primary) {
  MakeStore(10);
  TestPage root = MakeChain({1})[0];
  TestPage int2 = MakePage(Key(2), Key(1), 1, PageForm::kInt2);
  TestPage copy = MakePage(Key(2), Key(1), 1, PageForm::kBf16Recent);
  PutAll({root});
  EXPECT_EQ(Put(copy).status().code(), absl::StatusCode::kFailedPrecondition);
  PutAll({int2, copy});
  absl::StatusOr<LookupResult> lookup = store_->Lookup({Key(1), Key(2)}, absl::ZeroDuration());
  ASSERT_TRUE(lookup.ok());
  ASSERT_EQ(lookup->pages.size(), 2u);
  EXPECT_EQ(lookup->pages[1].primary_form, PageForm::kInt2);
  EXPECT_TRUE(lookup->pages[1].has_bf16_recent);
  EXPECT_EQ(lookup->pages[1].bf16_recent_bytes, kBf16PageBytes);
  absl::StatusOr<StoredPage> fetched = store_->Fetch(Key(2), /*bf16_recent=*/true, 0);
  ASSERT_TRUE(fetched.ok());
  EXPECT_EQ(*fetched->bytes, copy.bytes);
  EXPECT_EQ(store_->Stats().bf16_recent_copies, 1u);
}

// A history codec's page (page encoding 4, or 5 for codec fragment blocks) is the history form
// of its key, as an INT2 page is.
TEST_F(PageStoreTest, CodecPagesAreTheHistoryForm) {
  for (const PageEncoding encoding : {PageEncoding::kCodec, PageEncoding::kCodecFragment}) {
    SCOPED_TRACE(PageEncodingName(encoding));
    MakeStore(10);
    TestPage root = MakeChain({1})[0];
    TestPage codec = MakePage(Key(2), Key(1), 1, PageForm::kInt2);
    // The INT2 page's header, re-labelled: a codec page of 2 blocks of 1,488 bytes.
    kernels::PageHeader h;
    std::memcpy(&h, codec.bytes.data(), sizeof(h));
    h.encoding = static_cast<uint8_t>(encoding);
    h.group_size = 0;
    h.body_bytes = 2 * 1488;
    codec.bytes.assign(kernels::kPageHeaderBytes + h.body_bytes, 0x3C);
    std::memcpy(codec.bytes.data(), &h, sizeof(h));
    codec.meta.byte_length = codec.bytes.size();
    codec.meta.checksum_xxh3_64 = XXH3_64bits(codec.bytes.data(), codec.bytes.size());
    PutAll({root});
    TestPage as_bf16 = codec;
    as_bf16.meta.form = PageForm::kBf16;
    absl::StatusOr<PutResult> wrong = Put(as_bf16);
    EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(wrong.status().message(),
                HasSubstr(absl::StrCat("the bytes are ", PageEncodingName(encoding))));
    ASSERT_TRUE(Put(codec).ok());
    absl::StatusOr<StoredPage> fetched = store_->Fetch(Key(2), /*bf16_recent=*/false, 0);
    ASSERT_TRUE(fetched.ok());
    EXPECT_EQ(*fetched->bytes, codec.bytes);
  }
}

TEST_F(PageStoreTest, FetchedBytesOutliveEviction) {
  MakeStore(1);
  TestPage page = MakeChain({1})[0];
  PutAll({page});
  absl::StatusOr<StoredPage> fetched = store_->Fetch(Key(1), false, 0);
  ASSERT_TRUE(fetched.ok());
  PutAll({MakePage(Key(2), Key(0xEE), 0)});
  EXPECT_EQ(store_->Fetch(Key(1), false, 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*fetched->bytes, page.bytes);
}

TEST_F(PageStoreTest, EventsHaveSequencesAndSnapshotPutsParentsFirst) {
  MakeStore(3);
  PutAll(MakeChain({1, 2, 3}));
  PutAll({MakePage(Key(4), Key(0xEE), 0)});  // evicts 3
  std::vector<PageEvent> events = store_->WaitForEvents(0, absl::Now(), 100);
  ASSERT_EQ(events.size(), 5u);
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].sequence, i + 1);
  EXPECT_EQ(events[3].kind, PageEvent::Kind::kRemoved);
  EXPECT_EQ(events[3].page.key, Key(3));
  EXPECT_EQ(events[3].reason, RemovalReason::kEvicted);
  EXPECT_EQ(events[4].page.key, Key(4));
  // Resuming after 3 gives 4 and 5.
  EXPECT_EQ(store_->WaitForEvents(3, absl::Now(), 100).size(), 2u);

  auto [snapshot, last] = store_->Snapshot();
  EXPECT_EQ(last, 5u);
  ASSERT_EQ(snapshot.size(), 3u);
  std::vector<PageKey> order;
  for (const PageEvent& e : snapshot) {
    EXPECT_TRUE(e.snapshot);
    EXPECT_EQ(e.sequence, 5u);
    order.push_back(e.page.key);
  }
  auto pos = [&](const PageKey& k) { return std::find(order.begin(), order.end(), k); };
  EXPECT_LT(pos(Key(1)), pos(Key(2)));
}

TEST_F(PageStoreTest, WaitForEventsWakesOnNewEventAndBacklogIsBounded) {
  MakeStore(20);
  std::thread writer([&] { PutAll(MakeChain({1})); });
  std::vector<PageEvent> events = store_->WaitForEvents(0, absl::Now() + absl::Seconds(10), 10);
  writer.join();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].page.key, Key(1));
  // No new events: returns empty at the deadline.
  EXPECT_TRUE(store_->WaitForEvents(1, absl::Now() + absl::Milliseconds(20), 10).empty());
  // Backlog of 8: a watcher resuming from 1 after 10 more events sees a jump to 4.
  std::vector<uint8_t> ids;
  for (uint8_t id = 10; id < 20; ++id) PutAll({MakePage(Key(id), Key(0xEE), 0)});
  events = store_->WaitForEvents(1, absl::Now(), 100);
  ASSERT_EQ(events.size(), 8u);
  EXPECT_EQ(events[0].sequence, 4u);
}

}  // namespace
}  // namespace kvstrata::kvstore
