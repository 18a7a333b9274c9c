#pragma once

// The decode worker's side of the same-GPU transport (docs/api.md#opentransfer): when the worker
// runs on a GPU, it tells a kvstore which GPU (and host) it is on; a store holding pages in an
// HBM pool on that very GPU answers with offsets into the pool, which this class maps once per
// pool (its descriptor received over the store's pool socket, mapped by the engine where its
// kernels reach) and turns into engine DevicePages: read in place by the CUDA engine for the
// whole request, or copied into its own cache with one gather kernel.
//
// Reading in place needs the pages to stay put while the request runs: the worker keeps its
// connection to the pool socket open as a holder (transport/pool_socket.h), names the holder
// in OpenTransfer, and the store then holds the lease until the worker releases it or the
// connection closes. A pool whose store has gone (its holder connection closed) is forgotten:
// its mapping is dropped once no request reads from it, which gives its memory back.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "kvstrata/v1/kvstore.pb.h"
#include "services/kvstore/client.h"

namespace kvstrata::decode {

// Sends `request` (device, transports, lease and compact already set) for `keys`: the primary
// forms of consecutive pages of one chain, the first one's parent `first_parent`. They are
// named as a chain (the last key and a count: the store walks its parent links), and resent as
// a list of every key when the store refuses the chain with INVALID_ARGUMENT, which is what a
// store older than the chain form answers (it sees no pages); *every_key then tells the caller.
absl::StatusOr<v1::OpenTransferResponse> OpenTransferOfChain(kvstore::KvStoreClient& client,
                                                             v1::OpenTransferRequest request,
                                                             std::span<const PageKey> keys,
                                                             const PageKey& first_parent,
                                                             bool* every_key);

class SameGpuPools {
 public:
  // Maps memory another process exported (engine DevicePageAccess::MapShared).
  using MapShared = std::function<absl::StatusOr<std::unique_ptr<engine::SharedPageMemory>>(
      int fd, int64_t bytes)>;

  // `cuda_device` < 0 (a CPU worker, or the transport turned off): never asks for the pool.
  // `int2_encoding`: the engine's history encoding (the wire says only "INT2"). `hold`: keep a
  // holder connection to each pool and ask stores to hold leases by it (for reading in place).
  SameGpuPools(int cuda_device, kernels::PageEncoding int2_encoding, MapShared map_shared,
               bool hold);
  ~SameGpuPools();

  bool enabled() const { return enabled_; }
  // The worker's GPU ("GPU-..."), as sent in DeviceInfo.gpu_uuid; empty on a CPU worker. What
  // the worker registers as same_gpu_uuid while enabled().
  const std::string& gpu_uuid() const { return gpu_uuid_; }
  // This worker's device and the transports it takes, in its order; and, once this worker holds
  // a connection to the pool of the store at `store` (its address), the holder to name.
  void Describe(v1::OpenTransferRequest* request, const std::string& store = "") const;

  struct Placed {
    std::vector<engine::DevicePage> pages;
    // Keeps the pool mapped (and its holder connection open) while it lives.
    std::shared_ptr<void> mapping;
    // This worker's holder for the pool (0: none), for a request that asked without one.
    uint64_t holder = 0;
  };
  // The answer's pages (a compact answer: placements only) as device pages in the mapped pool,
  // mapping it first if it is new (`store`: the answering store's address). The answer names no
  // keys: they are `keys` (what was asked for), page i of them at index first_index + i, the
  // first one's parent `first_parent`. Errors (the pool socket, the mapping, a page outside the
  // pool) mean: fetch by gRPC.
  absl::StatusOr<Placed> Pages(const v1::OpenTransferResponse& answer,
                               std::span<const PageKey> keys, const PageKey& first_parent,
                               int64_t first_index, const std::string& store = "");
  int pools_mapped() const;

 private:
  struct Mapping;
  // Forgets pools whose store closed its holder connection (it stopped). Under mu_.
  void ForgetGonePoolsLocked();

  const int device_;
  const kernels::PageEncoding int2_encoding_;
  const MapShared map_shared_;
  const bool hold_;
  bool enabled_ = false;
  std::string gpu_uuid_;
  std::string boot_id_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::shared_ptr<Mapping>> pools_;  // by pool_id
  std::map<std::string, uint64_t> store_pool_;          // store address -> its pool_id
};

}  // namespace kvstrata::decode
