#pragma once

// The GPU kvstore's fast tier: an HBM pool on one GPU (one VMM allocation made exportable,
// engine/cuda/device_page_memory.h) behind the page store's TierMemory seam, and the Unix socket
// that hands its file descriptor to workers on the same GPU (transport/pool_socket.h).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/kvstore/page_store.h"
#include "transport/pool_socket.h"

namespace kvstrata::kvstore {

struct GpuTier {
  std::shared_ptr<TierMemory> memory;
  std::unique_ptr<transport::PoolSocketServer> socket;
  uint64_t pool_id = 0;
  std::string gpu_uuid;
  std::string gpu_name;
};

// `bytes` of HBM on cuda:`device`, its descriptor served on `socket_path`. Unavailable when no
// GPU is usable (or the build has no CUDA), ResourceExhausted when the GPU lacks the memory.
absl::StatusOr<GpuTier> MakeGpuTier(int device, uint64_t bytes, const std::string& socket_path);

}  // namespace kvstrata::kvstore
