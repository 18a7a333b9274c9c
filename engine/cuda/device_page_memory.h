#pragma once

// Page memory on a GPU for the CUDA backend's KV cache: one allocation through CUDA's virtual
// memory management (cuMemCreate, mapped with read-write access for the device), made with a
// POSIX file-descriptor handle type so that another process on the same GPU can map the same
// pages (ExportHandle; the GPU kvstore's same-GPU transport builds on this). The driver API is
// reached through the runtime (cudaGetDriverEntryPointByVersion), so nothing links libcuda and
// a CPU-only machine still loads every binary.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

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

// Another process's page memory on the same GPU (the GPU kvstore's HBM pool), mapped into this
// process from the file descriptor ExportHandle made: device pointers into it are valid here
// while the object lives. Mapped read-write (the driver refuses read-only device mappings on
// some GPUs); this process only reads it.
class ImportedPageMemory {
 public:
  // Takes ownership of `fd` (closed here, mapped or not). `bytes` is the exported size.
  static absl::StatusOr<std::unique_ptr<ImportedPageMemory>> Import(int device, int fd,
                                                                   int64_t bytes);
  ~ImportedPageMemory();
  const uint8_t* data() const { return reinterpret_cast<const uint8_t*>(address_); }
  int64_t size() const { return size_; }

 private:
  ImportedPageMemory() = default;
  int device_ = 0;
  int64_t size_ = 0;
  int64_t reserved_ = 0;
  unsigned long long handle_ = 0;
  unsigned long long address_ = 0;
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" and the name of `device`.
absl::StatusOr<std::pair<std::string, std::string>> GpuUuidAndName(int device);

// An allocator for KvCacheOptions::allocate_page_memory on `device`.
PageMemoryAllocator DevicePageMemoryAllocator(int device);

}  // namespace kvstrata::engine
