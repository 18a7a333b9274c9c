#pragma once

// The CUDA backend's DevicePageAccess: cached pages that lie in another process's device memory
// on this GPU (the GPU kvstore's pool) copied into the KV cache's slots by one gather kernel
// that checks every page's digest as it passes (kernels/cuda/page_gather.h), on the backend's
// stream; or, when that memory is mapped within the history pool's reach, read where they lie.

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/device_page_memory.h"
#include "engine/kv_cache.h"

namespace kvstrata::engine {

class CudaDevicePageAccess final : public DevicePageAccess {
 public:
  // `cache`: the backend's KV cache (in device page memory), whose history pool's reach decides
  // which pages can be read in place.
  CudaDevicePageAccess(int device, cudaStream_t stream, const KvCache* cache);
  ~CudaDevicePageAccess() override;
  absl::Status CopyPages(std::span<const Copy> copies) override;
  absl::StatusOr<std::string> ReadPage(const DevicePage& page) override;
  absl::StatusOr<std::unique_ptr<SharedPageMemory>> MapShared(int fd, int64_t bytes) override;
  bool CanReadInPlace(const DevicePage& page) const override;

 private:
  absl::Status Reserve(int pages);

  int device_;
  cudaStream_t stream_;
  const uint8_t* history_base_ = nullptr;  // null: nothing is read in place (no history pool)
  kernels::PageEncoding history_encoding_ = kernels::PageEncoding::kInt2Uniform;
  std::shared_ptr<AddressRoom> room_;  // where other processes' pools are mapped
  int capacity_ = 0;  // pages the device buffers below hold
  void* copies_ = nullptr;
  unsigned long long* sums_ = nullptr;
  uint32_t* mismatch_ = nullptr;
};

}  // namespace kvstrata::engine
