#include "services/kvstore/page_store.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/page_digest.h"
#include "core/page_format.h"
#include "core/status_macros.h"

namespace kvstrata::kvstore {
namespace {

uint64_t Checksum(const std::vector<uint8_t>& bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t RandomEpoch() {
  absl::BitGen gen;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = absl::Uniform<uint64_t>(gen);
  return epoch;
}

bool FormMatchesEncoding(PageForm form, PageEncoding encoding) {
  switch (form) {
    case PageForm::kBf16:
    case PageForm::kBf16Recent:
      return encoding == PageEncoding::kBf16;
    case PageForm::kInt2:
      return kernels::IsInt2(encoding);
  }
  return false;
}

}  // namespace

const char* PageFormName(PageForm form) {
  switch (form) {
    case PageForm::kBf16:
      return "BF16";
    case PageForm::kInt2:
      return "INT2";
    case PageForm::kBf16Recent:
      return "BF16_RECENT";
  }
  return "?";
}

PageStore::PageStore(const PageStoreOptions& options, const Clock* clock)
    : options_(options), clock_(clock), epoch_(RandomEpoch()), fast_(options.fast_tier) {
  KV_CHECK(clock_ != nullptr);
  KV_CHECK(options_.event_backlog > 0);
  if (fast_ != nullptr) fast_ranges_.emplace(fast_->size());
}

absl::StatusOr<PutResult> PageStore::Put(const PageMeta& meta_in, std::vector<uint8_t> bytes) {
  PageMeta meta = meta_in;
  const std::string key_hex = meta.key.ToHex();
  // Validation that needs no lock: checksum and page header.
  if (bytes.size() != meta.byte_length) {
    return absl::InvalidArgumentError(absl::StrCat("page ", key_hex, ": got ", bytes.size(),
                                                   " bytes, header says ", meta.byte_length));
  }
  if (Checksum(bytes) != meta.checksum_xxh3_64) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.checksum_failures_total;
    }
    fprintf(stderr, "kvstore: put of page %s (%s) rejected: checksum mismatch\n", key_hex.c_str(),
            PageFormName(meta.form));
    return absl::DataLossError(
        absl::StrCat("page ", key_hex, ": data does not match checksum_xxh3_64"));
  }
  absl::StatusOr<PageRef> parsed = ParsePage(std::span<const uint8_t>(bytes));
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", key_hex, ": invalid page bytes: ", parsed.status().message()));
  }
  if (parsed->key() != meta.key) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", key_hex, ": page bytes carry key ", parsed->key().ToHex()));
  }
  if (parsed->parent_key() != meta.parent_key) {
    return absl::InvalidArgumentError(
        absl::StrCat("page ", key_hex, ": parent_key differs from the page bytes' parent key ",
                     parsed->parent_key().ToHex()));
  }
  if (parsed->header.page_index != meta.page_index) {
    return absl::InvalidArgumentError(absl::StrCat("page ", key_hex, ": page_index ",
                                                   meta.page_index, " but the page bytes say ",
                                                   parsed->header.page_index));
  }
  if (!FormMatchesEncoding(meta.form, parsed->encoding)) {
    return absl::InvalidArgumentError(absl::StrCat("page ", key_hex, ": encoding ",
                                                   PageFormName(meta.form), " but the bytes are ",
                                                   PageEncodingName(parsed->encoding)));
  }
  const uint64_t largest_tier =
      std::max<uint64_t>(options_.capacity_bytes, fast_ != nullptr ? fast_ranges_->size() : 0);
  if (meta.byte_length > largest_tier) {
    return absl::ResourceExhaustedError(absl::StrCat("page ", key_hex, ": ", meta.byte_length,
                                                     " bytes exceed the store capacity of ",
                                                     largest_tier));
  }
  meta.digest64 = PageDigest64(bytes.data(), bytes.size());

  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  ExpireLeasesLocked(now);
  PutResult result;
  auto it = entries_.find(meta.key);
  const bool is_recent = meta.form == PageForm::kBf16Recent;
  if (is_recent) {
    if (it == entries_.end() || it->second.primary.meta.form != PageForm::kInt2) {
      return absl::FailedPreconditionError(
          absl::StrCat("page ", key_hex, ": BF16_RECENT copy without its INT2 primary"));
    }
    if (it->second.recent.has_value()) {
      result.duplicate = true;
      ++stats_.put_duplicates_total;
      return result;
    }
  } else if (it != entries_.end()) {
    if (it->second.primary.meta.form != meta.form) {
      return absl::FailedPreconditionError(absl::StrCat("page ", key_hex, ": stored as ",
                                                        PageFormName(it->second.primary.meta.form),
                                                        ", not ", PageFormName(meta.form)));
    }
    result.duplicate = true;
    ++stats_.put_duplicates_total;
    return result;
  }
  const bool has_parent = !is_recent && meta.page_index > 0;
  if (has_parent) {
    auto parent = entries_.find(meta.parent_key);
    if (parent == entries_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("page ", key_hex, ": parent page ", meta.parent_key.ToHex(), " is absent"));
    }
    if (parent->second.primary.meta.page_index + 1 != meta.page_index) {
      return absl::InvalidArgumentError(absl::StrCat("page ", key_hex, ": page_index ",
                                                     meta.page_index, " does not follow parent's ",
                                                     parent->second.primary.meta.page_index));
    }
  }
  // Never evict the parent we attach to, nor (for a copy) the primary it belongs to.
  const PageKey* keep = is_recent ? &meta.key : (has_parent ? &meta.parent_key : nullptr);
  absl::StatusOr<Copy> copy = PlaceLocked(meta, std::move(bytes), keep, &result.evicted);
  if (!copy.ok()) {
    fprintf(stderr, "kvstore: put of page %s (%s) refused: %s\n", key_hex.c_str(),
            PageFormName(meta.form), std::string(copy.status().message()).c_str());
    return copy.status();
  }
  if (is_recent) {
    Entry& entry = entries_.at(meta.key);
    IndexFastLocked(meta.key, entry, /*insert=*/false);
    entry.recent = *std::move(copy);
    IndexFastLocked(meta.key, entry, /*insert=*/true);
    ++recent_copies_;
  } else {
    if (has_parent) {
      Entry& parent = entries_.at(meta.parent_key);
      if (parent.children++ == 0) leaves_.erase({parent.last_use, meta.parent_key});
    }
    Entry& entry = entries_[meta.key];
    entry.primary = *std::move(copy);
    entry.last_use = ++use_tick_;
    leaves_.insert({entry.last_use, meta.key});
    IndexFastLocked(meta.key, entry, /*insert=*/true);
  }
  ++stats_.pages_stored_total;
  result.stored = true;
  AppendEventLocked({.time = now, .kind = PageEvent::Kind::kStored, .page = meta});
  return result;
}

absl::StatusOr<LookupResult> PageStore::Lookup(const std::vector<PageKey>& keys,
                                               absl::Duration lease_ttl) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  ExpireLeasesLocked(now);
  LookupResult result;
  UseOrder::iterator hint = fast_lru_.end();
  for (const PageKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) break;
    Entry& entry = it->second;
    TouchLocked(key, entry, &hint);
    PageInfo info{.key = key,
                  .primary_form = entry.primary.meta.form,
                  .primary_bytes = entry.primary.meta.byte_length};
    if (entry.recent.has_value()) {
      info.has_bf16_recent = true;
      info.bf16_recent_bytes = entry.recent->meta.byte_length;
    }
    result.pages.push_back(info);
  }
  ++stats_.lookups_total;
  stats_.lookup_pages_total += keys.size();
  stats_.lookup_hit_pages_total += result.pages.size();
  if (lease_ttl > absl::ZeroDuration() && !result.pages.empty()) {
    std::vector<PageKey> hits(keys.begin(), keys.begin() + result.pages.size());
    absl::StatusOr<PinResult> pin = PinLocked(hits, lease_ttl, /*lease_id=*/0, now);
    if (!pin.ok()) return pin.status();
    result.lease_id = pin->lease_id;
  }
  return result;
}

absl::StatusOr<std::vector<PageKey>> PageStore::ChainEndingAt(const PageKey& last_key,
                                                              uint32_t page_count,
                                                              const PageKey& first_parent) {
  if (page_count == 0) return absl::InvalidArgumentError("page_count must be at least 1");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(last_key);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("page ", last_key.ToHex(), " is absent"));
  }
  const uint32_t last_index = it->second.primary.meta.page_index;
  if (page_count > last_index + uint64_t{1}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_count=", page_count, ", but page ", last_key.ToHex(), " is page_index ", last_index,
        ": a chain ending there has ", last_index + uint64_t{1}, " pages"));
  }
  // Filled from the back: keys[i] is page last_index - (page_count - 1) + i.
  std::vector<PageKey> keys(page_count);
  keys[page_count - 1] = last_key;
  for (uint32_t i = page_count - 1; i > 0; --i) {
    const PageMeta& child = it->second.primary.meta;
    it = entries_.find(child.parent_key);
    // The store keeps only whole chains, so a missing parent or an index out of step means
    // pages stored with inconsistent headers: a miss for the caller, never a crash.
    if (it == entries_.end() || it->second.primary.meta.page_index + 1 != child.page_index) {
      return absl::NotFoundError(
          absl::StrCat("the parent of page ", child.key.ToHex(), " (page_index ", child.page_index,
                       ") is not in the store as page_index ", child.page_index - 1));
    }
    keys[i - 1] = child.parent_key;
  }
  const PageMeta& first = it->second.primary.meta;
  if (first.parent_key != first_parent) {
    return absl::NotFoundError(absl::StrCat(
        "the run of ", page_count, " pages ending at page ", last_key.ToHex(),
        " starts after page ", first.parent_key.ToHex(), ", not after ", first_parent.ToHex()));
  }
  return keys;
}

absl::StatusOr<PinResult> PageStore::Pin(const std::vector<PageKey>& keys, absl::Duration ttl,
                                         uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  ExpireLeasesLocked(now);
  return PinLocked(keys, ttl, lease_id, now);
}

absl::StatusOr<PinResult> PageStore::PinLocked(const std::vector<PageKey>& keys, absl::Duration ttl,
                                               uint64_t lease_id, absl::Time now) {
  if (ttl <= absl::ZeroDuration() || ttl > options_.max_lease_ttl) {
    return absl::InvalidArgumentError(
        absl::StrCat("ttl_ms must be in 1..", absl::ToInt64Milliseconds(options_.max_lease_ttl),
                     ", got ", absl::ToInt64Milliseconds(ttl)));
  }
  Lease* lease = nullptr;
  if (lease_id != 0) {
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
      return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
    }
    lease = &it->second;
  } else {
    if (leases_.size() >= options_.max_leases) {
      fprintf(stderr, "kvstore: lease refused: %zu live leases (max_leases)\n", leases_.size());
      return absl::ResourceExhaustedError(
          absl::StrCat("the store holds max_leases=", options_.max_leases, " leases"));
    }
    lease_id = next_lease_id_++;
    lease = &leases_[lease_id];
  }
  lease->expiry = now + ttl;
  // One allocation rather than a rehash per doubling (a 100K-token prefix is 1,600 keys).
  lease->keys.reserve(lease->keys.size() + keys.size());
  PinResult result{.lease_id = lease_id, .expires_in = ttl};
  for (size_t i = 0; i < keys.size(); ++i) {
    auto it = entries_.find(keys[i]);
    if (it == entries_.end()) {
      result.missing_indices.push_back(static_cast<uint32_t>(i));
      continue;
    }
    ++result.pinned_pages;
    if (lease->keys.insert(keys[i]).second && it->second.pins++ == 0) ++pinned_pages_;
  }
  return result;
}

bool PageStore::Release(uint64_t lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked(clock_->Now());
  if (!leases_.contains(lease_id)) return false;
  DropLeaseLocked(lease_id);
  return true;
}

absl::StatusOr<StoredPage> PageStore::Fetch(const PageKey& key, bool bf16_recent,
                                            uint64_t lease_id) {
  StoredPage page;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ExpireLeasesLocked(clock_->Now());
    if (lease_id != 0 && !leases_.contains(lease_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("lease ", lease_id, " is unknown or expired; pin again"));
    }
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      return absl::NotFoundError(absl::StrCat("page ", key.ToHex(), " is absent"));
    }
    Entry& entry = it->second;
    if (bf16_recent && !entry.recent.has_value()) {
      return absl::NotFoundError(absl::StrCat("page ", key.ToHex(), " has no BF16_RECENT copy"));
    }
    TouchLocked(key, entry);
    const Copy& copy = bf16_recent ? *entry.recent : entry.primary;
    KV_ASSIGN_OR_RETURN(page.bytes, BytesLocked(copy));
    page.meta = copy.meta;
    if (copy.in_fast()) ++stats_.fetched_fast_pages_total;
  }
  // Hash outside the lock: the bytes are immutable and shared.
  if (Checksum(*page.bytes) != page.meta.checksum_xxh3_64) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.checksum_failures_total;
    fprintf(stderr, "kvstore: page %s (%s) found corrupt on read; removing it\n",
            key.ToHex().c_str(), PageFormName(page.meta.form));
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.pins == 0 && it->second.children == 0) {
      RemoveLocked(key, RemovalReason::kCorrupted);
    }
    return absl::DataLossError(absl::StrCat("page ", key.ToHex(), " is corrupt in the store"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.fetched_pages_total;
  stats_.fetched_bytes_total += page.bytes->size();
  return page;
}

PageStoreStats PageStore::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked(clock_->Now());
  PageStoreStats stats = stats_;
  stats.pages = entries_.size();
  stats.bf16_recent_copies = recent_copies_;
  stats.bytes_used = bytes_used_ + fast_bytes_used_;
  stats.bytes_capacity = options_.capacity_bytes + (fast_ != nullptr ? fast_ranges_->size() : 0);
  stats.host_bytes_used = bytes_used_;
  stats.host_forms = host_forms_;
  stats.fast_bytes_used = fast_bytes_used_;
  stats.fast_forms = fast_forms_;
  stats.fast_bytes_capacity = fast_ != nullptr ? fast_ranges_->size() : 0;
  stats.pinned_pages = pinned_pages_;
  stats.active_leases = static_cast<uint32_t>(leases_.size());
  stats.last_event_sequence = last_sequence_;
  return stats;
}

std::pair<std::vector<PageEvent>, uint64_t> PageStore::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  std::vector<PageEvent> events;
  events.reserve(entries_.size() + recent_copies_);
  for (const auto& [key, entry] : entries_) {
    events.push_back({.sequence = last_sequence_,
                      .time = now,
                      .snapshot = true,
                      .kind = PageEvent::Kind::kStored,
                      .page = entry.primary.meta});
    if (entry.recent.has_value()) {
      events.push_back({.sequence = last_sequence_,
                        .time = now,
                        .snapshot = true,
                        .kind = PageEvent::Kind::kStored,
                        .page = entry.recent->meta});
    }
  }
  // A child's page_index is its parent's plus one (checked on Put), so ordering by index puts
  // parents first; a copy sorts after its primary.
  std::stable_sort(events.begin(), events.end(), [](const PageEvent& a, const PageEvent& b) {
    return std::make_pair(a.page.page_index, a.page.form == PageForm::kBf16Recent) <
           std::make_pair(b.page.page_index, b.page.form == PageForm::kBf16Recent);
  });
  return {std::move(events), last_sequence_};
}

std::vector<PageEvent> PageStore::WaitForEvents(uint64_t after_sequence, absl::Time deadline,
                                                size_t max_events) {
  std::unique_lock<std::mutex> lock(mu_);
  while (last_sequence_ <= after_sequence || events_.empty()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return {};
    events_cv_.wait_for(lock, absl::ToChronoMilliseconds(left) + std::chrono::milliseconds(1));
  }
  std::vector<PageEvent> out;
  const uint64_t first_kept = events_.front().sequence;
  size_t start = after_sequence < first_kept ? 0 : after_sequence - first_kept + 1;
  for (size_t i = start; i < events_.size() && out.size() < max_events; ++i) {
    out.push_back(events_[i]);
  }
  return out;
}

void PageStore::ExpireLeasesLocked(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.expiry <= now) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    DropLeaseLocked(id);
    ++stats_.leases_expired_total;
  }
}

void PageStore::DropLeaseLocked(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  KV_CHECK(it != leases_.end()) << "lease " << lease_id;
  for (const PageKey& key : it->second.keys) {
    auto entry = entries_.find(key);
    KV_CHECK(entry != entries_.end() && entry->second.pins > 0) << "pinned page " << key.ToHex();
    if (--entry->second.pins == 0) --pinned_pages_;
  }
  leases_.erase(it);
}

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

void PageStore::RemoveLocked(const PageKey& key, RemovalReason reason) {
  auto it = entries_.find(key);
  KV_CHECK(it != entries_.end()) << "removing absent page " << key.ToHex();
  Entry& entry = it->second;
  KV_CHECK(entry.children == 0 && entry.pins == 0) << "removing a parent or pinned page";
  const absl::Time now = clock_->Now();
  IndexFastLocked(key, entry, /*insert=*/false);
  if (entry.recent.has_value()) {
    FreeCopyLocked(*entry.recent);
    --recent_copies_;
    AppendEventLocked({.time = now,
                       .kind = PageEvent::Kind::kRemoved,
                       .page = entry.recent->meta,
                       .reason = reason});
  }
  FreeCopyLocked(entry.primary);
  AppendEventLocked({.time = now,
                     .kind = PageEvent::Kind::kRemoved,
                     .page = entry.primary.meta,
                     .reason = reason});
  leaves_.erase({entry.last_use, key});
  if (entry.primary.meta.page_index > 0) {
    auto parent = entries_.find(entry.primary.meta.parent_key);
    KV_CHECK(parent != entries_.end()) << "parent of " << key.ToHex();
    if (--parent->second.children == 0) {
      leaves_.insert({parent->second.last_use, parent->first});
    }
  }
  entries_.erase(it);
}

void PageStore::AppendEventLocked(PageEvent event) {
  event.sequence = ++last_sequence_;
  events_.push_back(std::move(event));
  while (events_.size() > options_.event_backlog) events_.pop_front();
  events_cv_.notify_all();
}

}  // namespace kvstrata::kvstore
