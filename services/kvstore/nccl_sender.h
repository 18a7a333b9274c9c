#pragma once

// The kvstore's side of TRANSPORT_NCCL (docs/kvstore.md#nccl-between-gpus): a pool of 2-rank
// communicators, one per worker that asked for one (OpenTransfer with nccl.setup), the store
// rank 0 and the worker rank 1, each kept warm by a thread of its own; and the sends of each
// transfer, queued on the communicator the worker names and run in the order they were
// answered (NCCL pairs a peer's sends with its receives by order). Every init and every transfer
// has a deadline; a communicator that misses one, or fails, is aborted and forgotten, and its
// worker makes a new one.
//
// Thread-safety: every method may be called concurrently.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/nccl.h"

namespace kvstrata::kvstore {

struct NcclSenderOptions {
  int device = 0;  // the store's GPU (its HBM pool's)
  // How long the worker has to join a new communicator (and the warm-up transfer to end).
  absl::Duration init_timeout = absl::Seconds(30);
  // Each transfer's deadline: this, plus the time its bytes take at `min_bytes_per_second`.
  absl::Duration transfer_timeout = absl::Seconds(2);
  double min_bytes_per_second = 10e9;
  // Communicators alive at once (each costs ~50-100 MB of HBM); more setups are refused.
  int max_communicators = 64;
};

// What the sender has done, for the kvstrata_kvstore_nccl_* metrics (totals since start).
struct NcclSenderCounts {
  uint64_t communicators_made = 0;  // joined by their worker and warmed up
  uint64_t init_failures = 0;       // joins that failed or ran past init_timeout
  uint64_t transfers = 0;           // transfers sent in full
  uint64_t transfer_bytes = 0;
  uint64_t transfer_failures = 0;   // transfers that failed or ran past their deadline
  uint64_t aborts = 0;              // communicators aborted (init or transfer)
  uint64_t live_communicators = 0;  // a gauge: ready or joining now
};

// What a setup answers (OpenTransferResponse's NCCL fields).
struct NcclSetup {
  uint64_t communicator_id = 0;
  std::string unique_id;  // transport::kNcclUniqueIdBytes
  int num_ranks = 2;
  int store_rank = 0;
  int client_rank = 1;
  absl::Duration timeout;
};

// What a queued transfer answers.
struct NcclQueued {
  uint64_t transfer_id = 0;  // 1, 2, ... per communicator, in the order the worker must receive
  absl::Duration timeout;
};

class NcclSender {
 public:
  // `runtime` is borrowed; `pool` is the HBM pool's memory (its sends are from there), borrowed.
  NcclSender(transport::NcclRuntime* runtime, uint8_t* pool, uint64_t pool_bytes,
             const NcclSenderOptions& options);
  ~NcclSender();  // aborts every communicator and joins its thread

  // Makes communicator for `client_id`, joins it as rank 0 in the background and answers what
  // the worker needs to join as rank 1. A worker's earlier communicators are aborted (it asks
  // again only when it lost its own). ResourceExhausted at max_communicators; Unavailable when
  // NCCL cannot make an id.
  absl::StatusOr<NcclSetup> Setup(const std::string& client_id);
  // Whether communicator `id` is joined, warm and unbroken: a transfer on it may be queued.
  bool Ready(uint64_t id) const;
  // Queues one transfer on communicator `id` for `client_id`: `sends` ([offset, bytes) ranges of
  // the pool, in the order the worker receives them) sent as one group. PermissionDenied when
  // the communicator was set up by another client_id (each is bound to its worker's);
  // FailedPrecondition when it is not Ready; Internal for a range outside the pool (the caller's
  // bug: the ranges come from PoolRange of the store's own placements, never from the worker;
  // nothing is queued). `on_done` runs on the communicator's thread when the sends end (OK, or why
  // not), e.g. to release a lease.
  absl::StatusOr<NcclQueued> Queue(uint64_t id, const std::string& client_id,
                                   std::vector<transport::DeviceRange> sends,
                                   std::function<void(const absl::Status&)> on_done);
  // The range of the pool at `offset`, for Queue.
  transport::DeviceRange PoolRange(uint64_t offset, uint64_t bytes) const {
    return {pool_ + offset, bytes};
  }

  NcclSenderCounts Counts() const;
  uint32_t nccl_version() const { return runtime_->version(); }

 private:
  struct Job {
    uint64_t transfer_id = 0;
    std::vector<transport::DeviceRange> sends;
    absl::Time deadline;
    std::function<void(const absl::Status&)> on_done;
  };
  struct Comm {
    uint64_t id = 0;
    std::string client_id;
    std::string unique_id;
    // Set by its thread once joined, under mu_; shared so that a stop can abort it (ending a
    // warm-up or transfer in progress now) while its thread may be letting go of it.
    std::shared_ptr<transport::NcclCommunicator> comm;
    bool join_ended = false;  // joined and warmed up, or failed to
    bool ready = false;
    bool broken = false;  // aborted, or failed to join: the thread ends
    bool failed = false;  // an error or a deadline ended it: no longer live (set before broken)
    bool stopping = false;
    uint64_t next_transfer_id = 1;
    std::deque<Job> jobs;
    std::condition_variable cv;
    std::thread thread;
  };
  void Run(Comm* c);
  // Drops jobs of a broken communicator (their on_done told why); caller holds mu_.
  void FailJobs(Comm* c, const absl::Status& why, std::vector<Job>* failed);
  void ReapLocked(std::vector<std::unique_ptr<Comm>>* done);
  // Tells `c`'s thread to end and adds its communicator, if joined, to `to_abort` (aborted by
  // the caller once mu_ is released); caller holds mu_.
  void StopLocked(Comm* c, std::vector<std::shared_ptr<transport::NcclCommunicator>>* to_abort);

  transport::NcclRuntime* const runtime_;
  uint8_t* const pool_;
  const uint64_t pool_bytes_;
  const NcclSenderOptions options_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Comm>> comms_;  // by id
  uint64_t next_id_;
  NcclSenderCounts counts_;
  std::shared_ptr<transport::DeviceRange> warmup_;  // one small buffer, sent once per communicator
};

}  // namespace kvstrata::kvstore
