#pragma once

// The decode worker's local page tier: whole page bytes (one form per key, as a kvstore Fetch
// without an encoding returns it and as GenerationRequest.cached_pages takes it) kept in host
// memory after a request finishes, so the next request with the same prefix on this worker
// imports them without a network round trip.
//
// A key's form is what the exporting sequence held: INT2 once the page was history, BF16 while
// it was the sink or in the recent window. The BF16 form is kept, and replaces an INT2 one: it is
// exact wherever the page lands (in a recent window as is, as history demoted by the engine on
// import exactly as a running sequence demotes it), while INT2 is exact only as history.
//
// Eviction is LRU by page, bounded in bytes. A prefix is only useful from page 0, so evicting a
// parent before its children would strand them; rather than track the tree, every touch of a
// chain (Put of its pages, GetPrefix) refreshes the pages leaf first, ancestors last, so within
// a chain the ancestors are always more recent than their descendants and a plain LRU evicts
// leaves first. Across chains it is plain LRU: a shared root touched by any chain stays hot.
//
// A change journal records the net change to the set of keys held since a checkpoint, for a
// router's view of this worker (heartbeats): a key stored and then removed (or removed and then
// stored again) before the next checkpoint cancels out. TakeChanges makes a checkpoint and hands
// over the changes; a sender whose report failed gives them back with ReturnChanges, which
// composes them in front of anything recorded since. When more changes pile up than the journal
// keeps, it is dropped and `overflowed` tells the reader to resend a full snapshot (TakeSnapshot)
// instead. Each reader (one per router the worker reports to) has its own journal, with its own
// checkpoints: journal 0 always exists, OpenJournal adds more.
//
// Thread-safety: every method may be called concurrently (one mutex).

#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/radix_hash.h"

namespace kvstrata::decode {

// One page of a chain: its key and bytes (a whole page, header included) in one form.
struct LocalPage {
  PageKey key;
  bool int2 = false;  // the bytes are the INT2 form (else BF16)
  std::string bytes;
};

struct LocalPageCacheOptions {
  // Bytes of page data held at most (keys and bookkeeping not counted). 0 holds nothing.
  int64_t capacity_bytes = int64_t{256} << 20;
  // Net key changes kept between checkpoints before the journal overflows.
  size_t max_journal_entries = 65536;
};

// Net change since a checkpoint; a key is in at most one list.
struct PageKeyChanges {
  std::vector<PageKey> stored;
  std::vector<PageKey> removed;
  // The journal overflowed: the lists are empty and the reader must resend a full snapshot.
  bool overflowed = false;
  bool empty() const { return stored.empty() && removed.empty() && !overflowed; }
};

class LocalPageCache {
 public:
  explicit LocalPageCache(const LocalPageCacheOptions& options);

  struct PutResult {
    int stored = 0;   // pages newly stored (a page already held is only refreshed)
    int refused = 0;  // pages larger than the whole capacity
    int evicted = 0;  // pages evicted to make room
  };
  // Stores the pages of one chain, in chain order (page 0 first), refreshing them leaf first
  // (see above). A page already held is refreshed, and replaced when it was INT2 and the new
  // form is BF16.
  PutResult PutChain(std::span<const LocalPage> chain);

  // The leading run of `keys` held here (pages for keys[0..n), n maximal), refreshed leaf
  // first. Copies: an eviction afterwards does not disturb the caller.
  std::vector<LocalPage> GetPrefix(std::span<const PageKey> keys);

  bool Contains(const PageKey& key) const;
  int64_t bytes() const;
  int64_t pages() const;
  int64_t capacity_bytes() const { return options_.capacity_bytes; }
  int64_t evictions() const;

  using JournalId = int;
  static constexpr JournalId kDefaultJournal = 0;
  // A new journal, empty from now; CloseJournal stops recording into it (and its reads are
  // empty from then on).
  JournalId OpenJournal();
  void CloseJournal(JournalId journal);

  // Every key held now, and a checkpoint: the journal restarts empty from this state.
  std::vector<PageKey> TakeSnapshot(JournalId journal = kDefaultJournal);
  // The net changes since the journal's last checkpoint, and a checkpoint.
  PageKeyChanges TakeChanges(JournalId journal = kDefaultJournal);
  // Gives back changes a reader took but could not deliver; they count as older than anything
  // recorded since. Ignored after an overflow (the reader must send a snapshot anyway).
  void ReturnChanges(const PageKeyChanges& changes, JournalId journal = kDefaultJournal);

 private:
  enum class Change { kStored, kRemoved };
  struct Journal {
    absl::flat_hash_map<PageKey, Change> changes;
    bool overflowed = false;
  };
  struct Entry {
    bool int2 = false;
    std::string bytes;
    std::list<PageKey>::iterator lru;  // position in lru_ (front = most recent)
  };

  void TouchLocked(const PageKey& key, Entry& entry);
  // Records one change on top of every journal (cancelling the opposite change of the key).
  void RecordLocked(const PageKey& key, Change change);
  void RecordInLocked(Journal& journal, const PageKey& key, Change change);
  void EvictOneLocked();

  const LocalPageCacheOptions options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<PageKey, Entry> entries_;
  std::list<PageKey> lru_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  absl::flat_hash_map<JournalId, Journal> journals_;
  JournalId next_journal_ = kDefaultJournal + 1;
};

}  // namespace kvstrata::decode
