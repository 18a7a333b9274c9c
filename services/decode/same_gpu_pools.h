#pragma once

// The decode worker's side of the same-GPU transport (docs/api.md#opentransfer): when the worker
// runs on a GPU, it tells a kvstore which GPU (and host) it is on; a store holding pages in an
// HBM pool on that very GPU answers with offsets into the pool, which this class maps once per
// pool (its descriptor received over the store's pool socket) and turns into engine DevicePages
// that the CUDA engine copies into its own cache with one gather kernel.

#include <cstdint>
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
  // `cuda_device` < 0 (a CPU worker, or the transport turned off): never asks for the pool.
  // `int2_encoding`: the engine's history encoding (the wire says only "INT2").
  SameGpuPools(int cuda_device, kernels::PageEncoding int2_encoding);
  ~SameGpuPools();

  bool enabled() const { return enabled_; }
  // The worker's GPU ("GPU-..."), as sent in DeviceInfo.gpu_uuid; empty on a CPU worker. What
  // the worker registers as same_gpu_uuid while enabled().
  const std::string& gpu_uuid() const { return gpu_uuid_; }
  // This worker's device and the transports it takes, in its order.
  void Describe(v1::OpenTransferRequest* request) const;
  // The answer's pages (a compact answer: placements only) as device pages in the mapped pool,
  // mapping it first if it is new. The answer names no keys: they are `keys` (what was asked
  // for), page i of them at index first_index + i, the first one's parent `first_parent`. Errors (the pool socket, the
  // mapping, a page outside the pool) mean: fetch by gRPC.
  absl::StatusOr<std::vector<engine::DevicePage>> Pages(const v1::OpenTransferResponse& answer,
                                                        std::span<const PageKey> keys,
                                                        const PageKey& first_parent,
                                                        int64_t first_index);
  int pools_mapped() const;

 private:
  struct Mapping;
  const int device_;
  const kernels::PageEncoding int2_encoding_;
  bool enabled_ = false;
  std::string gpu_uuid_;
  std::string boot_id_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Mapping>> pools_;  // by pool_id
};

}  // namespace kvstrata::decode
