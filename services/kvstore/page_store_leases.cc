// The page store's leases: Pin and Release, and the bookkeeping under them (a lease's keys, each
// entry's pin count, expiry on every request), and the leases that holder connections hold. A
// pinned page is never evicted nor moved out of the fast tier (page_store_tiers.cc).

#include <cstdint>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/check.h"
#include "services/kvstore/page_store.h"

namespace kvstrata::kvstore {

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

void PageStore::OpenHolder(uint64_t holder) {
  std::lock_guard<std::mutex> lock(mu_);
  open_holders_.try_emplace(holder, 0);
}

int PageStore::CloseHolder(uint64_t holder) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_holders_.find(holder);
  if (it == open_holders_.end()) return 0;
  std::vector<uint64_t> held;
  for (const auto& [id, lease] : leases_) {
    if (lease.holder == holder) held.push_back(id);
  }
  for (uint64_t id : held) DropLeaseLocked(id);
  open_holders_.erase(holder);
  return static_cast<int>(held.size());
}

absl::Status PageStore::HoldLease(uint64_t lease_id, uint64_t holder) {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLeasesLocked(clock_->Now());
  auto lease = leases_.find(lease_id);
  if (lease == leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
  }
  auto open = open_holders_.find(holder);
  if (holder == 0 || open == open_holders_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool holder ", holder, " has no open connection to this store"));
  }
  if (lease->second.holder == holder) return absl::OkStatus();
  if (lease->second.holder != 0) --open_holders_[lease->second.holder];
  lease->second.holder = holder;
  ++open->second;
  return absl::OkStatus();
}

void PageStore::ExpireLeasesLocked(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.holder == 0 && lease.expiry <= now) expired.push_back(id);
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
  if (it->second.holder != 0) {
    auto holder = open_holders_.find(it->second.holder);
    if (holder != open_holders_.end() && holder->second > 0) --holder->second;
  }
  leases_.erase(it);
}

}  // namespace kvstrata::kvstore
