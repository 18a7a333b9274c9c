#include "services/decode/local_pages.h"

#include <algorithm>
#include <utility>

namespace kvstrata::decode {

LocalPageCache::LocalPageCache(const LocalPageCacheOptions& options) : options_(options) {
  journals_[kDefaultJournal];
}

void LocalPageCache::TouchLocked(const PageKey& key, Entry& entry) {
  lru_.splice(lru_.begin(), lru_, entry.lru);
}

void LocalPageCache::RecordLocked(const PageKey& key, Change change) {
  for (auto& [id, journal] : journals_) RecordInLocked(journal, key, change);
}

void LocalPageCache::RecordInLocked(Journal& journal, const PageKey& key, Change change) {
  if (journal.overflowed) return;
  auto it = journal.changes.find(key);
  if (it != journal.changes.end()) {
    // A key alternates between held and not held, so the pending change is the opposite one:
    // together they are no change since the checkpoint.
    journal.changes.erase(it);
    return;
  }
  journal.changes.emplace(key, change);
  if (journal.changes.size() > options_.max_journal_entries) {
    journal.changes.clear();
    journal.overflowed = true;
  }
}

void LocalPageCache::EvictOneLocked() {
  const PageKey victim = lru_.back();
  lru_.pop_back();
  auto it = entries_.find(victim);
  bytes_ -= static_cast<int64_t>(it->second.bytes.size());
  entries_.erase(it);
  ++evictions_;
  RecordLocked(victim, Change::kRemoved);
}

LocalPageCache::PutResult LocalPageCache::PutChain(std::span<const LocalPage> chain) {
  PutResult result;
  std::lock_guard<std::mutex> lock(mu_);
  // Leaf first, so that each ancestor ends up more recent than its descendants.
  for (size_t j = chain.size(); j-- > 0;) {
    const LocalPage& page = chain[j];
    const int64_t size = static_cast<int64_t>(page.bytes.size());
    auto it = entries_.find(page.key);
    if (it != entries_.end()) {
      TouchLocked(page.key, it->second);
      if (!it->second.int2 || page.int2) continue;
      // Replace the INT2 form by the exact BF16 one (no journal change, the key stays).
      bytes_ -= static_cast<int64_t>(it->second.bytes.size());
      lru_.erase(it->second.lru);
      entries_.erase(it);
      if (size > options_.capacity_bytes) {
        ++result.refused;
        RecordLocked(page.key, Change::kRemoved);
        continue;
      }
      while (bytes_ + size > options_.capacity_bytes) {
        EvictOneLocked();
        ++result.evicted;
      }
      lru_.push_front(page.key);
      entries_.emplace(page.key, Entry{.int2 = false, .bytes = page.bytes, .lru = lru_.begin()});
      bytes_ += size;
      continue;
    }
    if (size > options_.capacity_bytes) {
      ++result.refused;
      continue;
    }
    while (bytes_ + size > options_.capacity_bytes) {
      EvictOneLocked();
      ++result.evicted;
    }
    lru_.push_front(page.key);
    entries_.emplace(page.key, Entry{.int2 = page.int2, .bytes = page.bytes, .lru = lru_.begin()});
    bytes_ += size;
    ++result.stored;
    RecordLocked(page.key, Change::kStored);
  }
  return result;
}

std::vector<LocalPage> LocalPageCache::GetPrefix(std::span<const PageKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry*> run;
  for (const PageKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) break;
    run.push_back(&it->second);
  }
  for (size_t j = run.size(); j-- > 0;) TouchLocked(keys[j], *run[j]);
  std::vector<LocalPage> pages;
  pages.reserve(run.size());
  for (size_t j = 0; j < run.size(); ++j) {
    pages.push_back({.key = keys[j], .int2 = run[j]->int2, .bytes = run[j]->bytes});
  }
  return pages;
}

bool LocalPageCache::Contains(const PageKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.contains(key);
}

int64_t LocalPageCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int64_t LocalPageCache::pages() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

int64_t LocalPageCache::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}

LocalPageCache::JournalId LocalPageCache::OpenJournal() {
  std::lock_guard<std::mutex> lock(mu_);
  const JournalId id = next_journal_++;
  journals_[id];
  return id;
}

void LocalPageCache::CloseJournal(JournalId journal) {
  std::lock_guard<std::mutex> lock(mu_);
  journals_.erase(journal);
}

std::vector<PageKey> LocalPageCache::TakeSnapshot(JournalId journal) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = journals_.find(journal); it != journals_.end()) {
    it->second.changes.clear();
    it->second.overflowed = false;
  }
  // Most recent first: a reader that can keep only some keeps the hottest.
  return std::vector<PageKey>(lru_.begin(), lru_.end());
}

PageKeyChanges LocalPageCache::TakeChanges(JournalId journal) {
  std::lock_guard<std::mutex> lock(mu_);
  PageKeyChanges changes;
  auto it = journals_.find(journal);
  if (it == journals_.end()) return changes;  // closed, or never opened
  Journal& j = it->second;
  changes.overflowed = j.overflowed;
  for (const auto& [key, change] : j.changes) {
    (change == Change::kStored ? changes.stored : changes.removed).push_back(key);
  }
  j.changes.clear();
  j.overflowed = false;
  return changes;
}

void LocalPageCache::ReturnChanges(const PageKeyChanges& changes, JournalId journal) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = journals_.find(journal);
  if (it == journals_.end()) return;  // closed meanwhile
  Journal& j = it->second;
  if (changes.overflowed) {
    j.changes.clear();
    j.overflowed = true;
    return;
  }
  // The returned changes are older than the journal; composing older-then-newer of one key is
  // the same cancellation RecordInLocked does, so replaying them through it is exact.
  for (const PageKey& key : changes.stored) RecordInLocked(j, key, Change::kStored);
  for (const PageKey& key : changes.removed) RecordInLocked(j, key, Change::kRemoved);
}

}  // namespace kvstrata::decode
