#pragma once

// Which holder (a decode worker, or a kvstore node) holds which pages, as the router believes from
// their stored/removed events. The router's picture is approximate by design: events arrive
// late, and the index forgets the least recently used keys beyond `max_keys`, so a prediction
// can be wrong in both directions; a wrong prediction costs a cache miss, never wrong output
// (the worker verifies against its own pool).
//
// Memory: one entry per distinct key (16-byte key, a small holder list, an LRU link), at most
// `max_keys` entries. Forgetting least recently *used* keys (stored or matched) drops old chains
// from the leaves inwards in practice, since a match refreshes a chain's leading keys last.
//
// Thread-safety: every method may be called concurrently (one internal mutex).

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "core/radix_hash.h"

namespace kvstrata::router {

struct PrefixIndexOptions {
  size_t max_keys = 1 << 20;  // ~64 MiB of entries at most
};

// Leading pages of one request held by each holder.
struct PrefixMatch {
  // worker id -> number of leading pages of the request that worker holds (only workers with at
  // least one).
  absl::flat_hash_map<std::string, int64_t> worker_pages;
  // Leading pages the kvstore holds, all nodes together: page i counts when some node holds it
  // (any worker can fetch from any node).
  int64_t store_pages = 0;
  // kvstore node -> leading pages of the request that node alone holds (only nodes with at
  // least one; each at most store_pages). A chain lives on the node its first page hashes to,
  // so one node usually holds all store_pages.
  absl::flat_hash_map<std::string, int64_t> store_node_pages;

  int64_t WorkerPages(absl::string_view worker_id) const {
    auto it = worker_pages.find(worker_id);
    return it == worker_pages.end() ? 0 : it->second;
  }
  // 0 for an empty `node` (no node) and for a node holding none of the leading pages.
  int64_t StoreNodePages(absl::string_view node) const {
    if (node.empty()) return 0;
    auto it = store_node_pages.find(node);
    return it == store_node_pages.end() ? 0 : it->second;
  }
};

class PrefixIndex {
 public:
  explicit PrefixIndex(const PrefixIndexOptions& options = {});

  PrefixIndex(const PrefixIndex&) = delete;
  PrefixIndex& operator=(const PrefixIndex&) = delete;

  // A worker's "stored" / "removed" events. Idempotent: storing a held key or removing an
  // absent one is a no-op.
  void OnWorkerStored(absl::string_view worker_id, std::span<const PageKey> keys);
  void OnWorkerRemoved(absl::string_view worker_id, std::span<const PageKey> keys);
  // The worker left (dropped or deregistered): forget everything it held. O(entries).
  void ForgetWorker(absl::string_view worker_id);

  // A kvstore node's events (its WatchEvents stream), fed the same way. `node` names the node
  // (the router uses its --kvstore address); each node's pages are kept apart, so a match tells
  // both what the store holds as a whole and what each node holds.
  void OnStoreStored(absl::string_view node, std::span<const PageKey> keys);
  void OnStoreRemoved(absl::string_view node, std::span<const PageKey> keys);
  // A store of one unnamed node (node "").
  void OnStoreStored(std::span<const PageKey> keys) { OnStoreStored("", keys); }
  void OnStoreRemoved(std::span<const PageKey> keys) { OnStoreRemoved("", keys); }
  // Forget every page of one kvstore node (its stream restarts with a snapshot, or the node has
  // been unreachable too long). O(entries).
  void ForgetStoreNode(absl::string_view node);

  // For a request's page keys [num_pages] in order: the leading pages each holder holds
  // (longest prefix per holder). Walks the keys until no holder still matches, so the cost is
  // O(matched pages × holders per key). Refreshes the walked keys in the LRU.
  PrefixMatch Match(std::span<const PageKey> keys);

  size_t size() const;

 private:
  using HolderId = uint32_t;

  struct Entry {
    absl::InlinedVector<HolderId, 4> holders;
    std::list<PageKey>::iterator lru;  // position in lru_ (front = most recent)
  };

  HolderId HolderFor(absl::string_view worker_id);
  HolderId StoreHolderFor(absl::string_view node);
  void StoredLocked(HolderId holder, std::span<const PageKey> keys);
  void RemovedLocked(HolderId holder, std::span<const PageKey> keys);
  void ForgetHolderLocked(HolderId holder);
  void Touch(Entry& entry);

  const PrefixIndexOptions options_;
  mutable std::mutex mu_;
  // All guarded by mu_.
  absl::flat_hash_map<PageKey, Entry> entries_;
  std::list<PageKey> lru_;
  absl::flat_hash_map<std::string, HolderId> holder_ids_;  // workers
  absl::flat_hash_map<std::string, HolderId> store_ids_;   // kvstore nodes
  std::vector<std::string> holder_names_;                  // [holder id]
  std::vector<bool> holder_is_store_;                      // [holder id]
};

}  // namespace kvstrata::router
