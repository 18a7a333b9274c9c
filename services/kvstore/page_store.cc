// The page store's requests on pages and its chain invariant: Put (the checks of the bytes
// against their description, attaching a page to its parent), Lookup and ChainEndingAt (walks of
// the prefix index), Fetch (re-checking the checksum on the way out), Stats, and RemoveLocked,
// which undoes what Put did. Leases are in page_store_leases.cc, the tiers and eviction in
// page_store_tiers.cc, the event log in page_store_events.cc.

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
    case PageForm::kInt2:  // the history form: INT2, or a history codec's page
      return kernels::IsInt2(encoding) || kernels::IsCodec(encoding);
  }
  return false;
}

// The bytes are a valid page whose own header agrees with what the writer said of it (key,
// parent, index, encoding); each error names the page.
absl::Status CheckHeaderMatchesMeta(const PageMeta& meta, const std::vector<uint8_t>& bytes,
                                    const std::string& key_hex) {
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
  return absl::OkStatus();
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
  KV_RETURN_IF_ERROR(CheckHeaderMatchesMeta(meta, bytes, key_hex));
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
  stats.open_holders = static_cast<uint32_t>(open_holders_.size());
  for (const auto& [holder, held] : open_holders_) stats.held_leases += held;
  stats.last_event_sequence = last_sequence_;
  return stats;
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

}  // namespace kvstrata::kvstore
