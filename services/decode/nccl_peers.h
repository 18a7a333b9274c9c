#pragma once

// The decode worker's side of TRANSPORT_NCCL (docs/kvstore.md#nccl-between-gpus): one 2-rank
// communicator per kvstore on another GPU, made in the background when the worker starts
// (Prepare, for every store of its ring; OpenTransfer with nccl.setup, then a non-blocking join
// as rank 1 and the store's warm-up) and kept; and a receive slab per store on the worker's GPU,
// registered with the communicator, into which a fetch's pages arrive in one grouped receive, their
// digests checked on the GPU (by a digest checker made with the slab, on a stream of its own)
// before they are handed on. A communicator that misses a deadline or fails is aborted and made
// again, in the background, after a pause; the fetch it failed is a miss.
//
// One transfer per store at a time (NCCL pairs a peer's sends and receives by order, and the
// slab holds one transfer): a Lane is that right, held from before OpenTransfer until the pages
// have been copied out of the slab (the decode service hands it to the engine, which lets go
// of it once it has imported them, not at the end of the request). Thread-safe.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv_cache.h"
#include "kvstrata/v1/kvstore.pb.h"
#include "services/kvstore/client.h"
#include "transport/nccl.h"

namespace kvstrata::decode {

struct NcclPeersOptions {
  int device = -1;        // the worker's GPU
  std::string gpu_uuid;   // its "GPU-..." id, sent as device.gpu_uuid
  std::string client_id;  // the worker's id: a store binds its communicators to it
  uint64_t receive_bytes = uint64_t{1} << 30;  // per store: the largest transfer taken
  // The longest this worker waits for one transfer's bytes, whatever the store's
  // transfer_timeout_ms says (a store could name hours); the request's deadline may end the wait
  // sooner. Past it the communicator is aborted and the fetch is a miss.
  absl::Duration max_receive_wait = absl::Seconds(5);
  // Per store: the most pages one transfer carries, which sizes its digest checker's scratch
  // (allocated once, with the slab). 0: receive_bytes / 256, every page at its own 256-byte
  // step, the densest the store places them. The decode service passes its longest prompt.
  size_t max_transfer_pages = 0;
  absl::Duration setup_retry = absl::Seconds(10);  // after a failed setup, before the next
  // After a store answered that NCCL is not possible with it (FAILED_PRECONDITION: a store
  // without a GPU tier or NCCL, or on this very GPU), before it is asked again.
  absl::Duration unsupported_retry = absl::Minutes(10);
  kernels::PageEncoding int2_encoding = kernels::PageEncoding::kInt2Uniform;
};

// Totals since start, for the kvstrata_decode_nccl_* metrics.
struct NcclPeersCounts {
  uint64_t communicators_made = 0;
  uint64_t setup_failures = 0;  // setups refused, joins failed or past their deadline
  uint64_t transfers = 0;       // received in full with every digest right
  uint64_t transfer_bytes = 0;
  uint64_t transfer_failures = 0;  // errors and missed deadlines (the communicator aborted)
  uint64_t digest_failures = 0;    // pages that arrived wrong (a miss; communicator kept)
  uint64_t aborts = 0;
  uint64_t busy = 0;  // fetches that found the store's lane in use
};

class NcclPeers {
 public:
  class Lane;

  // `runtime` is borrowed and outlives this.
  NcclPeers(transport::NcclRuntime* runtime, const NcclPeersOptions& options);
  // Cancels setups in progress (a join, or a warm-up: aborted) and waits for their threads.
  ~NcclPeers();

  // The right to one transfer with `client`'s store, or null: no ready communicator (a setup is
  // started in the background if none is under way and the last failure is old enough), or one
  // transfer already uses it. Never blocks on the network.
  std::shared_ptr<Lane> Acquire(kvstore::KvStoreClient* client);
  // Starts making a communicator with `client`'s store in the background, if there is none and
  // none is under way (and the last failure is old enough): what the worker does for every
  // store of its ring at start-up, so that no request meets a store without one. A store on
  // this GPU, or without NCCL, refuses, and is asked again only after unsupported_retry.
  void Prepare(kvstore::KvStoreClient* client);
  // Lists TRANSPORT_NCCL (before TRANSPORT_GRPC_STREAM) with the lane's communicator and room.
  void Offer(const Lane& lane, v1::OpenTransferRequest* request) const;
  // The store answered another transport: when it said the communicator is gone
  // (communicator_id 0), it is forgotten and made again.
  void NotChosen(Lane& lane, const v1::OpenTransferResponse& answer);
  // The answer's pages received into the lane's slab and checked on the GPU, as device pages
  // valid while `lane` lives. keys[i] is page first_index + i, keys[0]'s parent first_parent.
  // The wait for the bytes ends at the earliest of the store's transfer_timeout_ms, the
  // worker's max_receive_wait and `request_deadline` (the request's own; InfiniteFuture: none).
  // Any error is a miss (the caller does not retry another way): a transfer error or a missed
  // deadline (DeadlineExceeded) aborts the communicator (made again in the background); a
  // digest mismatch is DataLoss.
  absl::StatusOr<std::vector<engine::DevicePage>> Receive(
      Lane& lane, const v1::OpenTransferResponse& answer, std::span<const PageKey> keys,
      const PageKey& first_parent, int64_t first_index, absl::Time request_deadline);

  NcclPeersCounts Counts() const;
  // Whether a communicator with `address` is ready (tests, logs).
  bool Ready(const std::string& address) const;

 private:
  struct Peer;
  Peer* PeerLocked(kvstore::KvStoreClient* client);
  // Starts Setup on a thread unless one runs or the last failure is too recent. Under mu_.
  void StartSetupLocked(Peer* peer, kvstore::KvStoreClient* client);
  void Setup(Peer* peer, kvstore::KvStoreClient* client);
  absl::Status SetupOnce(Peer* peer, kvstore::KvStoreClient* client);
  void Forget(Peer* peer, const char* why);  // with mu_ held

  transport::NcclRuntime* const runtime_;
  const NcclPeersOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by store address
  NcclPeersCounts counts_;
  bool stopping_ = false;
};

}  // namespace kvstrata::decode
