#pragma once

// The CUDA backend's DevicePageAccess: cached pages that lie in another process's device memory
// on this GPU (the GPU kvstore's pool) copied into the KV cache's slots by one gather kernel
// that checks every page's digest as it passes (kernels/cuda/page_gather.h), on the backend's
// stream.

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/kv_cache.h"

namespace kvstrata::engine {

class CudaDevicePageAccess final : public DevicePageAccess {
 public:
  CudaDevicePageAccess(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaDevicePageAccess() override;
  absl::Status CopyPages(std::span<const Copy> copies) override;
  absl::StatusOr<std::string> ReadPage(const DevicePage& page) override;

 private:
  absl::Status Reserve(int pages);

  int device_;
  cudaStream_t stream_;
  int capacity_ = 0;  // pages the device buffers below hold
  void* copies_ = nullptr;
  unsigned long long* sums_ = nullptr;
  uint32_t* mismatch_ = nullptr;
};

}  // namespace kvstrata::engine
