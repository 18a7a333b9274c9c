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

// Spare device address space reserved right after a DevicePageMemory's own bytes, where the
// memory of other processes is mapped (ImportedPageMemory::Import) so that every address of
// both lies within a fixed reach of the allocation's start: what lets the CUDA backend read a
// GPU kvstore's pages in place with the same page tables as its own (cuda_backend_plan.cc).
// Thread-safe. The reservation is freed when the allocation and every import in it are gone.
class AddressRoom;

// How far past the history pool's start the CUDA backend's kernels reach pages, in the units
// its page tables count (cuda_backend_plan.cc): int32 indices of 64-byte units, 128 GiB. The
// cache's page memory reserves address space up to it, where other processes' pools are mapped.
inline constexpr int64_t kHistoryUnitBytes = 64;
inline constexpr int64_t kHistoryReachBytes = kHistoryUnitBytes * (int64_t{1} << 31);

class DevicePageMemory final : public PageMemory {
 public:
  // Allocates at least `bytes` (rounded up to the allocation granularity) on `device`.
  // ResourceExhausted naming the device and the size when the GPU lacks the memory; other CUDA
  // errors as Internal naming the call and the device. `reach` > 0 also reserves address space
  // after the allocation, up to `reach` bytes from its start, for imports (room()).
  static absl::StatusOr<std::unique_ptr<DevicePageMemory>> Allocate(int device, int64_t bytes,
                                                                    int64_t reach = 0);
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
  // The address space reserved for imports (null when Allocate had no reach).
  const std::shared_ptr<AddressRoom>& room() const { return room_; }

 private:
  DevicePageMemory() = default;

  int device_ = 0;
  int64_t size_ = 0;
  int64_t reserved_ = 0;        // the mapped size (a multiple of the granularity)
  unsigned long long handle_ = 0;  // CUmemGenericAllocationHandle
  unsigned long long address_ = 0;  // CUdeviceptr
  // The reservation when the allocation has room for imports (it then frees the address
  // range, once nothing is mapped in it).
  std::shared_ptr<AddressRoom> room_;
};

// Another process's page memory on the same GPU (the GPU kvstore's HBM pool), mapped into this
// process from the file descriptor ExportHandle made: device pointers into it are valid here
// while the object lives. Mapped read-write (the driver refuses read-only device mappings on
// some GPUs); this process only reads it.
class ImportedPageMemory final : public SharedPageMemory {
 public:
  // Takes ownership of `fd` (closed here, mapped or not). `bytes` is the exported size. Mapped
  // in `room` when it has space left (in_room() then), else anywhere.
  static absl::StatusOr<std::unique_ptr<ImportedPageMemory>> Import(
      int device, int fd, int64_t bytes, std::shared_ptr<AddressRoom> room = nullptr);
  ~ImportedPageMemory() override;
  const uint8_t* data() const override { return reinterpret_cast<const uint8_t*>(address_); }
  int64_t size() const override { return size_; }
  bool in_room() const { return room_ != nullptr; }

 private:
  ImportedPageMemory() = default;
  int device_ = 0;
  int64_t size_ = 0;
  int64_t reserved_ = 0;
  unsigned long long handle_ = 0;
  unsigned long long address_ = 0;
  std::shared_ptr<AddressRoom> room_;  // set when mapped there (the range goes back to it)
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" and the name of `device`.
absl::StatusOr<std::pair<std::string, std::string>> GpuUuidAndName(int device);

// An allocator for KvCacheOptions::allocate_page_memory on `device` (with `reach`, as Allocate).
PageMemoryAllocator DevicePageMemoryAllocator(int device, int64_t reach = 0);

}  // namespace kvstrata::engine
