#pragma once

// A client of kvstrata.v1.KvStore for the decode workers: Lookup, Put (streamed, XXH3-checked)
// and Fetch (checksums verified) with a deadline on every call, and a consistent-hash ring that
// spreads prefix chains over several stores.
//
// The store is a cache: a down, slow or restarted store must cost a miss, never a hang or a
// failed request. Every call is bounded by its deadline; a store that cannot be reached or does
// not answer in time comes back as UNAVAILABLE or DEADLINE_EXCEEDED, and IsStoreMiss() tells a
// caller which errors to treat as "not cached" (then it computes the pages itself).
//
// Thread-safety: KvStoreClient is thread-safe (a gRPC channel and stub). HashRing and
// KvStoreRing are thread-compatible: change the ring from one thread, or guard it.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/page_mac.h"
#include "core/radix_hash.h"
#include "kvstrata/v1/kvstore.grpc.pb.h"

namespace kvstrata::kvstore {

struct KvStoreClientOptions {
  // Per-call deadlines. Lookup sits on the request path before prefill, so it is short.
  absl::Duration lookup_deadline = absl::Milliseconds(200);
  absl::Duration put_deadline = absl::Seconds(5);
  absl::Duration fetch_deadline = absl::Seconds(2);
  // Put chunk size in bytes (the server's message limit is 4 MiB).
  size_t put_chunk_bytes = size_t{1} << 20;
  // Largest Fetch chunk asked for; 0 = the server's default.
  uint32_t fetch_max_chunk_bytes = 0;
  // Makes the channel to a store (rpc::TransportSecurity::Dial under TLS); empty: plaintext.
  std::function<std::shared_ptr<grpc::Channel>(const std::string& address)> dial;
  // The pool's page MAC keys (core/page_mac.h): Put MACs every page, Fetch refuses a page
  // whose MAC does not match (DATA_LOSS, a miss). Null: pages are neither MACed nor checked.
  std::shared_ptr<const PageMacKeys> page_mac_keys;
};

// One page to publish: whole page bytes (header included, docs/kv-format.md) and where it sits
// in its chain. Put pages parent-first; page 0's parent is the namespace key.
struct PutPage {
  PageKey key;
  PageKey parent_key;
  uint32_t page_index = 0;
  v1::PageEncoding encoding = v1::PAGE_ENCODING_BF16;  // BF16, INT2 or BF16_RECENT
  std::string bytes;
};

struct PutSummary {
  uint32_t pages_stored = 0;
  uint32_t pages_already_present = 0;
  uint32_t pages_evicted = 0;
};

struct LookupReply {
  uint32_t matched_pages = 0;       // leading keys present
  std::vector<v1::PageInfo> pages;  // [matched_pages], or empty when not asked for
  uint64_t lease_id = 0;            // when a lease was asked for and pages matched
};

struct FetchedPage {
  PageKey key;
  v1::PageEncoding encoding = v1::PAGE_ENCODING_UNSPECIFIED;
  std::string bytes;  // whole page, checksum verified
};

// True for the errors a caller treats as a cache miss rather than a failure: the store is down
// or slow (UNAVAILABLE, DEADLINE_EXCEEDED), a page went away (NOT_FOUND, FAILED_PRECONDITION
// for an expired lease), or its bytes were corrupt (DATA_LOSS).
bool IsStoreMiss(const absl::Status& status);

class KvStoreClient {
 public:
  // Dials lazily: creating a client never blocks, and an unreachable address shows up as a miss
  // on the first call.
  KvStoreClient(std::string address, const KvStoreClientOptions& options = {});
  ~KvStoreClient();

  const std::string& address() const { return address_; }

  // The longest stored prefix of `keys` (page 0 first). Read-only, safe to retry.
  // lease_ttl_ms > 0 pins the hits (LookupReply::lease_id). page_infos = false asks only for
  // the count and the lease (LookupRequest::matched_count_only; `pages` then stays empty).
  absl::StatusOr<LookupReply> Lookup(std::span<const PageKey> keys, uint32_t lease_ttl_ms = 0,
                                     bool page_infos = true);
  // Publishes pages in one stream, each with its XXH3-64 checksum. Idempotent; retrying the
  // whole call is safe. Errors name the store and, from the store, the failing key.
  absl::StatusOr<PutSummary> Put(std::span<const PutPage> pages);
  // The pages, in order; UNSPECIFIED asks for a page's primary form. Every page's length and
  // checksum are verified (DATA_LOSS otherwise). NOT_FOUND when a page is absent.
  absl::StatusOr<std::vector<FetchedPage>> Fetch(
      std::span<const std::pair<PageKey, v1::PageEncoding>> pages, uint64_t lease_id = 0);
  // Negotiates the transport of some pages (docs/api.md#opentransfer); bounded by the lookup
  // deadline.
  absl::StatusOr<v1::OpenTransferResponse> OpenTransfer(const v1::OpenTransferRequest& request);
  // Ends a lease early, so its pages can be evicted again. Idempotent; a lease that expired or
  // was released already is OK. Bounded by the lookup deadline.
  absl::Status Release(uint64_t lease_id);

 private:
  std::string address_;
  KvStoreClientOptions options_;
  std::unique_ptr<v1::KvStore::Stub> stub_;
};

// Consistent hashing of prefix chains onto store nodes. Each node owns `virtual_nodes` points on
// a 64-bit ring (XXH3-64 of "node#i"); a chain goes to the owner of the first point at or after
// the first 8 bytes of its FIRST page key, so every page of a chain lives on one store and a
// Lookup of a prefix asks one node. Adding or removing a node moves only the chains that node
// gains or owned.
class HashRing {
 public:
  explicit HashRing(int virtual_nodes = 128);
  // Idempotent: adding a present node or removing an absent one changes nothing.
  void Add(const std::string& node);
  void Remove(const std::string& node);
  // The node for a chain whose first page key is `first_page_key`; "" when the ring is empty.
  std::string NodeFor(const PageKey& first_page_key) const;
  size_t size() const { return members_.size(); }

 private:
  int virtual_nodes_;
  std::set<std::string> members_;
  std::map<uint64_t, std::string> points_;
};

// When a store stops answering, its chains move to the others for a while, so that they are
// published and found again there instead of missing until it returns.
struct KvStoreRingHealthOptions {
  // Consecutive calls that failed as "down or slow" (UNAVAILABLE, DEADLINE_EXCEEDED) before a
  // store is taken out of the ring.
  int failures_to_eject = 3;
  // How long it stays out; then it is tried again, and one more such failure takes it out again.
  absl::Duration ejection = absl::Seconds(10);
};

// Several stores behind one ring: a client per address, chosen by a chain's first page key.
// A store that keeps failing is ejected from the ring for a while: only its share of the chains
// moves (consistent hashing), to the stores next to it on the ring, and moves back when it
// returns. Chains that moved miss once and are then published to their new store.
class KvStoreRing {
 public:
  explicit KvStoreRing(const KvStoreClientOptions& options = {}, int virtual_nodes = 128,
                       const KvStoreRingHealthOptions& health = {});
  void AddStore(const std::string& address);
  void RemoveStore(const std::string& address);
  // The store for a chain; nullptr when there is none (a miss). Brings back ejected stores
  // whose time is up.
  KvStoreClient* ForChain(const PageKey& first_page_key);
  // The outcome of a call to `address`. Returns true when this failure ejected the store.
  bool ReportResult(const std::string& address, const absl::Status& status);
  // Stores currently ejected, sorted.
  std::vector<std::string> Ejected() const;
  // Every store's client (ejected or not), valid while the store is in the ring.
  std::vector<KvStoreClient*> Clients() const;

 private:
  struct Health {
    int consecutive_failures = 0;
    bool ejected = false;
    absl::Time back_at;
  };
  KvStoreClientOptions options_;
  KvStoreRingHealthOptions health_options_;
  HashRing ring_;
  absl::flat_hash_map<std::string, std::unique_ptr<KvStoreClient>> clients_;
  absl::flat_hash_map<std::string, Health> health_;
};

}  // namespace kvstrata::kvstore
