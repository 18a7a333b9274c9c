// Where the page store keeps bytes and how it makes room: the LRU orders (leaves for eviction,
// the fast tier's entries for demotion), placing a new page in the fast or the host tier,
// demotion fast -> host, leaf-first eviction from the host tier, and PlaceInFastTier's
// promotion host -> fast for a same-GPU transfer (docs/kvstore.md#tiers).

#include <cstdint>
#include <cstdio>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

void PageStore::TouchLocked(const PageKey& key, Entry& entry, UseOrder::iterator* fast_hint) {
  const std::pair<uint64_t, PageKey> old{entry.last_use, key};
  entry.last_use = ++use_tick_;
  // The same node moves to the end (the newest use): no allocation, and constant time to insert
  // with the end as hint; with a hint that is right, finding it is constant time too. Touching
  // the 1,600 pages of a long prefix is most of a same-GPU handshake's work in the store.
  auto move_to_end = [&](UseOrder& order, UseOrder::iterator* hint) {
    UseOrder::iterator pos =
        hint != nullptr && *hint != order.end() && **hint == old ? *hint : order.find(old);
    if (pos == order.end()) {
      order.insert(order.end(), {entry.last_use, key});
      return;
    }
    if (hint != nullptr) *hint = std::next(pos);
    UseOrder::node_type node = order.extract(pos);
    node.value().first = entry.last_use;
    order.insert(order.end(), std::move(node));
  };
  if (entry.children == 0) move_to_end(leaves_, nullptr);
  if (entry.any_fast()) move_to_end(fast_lru_, fast_hint);
}

void PageStore::IndexFastLocked(const PageKey& key, const Entry& entry, bool insert) {
  if (!entry.any_fast()) return;
  if (insert) {
    fast_lru_.insert({entry.last_use, key});
  } else {
    fast_lru_.erase({entry.last_use, key});
  }
}

absl::Status PageStore::MakeRoomLocked(uint64_t bytes, const PageKey* keep, uint32_t* evicted,
                                       bool host_leaves_only) {
  while (bytes_used_ + bytes > options_.capacity_bytes) {
    // The oldest leaf that is neither leased nor kept, holding host bytes if one does.
    auto evictable = [&](const std::pair<uint64_t, PageKey>& leaf, bool need_host) {
      const Entry& entry = entries_.at(leaf.second);
      return entry.pins == 0 && (keep == nullptr || leaf.second != *keep) &&
             (!need_host || entry.any_host());
    };
    auto victim = leaves_.begin();
    while (victim != leaves_.end() && !evictable(*victim, /*need_host=*/true)) ++victim;
    if (victim == leaves_.end() && fast_ != nullptr && !host_leaves_only) {
      victim = leaves_.begin();
      while (victim != leaves_.end() && !evictable(*victim, /*need_host=*/false)) ++victim;
    }
    if (victim == leaves_.end()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("store full: ", bytes_used_, " of ", options_.capacity_bytes,
                       " host bytes used and no unleased leaf can be evicted; retry later"));
    }
    const PageKey key = victim->second;
    fprintf(stderr, "kvstore: evicting page %s to make room for %llu bytes\n", key.ToHex().c_str(),
            static_cast<unsigned long long>(bytes));
    EvictLocked(key, evicted);
  }
  return absl::OkStatus();
}

void PageStore::EvictLocked(const PageKey& key, uint32_t* evicted) {
  const uint64_t before = bytes_used_ + fast_bytes_used_;
  RemoveLocked(key, RemovalReason::kEvicted);
  ++stats_.evictions_total;
  stats_.evicted_bytes_total += before - bytes_used_ - fast_bytes_used_;
  if (evicted != nullptr) ++*evicted;
}

absl::StatusOr<PageStore::Copy> PageStore::PlaceLocked(const PageMeta& meta,
                                                       std::vector<uint8_t> bytes,
                                                       const PageKey* keep, uint32_t* evicted) {
  const uint64_t n = bytes.size();
  if (fast_ != nullptr) {
    if (std::optional<uint64_t> offset = AllocateFastLocked(n, keep, evicted)) {
      const absl::Status written = fast_->Write(*offset, bytes.data(), n);
      if (written.ok()) {
        fast_bytes_used_ += n;
        ++fast_forms_;
        return Copy{.meta = meta, .fast_offset = static_cast<int64_t>(*offset)};
      }
      fast_ranges_->Free(*offset, n);
      fprintf(stderr, "kvstore: page %s not placed in %s, kept in host memory: %s\n",
              meta.key.ToHex().c_str(), fast_->Describe().c_str(),
              std::string(written.message()).c_str());
    }
  }
  if (n > options_.capacity_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "page ", meta.key.ToHex(), ": the fast tier is full of leased pages and ", n,
        " bytes exceed the host tier's capacity of ", options_.capacity_bytes));
  }
  KV_RETURN_IF_ERROR(MakeRoomLocked(n, keep, evicted));
  bytes_used_ += n;
  ++host_forms_;
  return Copy{.meta = meta,
              .host = std::make_shared<const std::vector<uint8_t>>(std::move(bytes))};
}

std::optional<uint64_t> PageStore::AllocateFastLocked(uint64_t bytes, const PageKey* keep,
                                                      uint32_t* evicted) {
  if (bytes > fast_ranges_->size()) return std::nullopt;
  for (;;) {
    if (std::optional<uint64_t> offset = fast_ranges_->Allocate(bytes)) return offset;
    if (!DemoteOneLocked(keep, evicted)) return std::nullopt;
  }
}

bool PageStore::DemoteOneLocked(const PageKey* keep, uint32_t* evicted) {
  auto victim = fast_lru_.begin();
  while (victim != fast_lru_.end() && (entries_.at(victim->second).pins > 0 ||
                                       (keep != nullptr && victim->second == *keep))) {
    ++victim;
  }
  if (victim == fast_lru_.end()) return false;
  const PageKey key = victim->second;
  uint64_t need = 0;
  {
    const Entry& entry = entries_.at(key);
    if (entry.primary.in_fast()) need += entry.primary.meta.byte_length;
    if (entry.recent && entry.recent->in_fast()) need += entry.recent->meta.byte_length;
  }
  // Room in the host tier; neither the page moving down nor the caller's page may go.
  // MakeRoomLocked keeps one key: the moving page; the caller's is pinned for the call.
  uint32_t unused = 0;
  Entry* kept = nullptr;
  if (keep != nullptr && *keep != key) {
    auto it = entries_.find(*keep);
    if (it != entries_.end()) kept = &it->second;
  }
  if (kept != nullptr) ++kept->pins;
  bool room = MakeRoomLocked(need, &key, evicted != nullptr ? evicted : &unused,
                             /*host_leaves_only=*/true)
                  .ok();
  // The host tier is full of leased pages or parents: drop the page itself if it is a leaf,
  // else make a host page a leaf by evicting elsewhere.
  if (!room && entries_.at(key).children != 0) {
    room = MakeRoomLocked(need, &key, evicted != nullptr ? evicted : &unused).ok();
  }
  if (kept != nullptr) --kept->pins;
  Entry& entry = entries_.at(key);
  if (!room) {
    if (entry.children != 0) return false;
    fprintf(stderr, "kvstore: evicting page %s from %s: no room in host memory\n",
            key.ToHex().c_str(), fast_->Describe().c_str());
    EvictLocked(key, evicted);
    return true;
  }
  IndexFastLocked(key, entry, /*insert=*/false);
  for (Copy* copy : {&entry.primary, entry.recent ? &*entry.recent : nullptr}) {
    if (copy == nullptr || !copy->in_fast()) continue;
    absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> bytes = BytesLocked(*copy);
    if (!bytes.ok()) {
      fprintf(stderr, "kvstore: page %s lost moving out of %s: %s\n", key.ToHex().c_str(),
              fast_->Describe().c_str(), std::string(bytes.status().message()).c_str());
      IndexFastLocked(key, entry, /*insert=*/true);
      if (entry.children == 0) RemoveLocked(key, RemovalReason::kCorrupted);
      return true;
    }
    FreeCopyLocked(*copy);
    copy->fast_offset = -1;
    copy->host = *std::move(bytes);
    bytes_used_ += copy->meta.byte_length;
    ++host_forms_;
    ++stats_.demotions_total;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<const std::vector<uint8_t>>> PageStore::BytesLocked(
    const Copy& copy) {
  if (!copy.in_fast()) return copy.host;
  auto bytes = std::make_shared<std::vector<uint8_t>>(copy.meta.byte_length);
  KV_RETURN_IF_ERROR(fast_->Read(static_cast<uint64_t>(copy.fast_offset), bytes->data(),
                                 bytes->size()));
  return std::shared_ptr<const std::vector<uint8_t>>(std::move(bytes));
}

void PageStore::FreeCopyLocked(const Copy& copy) {
  if (copy.in_fast()) {
    fast_ranges_->Free(static_cast<uint64_t>(copy.fast_offset), copy.meta.byte_length);
    fast_bytes_used_ -= copy.meta.byte_length;
    --fast_forms_;
  } else {
    bytes_used_ -= copy.meta.byte_length;
    --host_forms_;
  }
}

absl::StatusOr<std::vector<FastTierPlacement>> PageStore::PlaceInFastTier(
    const std::vector<std::pair<PageKey, bool>>& forms, uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked(clock_->Now());
  if (fast_ == nullptr) {
    return absl::FailedPreconditionError(
        "this kvstore keeps pages in host memory only (start it with --device for a GPU tier)");
  }
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease ", lease_id, " is unknown or expired; pin again"));
  }
  // Everything is checked before anything moves, and each entry is looked up once.
  std::vector<Entry*> found;
  found.reserve(forms.size());
  for (const auto& [key, recent] : forms) {
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("page ", key.ToHex(), " is absent"));
    }
    if (recent && !it->second.recent.has_value()) {
      return absl::NotFoundError(absl::StrCat("page ", key.ToHex(), " has no BF16_RECENT copy"));
    }
    if (!lease->second.keys.contains(key)) {
      return absl::FailedPreconditionError(
          absl::StrCat("lease ", lease_id, " does not cover page ", key.ToHex()));
    }
    found.push_back(&it->second);
  }
  // Touched first, in order, and then moved up where needed (which changes fast_lru_): the
  // pages are leased, so touching them earlier changes no demotion.
  UseOrder::iterator hint = fast_lru_.end();
  for (size_t i = 0; i < forms.size(); ++i) TouchLocked(forms[i].first, *found[i], &hint);
  std::vector<FastTierPlacement> placements;
  placements.reserve(forms.size());
  bool moved = false;  // a promotion demoted or evicted other pages: look entries up again
  for (size_t i = 0; i < forms.size(); ++i) {
    const auto& [key, recent] = forms[i];
    Entry* entry = moved ? &entries_.at(key) : found[i];
    Copy* copy = recent ? &*entry->recent : &entry->primary;
    if (!copy->in_fast()) {
      const uint64_t n = copy->meta.byte_length;
      std::optional<uint64_t> offset = AllocateFastLocked(n, &key, nullptr);
      if (!offset.has_value()) {
        return absl::ResourceExhaustedError(
            absl::StrCat(fast_->Describe(), " is full of leased pages (", fast_bytes_used_, " of ",
                         fast_ranges_->size(), " bytes); fetch the rest with Fetch"));
      }
      // Demotion above removed or moved other entries: look this one up again.
      moved = true;
      entry = &entries_.at(key);
      copy = recent ? &*entry->recent : &entry->primary;
      absl::Status written = fast_->Write(*offset, copy->host->data(), n);
      if (!written.ok()) {
        fast_ranges_->Free(*offset, n);
        return written;
      }
      IndexFastLocked(key, *entry, /*insert=*/false);
      bytes_used_ -= n;
      --host_forms_;
      copy->host.reset();
      copy->fast_offset = static_cast<int64_t>(*offset);
      fast_bytes_used_ += n;
      ++fast_forms_;
      IndexFastLocked(key, *entry, /*insert=*/true);
      ++stats_.promotions_total;
    }
    placements.push_back({.meta = copy->meta, .offset = static_cast<uint64_t>(copy->fast_offset)});
  }
  return placements;
}

}  // namespace kvstrata::kvstore
