#pragma once

// Page memory on a GPU for the CUDA backend's KV cache: one allocation through CUDA's virtual
// memory management (cuMemCreate, mapped with read-write access for the device), made with a
// POSIX file-descriptor handle type so that another process on the same GPU can map the same
// pages (ExportHandle; the GPU kvstore's same-GPU transport builds on this). The driver API is
// reached through the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda and
// a CPU-only machine still loads every binary.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/kv_cache.h"

namespace kvstrata::engine {

class DevicePageMemory final : public PageMemory {
 public:
  // Allocates at least `bytes` (rounded up to the allocation granularity) on `device`.
  // ResourceExhausted naming the device and the size when the GPU lacks the memory; other CUDA
  // errors as Internal naming the call and the device.
  static absl::StatusOr<std::unique_ptr<DevicePageMemory>> Allocate(int device, int64_t bytes);
  ~DevicePageMemory() override;

  uint8_t* data() override { return reinterpret_cast<uint8_t*>(address_); }
  int64_t size() const override { return size_; }
  bool host_accessible() const override { return false; }
  absl::Status Write(int64_t offset, const void* src, int64_t n) override;
  absl::Status Read(int64_t offset, void* dst, int64_t n) const override;

  int device() const { return device_; }
  // A new file descriptor for the allocation (the caller owns and closes it): another process
  // imports it with cuMemImportFromShareableHandle and maps it.
  absl::StatusOr<int> ExportHandle() const;

 private:
  DevicePageMemory() = default;

  int device_ = 0;
  int64_t size_ = 0;
  int64_t reserved_ = 0;        // the mapped size (a multiple of the granularity)
  unsigned long long handle_ = 0;  // CUmemGenericAllocationHandle
  unsigned long long address_ = 0;  // CUdeviceptr
};

// An allocator for KvCacheOptions::allocate_page_memory on `device`.
PageMemoryAllocator DevicePageMemoryAllocator(int device);

}  // namespace kvstrata::engine
