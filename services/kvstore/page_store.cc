#include "services/kvstore/page_store.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <span>
#include <string>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "core/check.h"
#include "core/page_format.h"

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
    : options_(options), clock_(clock), epoch_(RandomEpoch()) {
  KV_CHECK(clock_ != nullptr);
  KV_CHECK(options_.event_backlog > 0);
}

absl::StatusOr<PutResult> PageStore::Put(const PageMeta& meta, std::vector<uint8_t> bytes) {
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
  if (meta.byte_length > options_.capacity_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("page ", key_hex, ": ", meta.byte_length,
                                                     " bytes exceed the store capacity of ",
                                                     options_.capacity_bytes));
  }

  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time now = clock_->Now();
  ExpireLeasesLocked(now);
  PutResult result;
  auto it = entries_.find(meta.key);
  const bool is_recent = meta.form == PageForm::kBf16Recent;
  if (is_recent) {
    if (it == entries_.end() || it->second.primary.form != PageForm::kInt2) {
      return absl::FailedPreconditionError(
          absl::StrCat("page ", key_hex, ": BF16_RECENT copy without its INT2 primary"));
    }
    if (it->second.recent.has_value()) {
      result.duplicate = true;
      ++stats_.put_duplicates_total;
      return result;
    }
  } else if (it != entries_.end()) {
    if (it->second.primary.form != meta.form) {
      return absl::FailedPreconditionError(absl::StrCat("page ", key_hex, ": stored as ",
                                                        PageFormName(it->second.primary.form),
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
    if (parent->second.primary.page_index + 1 != meta.page_index) {
      return absl::InvalidArgumentError(absl::StrCat("page ", key_hex, ": page_index ",
                                                     meta.page_index, " does not follow parent's ",
                                                     parent->second.primary.page_index));
    }
  }
  // Never evict the parent we attach to, nor (for a copy) the primary it belongs to.
  const PageKey* keep = is_recent ? &meta.key : (has_parent ? &meta.parent_key : nullptr);
  absl::Status room = MakeRoomLocked(meta.byte_length, keep, &result.evicted);
  if (!room.ok()) {
    fprintf(stderr, "kvstore: put of page %s (%s) refused: %s\n", key_hex.c_str(),
            PageFormName(meta.form), std::string(room.message()).c_str());
    return room;
  }

  auto shared = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  if (is_recent) {
    Entry& entry = entries_[meta.key];
    entry.recent = meta;
    entry.recent_bytes = std::move(shared);
    ++recent_copies_;
  } else {
    if (has_parent) {
      Entry& parent = entries_[meta.parent_key];
      if (parent.children++ == 0) leaves_.erase({parent.last_use, meta.parent_key});
    }
    Entry& entry = entries_[meta.key];
    entry.primary = meta;
    entry.primary_bytes = std::move(shared);
    entry.last_use = ++use_tick_;
    leaves_.insert({entry.last_use, meta.key});
  }
  bytes_used_ += meta.byte_length;
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
  for (const PageKey& key : keys) {
    auto it = entries_.find(key);
    if (it == entries_.end()) break;
    Entry& entry = it->second;
    TouchLocked(key, entry);
    PageInfo info{
        .key = key, .primary_form = entry.primary.form, .primary_bytes = entry.primary.byte_length};
    if (entry.recent.has_value()) {
      info.has_bf16_recent = true;
      info.bf16_recent_bytes = entry.recent->byte_length;
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
    page = bf16_recent ? StoredPage{*entry.recent, entry.recent_bytes}
                       : StoredPage{entry.primary, entry.primary_bytes};
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
  stats.bytes_used = bytes_used_;
  stats.bytes_capacity = options_.capacity_bytes;
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
                      .page = entry.primary});
    if (entry.recent.has_value()) {
      events.push_back({.sequence = last_sequence_,
                        .time = now,
                        .snapshot = true,
                        .kind = PageEvent::Kind::kStored,
                        .page = *entry.recent});
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

void PageStore::TouchLocked(const PageKey& key, Entry& entry) {
  if (entry.children == 0) leaves_.erase({entry.last_use, key});
  entry.last_use = ++use_tick_;
  if (entry.children == 0) leaves_.insert({entry.last_use, key});
}

absl::Status PageStore::MakeRoomLocked(uint64_t bytes, const PageKey* keep, uint32_t* evicted) {
  while (bytes_used_ + bytes > options_.capacity_bytes) {
    // The oldest leaf that is neither leased nor the page being attached to.
    auto victim = leaves_.begin();
    while (victim != leaves_.end() &&
           (entries_.at(victim->second).pins > 0 || (keep != nullptr && victim->second == *keep))) {
      ++victim;
    }
    if (victim == leaves_.end()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("store full: ", bytes_used_, " of ", options_.capacity_bytes,
                       " bytes used and no unleased leaf can be evicted; retry later"));
    }
    const PageKey key = victim->second;
    fprintf(stderr, "kvstore: evicting page %s to make room for %llu bytes\n", key.ToHex().c_str(),
            static_cast<unsigned long long>(bytes));
    const uint64_t before = bytes_used_;
    RemoveLocked(key, RemovalReason::kEvicted);
    ++stats_.evictions_total;
    stats_.evicted_bytes_total += before - bytes_used_;
    ++*evicted;
  }
  return absl::OkStatus();
}

void PageStore::RemoveLocked(const PageKey& key, RemovalReason reason) {
  auto it = entries_.find(key);
  KV_CHECK(it != entries_.end()) << "removing absent page " << key.ToHex();
  Entry& entry = it->second;
  KV_CHECK(entry.children == 0 && entry.pins == 0) << "removing a parent or pinned page";
  const absl::Time now = clock_->Now();
  if (entry.recent.has_value()) {
    bytes_used_ -= entry.recent->byte_length;
    --recent_copies_;
    AppendEventLocked(
        {.time = now, .kind = PageEvent::Kind::kRemoved, .page = *entry.recent, .reason = reason});
  }
  bytes_used_ -= entry.primary.byte_length;
  AppendEventLocked(
      {.time = now, .kind = PageEvent::Kind::kRemoved, .page = entry.primary, .reason = reason});
  leaves_.erase({entry.last_use, key});
  if (entry.primary.page_index > 0) {
    auto parent = entries_.find(entry.primary.parent_key);
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
