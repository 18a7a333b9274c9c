#include "services/router/prefix_index.h"

#include <algorithm>

#include "core/check.h"

namespace kvstrata::router {

PrefixIndex::PrefixIndex(const PrefixIndexOptions& options) : options_(options) {
  KV_CHECK(options_.max_keys > 0);
}

PrefixIndex::HolderId PrefixIndex::HolderFor(absl::string_view worker_id) {
  auto [it, inserted] =
      holder_ids_.try_emplace(worker_id, static_cast<HolderId>(holder_names_.size()));
  if (inserted) {
    holder_names_.emplace_back(worker_id);
    holder_is_store_.push_back(false);
  }
  return it->second;
}

PrefixIndex::HolderId PrefixIndex::StoreHolderFor(absl::string_view node) {
  auto [it, inserted] = store_ids_.try_emplace(node, static_cast<HolderId>(holder_names_.size()));
  if (inserted) {
    holder_names_.emplace_back(node);
    holder_is_store_.push_back(true);
  }
  return it->second;
}

void PrefixIndex::Touch(Entry& entry) { lru_.splice(lru_.begin(), lru_, entry.lru); }

void PrefixIndex::StoredLocked(HolderId holder, std::span<const PageKey> keys) {
  // Back to front, so a chain's leading keys end most recent and forgetting starts at leaves.
  for (auto key_it = keys.rbegin(); key_it != keys.rend(); ++key_it) {
    const PageKey& key = *key_it;
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& entry = it->second;
    if (inserted) {
      lru_.push_front(key);
      entry.lru = lru_.begin();
    } else {
      Touch(entry);
    }
    if (std::find(entry.holders.begin(), entry.holders.end(), holder) == entry.holders.end()) {
      entry.holders.push_back(holder);
    }
  }
  while (entries_.size() > options_.max_keys) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
}

void PrefixIndex::RemovedLocked(HolderId holder, std::span<const PageKey> keys) {
  for (const PageKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) continue;
    Entry& entry = it->second;
    entry.holders.erase(std::remove(entry.holders.begin(), entry.holders.end(), holder),
                        entry.holders.end());
    if (entry.holders.empty()) {
      lru_.erase(entry.lru);
      entries_.erase(it);
    }
  }
}

void PrefixIndex::OnWorkerStored(absl::string_view worker_id, std::span<const PageKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  StoredLocked(HolderFor(worker_id), keys);
}

void PrefixIndex::OnWorkerRemoved(absl::string_view worker_id, std::span<const PageKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holder_ids_.find(worker_id);
  if (it == holder_ids_.end()) return;
  RemovedLocked(it->second, keys);
}

void PrefixIndex::ForgetWorker(absl::string_view worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto id_it = holder_ids_.find(worker_id);
  if (id_it != holder_ids_.end()) ForgetHolderLocked(id_it->second);
}

void PrefixIndex::ForgetStoreNode(absl::string_view node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto id_it = store_ids_.find(node);
  if (id_it != store_ids_.end()) ForgetHolderLocked(id_it->second);
}

void PrefixIndex::ForgetHolderLocked(HolderId holder) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& entry = it->second;
    entry.holders.erase(std::remove(entry.holders.begin(), entry.holders.end(), holder),
                        entry.holders.end());
    if (entry.holders.empty()) {
      lru_.erase(entry.lru);
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
  // The holder id stays allocated (ids are never reused), so a late event cannot be confused
  // with another holder.
}

void PrefixIndex::OnStoreStored(absl::string_view node, std::span<const PageKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  StoredLocked(StoreHolderFor(node), keys);
}

void PrefixIndex::OnStoreRemoved(absl::string_view node, std::span<const PageKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = store_ids_.find(node);
  if (it == store_ids_.end()) return;
  RemovedLocked(it->second, keys);
}

PrefixMatch PrefixIndex::Match(std::span<const PageKey> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  // matched[h] == i after page i-1 means holder h holds pages 0..i-1; a holder that misses a
  // page falls behind and is never extended again. `any_store` is the same count for the
  // store as a whole: page i held by some node, whichever.
  absl::flat_hash_map<HolderId, int64_t> matched;
  int64_t any_store = 0;
  std::vector<Entry*> walked;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) break;
    Entry& entry = it->second;
    bool extended = false;
    bool in_store = false;
    for (HolderId holder : entry.holders) {
      in_store = in_store || holder_is_store_[holder];
      int64_t& count = matched[holder];
      if (count == static_cast<int64_t>(i)) {
        count = static_cast<int64_t>(i) + 1;
        extended = true;
      }
    }
    if (in_store && any_store == static_cast<int64_t>(i)) {
      any_store = static_cast<int64_t>(i) + 1;
      extended = true;
    }
    if (!extended) break;
    walked.push_back(&entry);
  }
  // Leading keys end most recent, as in StoredLocked.
  for (auto it = walked.rbegin(); it != walked.rend(); ++it) Touch(**it);
  PrefixMatch out;
  out.store_pages = any_store;
  for (const auto& [holder, count] : matched) {
    if (count == 0) continue;
    (holder_is_store_[holder] ? out.store_node_pages : out.worker_pages)
        .emplace(holder_names_[holder], count);
  }
  return out;
}

size_t PrefixIndex::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

}  // namespace kvstrata::router
