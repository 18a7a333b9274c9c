#pragma once

// The kvstore's in-memory page store: immutable KV pages (docs/kv-format.md §4) keyed by their
// radix hash (docs/hashing.md), with parent links, a byte capacity, leaf-first LRU eviction,
// leases, and a log of stored/removed events. No gRPC here: services/kvstore/kvstore_service.h
// maps it onto kvstrata.v1.KvStore.
//
// Invariants kept at every step:
// - Chains: a page with page_index > 0 is stored only if its parent is, so the store always
//   holds whole prefixes.
// - Eviction takes least recently used *leaves* only (pages with no stored child), never a
//   page covered by a live lease, so a page is never evicted before its descendants.
// - A key has one primary form (BF16 or INT2) and at most one BF16_RECENT copy, which needs an
//   INT2 primary and goes away with it. Both count against the capacity.
//
// Two tiers (docs/kvstore.md#tiers): with a fast tier (the HBM pool of a GPU store), new pages
// go there first; when it is full, its least recently used pages that no lease covers move to
// the host tier instead of being dropped, and eviction (of leaves only) happens in the host
// tier. A page of either tier is served by Fetch; PlaceInFastTier moves leased pages back up
// for a same-GPU transfer. Without a fast tier the store is the host tier alone.
//
// Thread-safety: every method may be called concurrently (one mutex). Page bytes are handed out
// as shared immutable buffers, so a page evicted while it is being streamed stays valid for the
// reader that holds it.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/radix_hash.h"
#include "services/kvstore/range_allocator.h"

namespace kvstrata::kvstore {

// Time source for lease expiry and event timestamps; tests inject a fake.
// The clock seam lives in core/clock.h.
using ::kvstrata::Clock;
using ::kvstrata::SystemClock;

// Which form of a page some bytes are (kvstrata.v1.PageEncoding without UNSPECIFIED). kInt2 is
// the history form of a page past the sink: an INT2 page, or a history codec's (page
// encodings 2, 3 and 4 of docs/kv-format.md).
enum class PageForm : uint8_t { kBf16, kInt2, kBf16Recent };

const char* PageFormName(PageForm form);

// What a writer says about a page; checked against the bytes on Put.
struct PageMeta {
  PageKey key;
  PageKey parent_key;  // the namespace key for page 0
  uint32_t page_index = 0;
  PageForm form = PageForm::kBf16;
  uint64_t byte_length = 0;
  uint64_t checksum_xxh3_64 = 0;  // XXH3-64, seed 0, of the bytes
  uint64_t digest64 = 0;          // core/page_digest.h, computed by the store on Put
  std::string mac;                // the publisher's page MAC, kept and returned as given
};

// The memory of the fast tier: one region the store places pages in by offset (HBM: a VMM
// allocation another process on the same GPU can map). Host memory implements it in tests.
class TierMemory {
 public:
  virtual ~TierMemory() = default;
  virtual uint64_t size() const = 0;
  virtual absl::Status Write(uint64_t offset, const void* src, uint64_t n) = 0;
  virtual absl::Status Read(uint64_t offset, void* dst, uint64_t n) const = 0;
  // For logs and Stats: "cuda:0 (NVIDIA H200) HBM".
  virtual std::string Describe() const = 0;
  // The memory's first byte (a device address for HBM), for a transport that moves the bytes
  // itself (NCCL sends from the pool); null where the memory offers no address.
  virtual uint8_t* base() const { return nullptr; }
};

// Where a page form is, for a same-GPU transfer: its range in the fast tier's memory.
struct FastTierPlacement {
  PageMeta meta;
  uint64_t offset = 0;
};

// A stored form of a page: its description and its bytes, shared and immutable.
struct StoredPage {
  PageMeta meta;
  std::shared_ptr<const std::vector<uint8_t>> bytes;
};

struct PageStoreOptions {
  // The host tier's capacity (the whole store without a fast tier).
  uint64_t capacity_bytes = uint64_t{1} << 30;
  // The fast tier, or null; its size is its capacity.
  std::shared_ptr<TierMemory> fast_tier;
  uint32_t max_leases = 4096;
  absl::Duration max_lease_ttl = absl::Seconds(60);
  // Events kept for watchers that resume or lag.
  size_t event_backlog = 65536;
  // Tokens per page, reported to clients (not enforced: keys already bind it).
  uint32_t page_size_tokens = 64;
};

struct PutResult {
  bool stored = false;     // newly stored
  bool duplicate = false;  // same key and form were already stored; nothing written
  uint32_t evicted = 0;    // pages evicted to make room
};

struct PageInfo {
  PageKey key;
  PageForm primary_form = PageForm::kBf16;
  uint64_t primary_bytes = 0;
  bool has_bf16_recent = false;
  uint64_t bf16_recent_bytes = 0;
};

struct LookupResult {
  std::vector<PageInfo> pages;  // the matched prefix, in order
  uint64_t lease_id = 0;        // 0 unless a lease was asked for and something matched
};

struct PinResult {
  uint64_t lease_id = 0;
  uint32_t pinned_pages = 0;
  std::vector<uint32_t> missing_indices;
  absl::Duration expires_in;
};

struct PageStoreStats {
  uint64_t pages = 0;
  uint64_t bf16_recent_copies = 0;
  uint64_t bytes_used = 0;
  uint64_t bytes_capacity = 0;
  uint64_t pinned_pages = 0;
  uint32_t active_leases = 0;
  uint32_t held_leases = 0;  // of those, held by a holder connection (no expiry)
  uint32_t open_holders = 0;
  uint64_t lookups_total = 0;
  uint64_t lookup_pages_total = 0;
  uint64_t lookup_hit_pages_total = 0;
  uint64_t pages_stored_total = 0;
  uint64_t put_duplicates_total = 0;
  uint64_t evictions_total = 0;
  uint64_t evicted_bytes_total = 0;
  uint64_t fetched_pages_total = 0;
  uint64_t fetched_bytes_total = 0;
  uint64_t checksum_failures_total = 0;
  uint64_t leases_expired_total = 0;
  uint64_t last_event_sequence = 0;
  // Per tier (zero without a fast tier): bytes and page forms held, capacity, moves.
  uint64_t fast_bytes_used = 0;
  uint64_t fast_bytes_capacity = 0;
  uint64_t fast_forms = 0;
  uint64_t host_bytes_used = 0;
  uint64_t host_forms = 0;
  uint64_t demotions_total = 0;   // page forms moved fast -> host to make room
  uint64_t promotions_total = 0;  // page forms moved host -> fast for a transfer
  uint64_t fetched_fast_pages_total = 0;  // Fetches served from the fast tier
};

enum class RemovalReason : uint8_t { kEvicted, kCorrupted, kAdmin };

struct PageEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  uint64_t sequence = 0;
  absl::Time time;
  bool snapshot = false;
  Kind kind = Kind::kStored;
  // For kStored every field; for kRemoved key and form.
  PageMeta page;
  RemovalReason reason = RemovalReason::kEvicted;
};

class PageStore {
 public:
  // `clock` is borrowed and must outlive the store.
  PageStore(const PageStoreOptions& options, const Clock* clock);

  PageStore(const PageStore&) = delete;
  PageStore& operator=(const PageStore&) = delete;

  // Stores one page form. Idempotent: a key and form already stored is a duplicate (OK).
  // Errors (each names the key): DataLoss when the bytes do not match meta.checksum_xxh3_64;
  // InvalidArgument when the bytes are not a valid page (core ParsePage) or their header
  // disagrees with `meta` (key, parent, index, encoding, length); FailedPrecondition when the
  // parent is absent (page_index > 0), when a BF16_RECENT copy has no INT2 primary, or when the
  // key is stored with another primary form; ResourceExhausted when the page is larger than the
  // capacity or room can only be made by evicting leased pages.
  absl::StatusOr<PutResult> Put(const PageMeta& meta, std::vector<uint8_t> bytes);

  // The longest stored prefix of `keys` (page 0 first). Touches the hits (LRU). With
  // lease_ttl > 0 and at least one hit, pins the hits under a new lease (errors as Pin).
  absl::StatusOr<LookupResult> Lookup(const std::vector<PageKey>& keys, absl::Duration lease_ttl);

  // The keys of the `page_count` consecutive pages that end with `last_key`, first page first,
  // found by walking the parent links back from it; the first page's parent must be
  // `first_parent` (the namespace key for a run from page 0). Read-only: it neither touches nor
  // pins (a page may go before the caller pins it; Pin then reports it missing).
  // InvalidArgument when page_count is 0 or more than the last page's page_index + 1 (no chain
  // ending there is that long); NotFound when last_key is absent or the links do not confirm the
  // run (a parent absent, a page_index out of step, another first parent): each names the page.
  absl::StatusOr<std::vector<PageKey>> ChainEndingAt(const PageKey& last_key, uint32_t page_count,
                                                     const PageKey& first_parent);

  // Creates (lease_id 0) or extends a lease and adds the present keys to it. InvalidArgument
  // for a ttl <= 0 or above max_lease_ttl; NotFound for an unknown or expired lease_id;
  // ResourceExhausted at max_leases.
  absl::StatusOr<PinResult> Pin(const std::vector<PageKey>& keys, absl::Duration ttl,
                                uint64_t lease_id);

  // Ends a lease; false if it was unknown or already expired.
  bool Release(uint64_t lease_id);

  // Leases held by a connection rather than by a clock (transport/pool_socket.h): a same-GPU
  // worker that reads pages in place ties its lease to its pool-socket connection, and the lease
  // then lasts, with no expiry, until it is released or that connection closes — the worker's
  // process exiting, for whatever reason, closes it. OpenHolder / CloseHolder tell the store of
  // a holder connection (CloseHolder drops every lease it holds, returning how many).
  void OpenHolder(uint64_t holder);
  int CloseHolder(uint64_t holder);
  // Ties live lease `lease_id` to open holder `holder` (it no longer expires). NotFound for an
  // unknown or expired lease; FailedPrecondition when the holder is not open (closed already,
  // or never opened). Idempotent.
  absl::Status HoldLease(uint64_t lease_id, uint64_t holder);

  // One stored form (kBf16/kInt2 mean "the primary", whichever it is; kBf16Recent the copy).
  // FailedPrecondition when lease_id != 0 names no live lease; NotFound when absent; DataLoss
  // (and the page is removed) when the bytes no longer match their checksum. Touches the page.
  absl::StatusOr<StoredPage> Fetch(const PageKey& key, bool bf16_recent, uint64_t lease_id);

  // For a same-GPU transfer: every form named by (key, bf16_recent), which `lease_id` (a live
  // lease) must cover, placed in the fast tier (moving it up from the host tier if needed, which
  // may move unleased pages down), in order. FailedPrecondition without a fast tier or for a
  // lease that is not live or does not cover a key; NotFound for an absent form;
  // ResourceExhausted when leased pages fill the fast tier. The ranges stay valid while the
  // lease lives: leased pages never move or leave.
  absl::StatusOr<std::vector<FastTierPlacement>> PlaceInFastTier(
      const std::vector<std::pair<PageKey, bool>>& forms, uint64_t lease_id);

  bool has_fast_tier() const { return fast_ != nullptr; }
  const TierMemory* fast_tier() const { return fast_.get(); }

  PageStoreStats Stats();

  // Random per store instance; sequence numbers restart with it.
  uint64_t epoch() const { return epoch_; }
  uint32_t page_size_tokens() const { return options_.page_size_tokens; }
  const PageStoreOptions& options() const { return options_; }

  // One kStored event per stored form, parents before children (primaries before their
  // BF16_RECENT copies), all marked snapshot with the sequence of the last live event, which is
  // also returned: live events after it follow without a gap.
  std::pair<std::vector<PageEvent>, uint64_t> Snapshot();

  // Events with sequence > after_sequence still in the backlog (up to max_events), waiting
  // until `deadline` for one to appear. Empty on deadline. If after_sequence is older than the
  // backlog, starts at the oldest kept event (the watcher sees the jump).
  std::vector<PageEvent> WaitForEvents(uint64_t after_sequence, absl::Time deadline,
                                       size_t max_events);

 private:
  // One stored form: in the host tier (`host` set) or in the fast tier (`fast_offset` >= 0).
  struct Copy {
    PageMeta meta;
    std::shared_ptr<const std::vector<uint8_t>> host;
    int64_t fast_offset = -1;
    bool in_fast() const { return fast_offset >= 0; }
  };
  struct Entry {
    Copy primary;
    std::optional<Copy> recent;
    uint32_t children = 0;
    uint32_t pins = 0;
    uint64_t last_use = 0;
    bool any_fast() const { return primary.in_fast() || (recent && recent->in_fast()); }
    bool any_host() const { return !primary.in_fast() || (recent && !recent->in_fast()); }
  };
  struct Lease {
    absl::Time expiry;
    absl::flat_hash_set<PageKey> keys;
    uint64_t holder = 0;  // an open holder: no expiry
  };
  enum class Tier : uint8_t { kFast, kHost };

  void ExpireLeasesLocked(absl::Time now);
  void DropLeaseLocked(uint64_t lease_id);
  // Pages by last use: (last_use, key).
  using UseOrder = std::set<std::pair<uint64_t, PageKey>>;
  // Marks a use of the page (the LRU orders). `fast_hint`, for pages touched in chain order:
  // where the next page's place in fast_lru_ probably is (right after this one's, when the run
  // was last touched in the same order), so a long run needs no search per page; start it at
  // fast_lru_.end(), and change fast_lru_ in no other way while the run is being touched.
  void TouchLocked(const PageKey& key, Entry& entry, UseOrder::iterator* fast_hint = nullptr);
  // Evicts LRU unpinned leaves (never `keep`) until `bytes` more fit in the host tier: leaves
  // with host bytes first, any leaf when none is left (which may turn a host page into a leaf).
  // Counts them in *evicted. `host_leaves_only`: never the fallback.
  absl::Status MakeRoomLocked(uint64_t bytes, const PageKey* keep, uint32_t* evicted,
                              bool host_leaves_only = false);
  // Stores `bytes` as a copy of `meta`: the fast tier when it has (or can make, by demotion)
  // room, else the host tier (evicting as needed).
  absl::StatusOr<Copy> PlaceLocked(const PageMeta& meta, std::vector<uint8_t> bytes,
                                   const PageKey* keep, uint32_t* evicted);
  // A fast-tier range of `bytes`, demoting LRU unpinned pages (never `keep`) as needed.
  std::optional<uint64_t> AllocateFastLocked(uint64_t bytes, const PageKey* keep,
                                             uint32_t* evicted);
  // Moves the LRU unpinned fast-tier entry (never `keep`) to the host tier; false when none.
  bool DemoteOneLocked(const PageKey* keep, uint32_t* evicted);
  // The bytes of a copy (a read from the fast tier for copies there).
  absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> BytesLocked(const Copy& copy);
  void FreeCopyLocked(const Copy& copy);
  void IndexFastLocked(const PageKey& key, const Entry& entry, bool insert);
  void RemoveLocked(const PageKey& key, RemovalReason reason);
  // Removes an unleased leaf to make room, counting it (and in *evicted, when given).
  void EvictLocked(const PageKey& key, uint32_t* evicted);
  void AppendEventLocked(PageEvent event);
  absl::StatusOr<PinResult> PinLocked(const std::vector<PageKey>& keys, absl::Duration ttl,
                                      uint64_t lease_id, absl::Time now);

  const PageStoreOptions options_;
  const Clock* clock_;
  const uint64_t epoch_;

  std::mutex mu_;
  std::condition_variable events_cv_;
  absl::flat_hash_map<PageKey, Entry> entries_;
  // Every leaf (page with no stored child), leased or not, by last use: (last_use, key).
  UseOrder leaves_;
  absl::flat_hash_map<uint64_t, Lease> leases_;
  uint64_t next_lease_id_ = 1;
  absl::flat_hash_map<uint64_t, uint32_t> open_holders_;  // holder -> leases it holds
  uint64_t use_tick_ = 0;
  std::deque<PageEvent> events_;
  uint64_t last_sequence_ = 0;
  PageStoreStats stats_;  // counters only; occupancy fields computed in Stats()
  uint64_t bytes_used_ = 0;  // the host tier's
  uint64_t host_forms_ = 0;
  uint64_t recent_copies_ = 0;
  // The fast tier: its memory, its ranges, and its entries by last use (demotion order).
  std::shared_ptr<TierMemory> fast_;
  std::optional<RangeAllocator> fast_ranges_;
  UseOrder fast_lru_;
  uint64_t fast_bytes_used_ = 0;
  uint64_t fast_forms_ = 0;
  uint64_t pinned_pages_ = 0;  // entries with pins > 0
};

}  // namespace kvstrata::kvstore
