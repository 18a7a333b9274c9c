#pragma once

// The workers the router knows: who they are, where they listen and how loaded they are.
// Workers come from flags (static, never expire) and from registration with heartbeats (dropped
// once silent for longer than `max_missed_heartbeats` heartbeat intervals).
//
// Thread-safety: every method may be called concurrently (one internal mutex). Routing works on
// a Snapshot(), a copy, so a decision never holds the lock.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvstrata::router {

// Time source for heartbeat expiry; tests inject a fake.
// The clock seam lives in core/clock.h.
using ::kvstrata::Clock;
using ::kvstrata::SystemClock;

// A worker's load as it last reported it. Counts, not rates.
struct WorkerLoad {
  int64_t running = 0;      // requests decoding now
  int64_t waiting = 0;      // requests queued, not yet admitted
  int64_t free_pages = 0;   // KV pages free in the worker's pool
  int64_t total_pages = 0;  // KV pages in the worker's pool

  // The queue length every policy compares: running + waiting.
  int64_t requests() const { return running + waiting; }
};

struct WorkerInfo {
  std::string id;       // unique, chosen by the worker (or the flag)
  std::string address;  // host:port of its gRPC endpoint
  WorkerLoad load;
  absl::Time last_heartbeat;  // on the table's clock
  bool is_static = false;     // from flags: never expires
  // The GPU on which the worker maps kvstore HBM pools (RegisterWorkerRequest.same_gpu_uuid);
  // empty: none (a CPU worker, the transport off, an older or a static worker).
  std::string same_gpu_uuid;
  // The kvstore node (as the router names it: its --kvstore address) whose HBM pool is on that
  // GPU, so its pages reach this worker by the same-GPU transport; empty: no node is known to
  // share the worker's GPU. Not kept by the table: the router fills it in each snapshot it
  // routes on (Router::LiveWorkers), from what it learnt of the nodes' GPUs.
  std::string colocated_kvstore;
};

struct WorkerTableOptions {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A registered worker silent for more than max_missed_heartbeats * heartbeat_interval is
  // dropped.
  int max_missed_heartbeats = 3;
};

class WorkerTable {
 public:
  // `clock` is borrowed and must outlive the table. Non-positive options are a programming
  // error (checked): main validates flags first.
  WorkerTable(const WorkerTableOptions& options, const Clock* clock);

  WorkerTable(const WorkerTable&) = delete;
  WorkerTable& operator=(const WorkerTable&) = delete;

  // Adds a worker from flags; it never expires. InvalidArgument for an empty id or address,
  // AlreadyExists if the id is known.
  absl::Status AddStatic(absl::string_view id, absl::string_view address);

  // Registration: adds the worker or refreshes it (new address, load and same-GPU UUID,
  // heartbeat now). Idempotent. A static worker that registers stays static. InvalidArgument for
  // an empty id or address.
  absl::Status Register(absl::string_view id, absl::string_view address, const WorkerLoad& load,
                        absl::string_view same_gpu_uuid = {});

  // A heartbeat with the current load. NotFound if the worker is unknown (never registered, or
  // already dropped: it must register again).
  absl::Status Heartbeat(absl::string_view id, const WorkerLoad& load);

  // A sign of life other than a heartbeat (the worker just streamed a message to the router):
  // counts as a heartbeat for expiry, load unchanged. A worker busy serving stays in the pool
  // even when its heartbeats are late. No effect on an unknown worker.
  void Touch(absl::string_view id);

  // Removes a worker (deregistration or a failed health check). False if it was unknown.
  bool Remove(absl::string_view id);

  // Drops the registered workers silent for too long; returns their ids, sorted.
  std::vector<std::string> ExpireStale();

  // The live workers (expiring the stale ones first), sorted by id, so policies that cycle or
  // break ties by order are deterministic. A worker dropped here leaves its entries in the
  // PrefixIndex until the caller forgets them (ExpireStale returns the ids to forget); they are
  // harmless meanwhile, since policies only look at the snapshot's workers.
  std::vector<WorkerInfo> Snapshot();

  size_t size() const;

 private:
  std::vector<std::string> ExpireStaleLocked();

  const WorkerTableOptions options_;
  const Clock* const clock_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, WorkerInfo> workers_;  // guarded by mu_
};

}  // namespace kvstrata::router
