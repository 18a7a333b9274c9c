#include "engine/cuda/device_page_memory.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"

namespace kvstrata::engine {
namespace {

// The driver entry points this file uses, looked up once.
struct Driver {
  decltype(&cuMemGetAllocationGranularity) get_granularity = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemAddressReserve) reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&cuMemImportFromShareableHandle) import_handle = nullptr;
  absl::Status status;
};

const Driver& GetDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver;
    auto find = [&](const char* name, auto* fn) {
      if (!d->status.ok()) return;
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found;
      const cudaError_t e =
          cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found);
      if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr) {
        d->status = absl::UnavailableError(absl::StrCat(
            "the CUDA driver has no ", name, " (", cudaGetErrorString(e), "): is a GPU driver "
            "installed?"));
        return;
      }
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(p);
    };
    find("cuMemGetAllocationGranularity", &d->get_granularity);
    find("cuMemCreate", &d->create);
    find("cuMemRelease", &d->release);
    find("cuMemAddressReserve", &d->reserve);
    find("cuMemAddressFree", &d->address_free);
    find("cuMemMap", &d->map);
    find("cuMemUnmap", &d->unmap);
    find("cuMemSetAccess", &d->set_access);
    find("cuMemExportToShareableHandle", &d->export_handle);
    find("cuMemImportFromShareableHandle", &d->import_handle);
    return d;
  }();
  return *driver;
}

absl::Status DriverError(CUresult r, const char* call, int device) {
  return absl::InternalError(absl::StrCat(call, " failed on cuda:", device, " (CUresult ",
                                          static_cast<int>(r), ")"));
}

}  // namespace

class AddressRoom {
 public:
  // The reservation [base, base + reserved), of which [base + first_free, ...) is free.
  AddressRoom(int device, CUdeviceptr base, int64_t reserved, int64_t first_free)
      : device_(device), base_(base), reserved_(reserved) {
    if (first_free < reserved) free_[first_free] = reserved - first_free;
  }
  ~AddressRoom() {
    const Driver& d = GetDriver();
    if (d.status.ok()) d.address_free(base_, static_cast<size_t>(reserved_));
  }

  // The lowest free range of `bytes` (a multiple of the granularity), or nullopt.
  std::optional<CUdeviceptr> Take(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const int64_t at = it->first, left = it->second - bytes;
      free_.erase(it);
      if (left > 0) free_[at + bytes] = left;
      return base_ + static_cast<CUdeviceptr>(at);
    }
    return std::nullopt;
  }
  void Give(CUdeviceptr address, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t at = static_cast<int64_t>(address - base_), len = bytes;
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + len) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        at = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    free_[at] = len;
  }
  int device() const { return device_; }

 private:
  const int device_;
  const CUdeviceptr base_;
  const int64_t reserved_;
  std::mutex mu_;
  std::map<int64_t, int64_t> free_;  // offset -> length, disjoint, never adjacent
};

absl::StatusOr<std::unique_ptr<DevicePageMemory>> DevicePageMemory::Allocate(int device,
                                                                             int64_t bytes,
                                                                             int64_t reach) {
  const Driver& d = GetDriver();
  if (!d.status.ok()) return d.status;
  // Make sure the runtime has a context on the device (the VMM calls need none, the copies do).
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (CUresult r = d.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemGetAllocationGranularity", device);
  }
  const int64_t size = (std::max<int64_t>(bytes, 1) + granularity - 1) / granularity * granularity;
  std::unique_ptr<DevicePageMemory> m(new DevicePageMemory);
  m->device_ = device;
  m->size_ = bytes;
  m->reserved_ = size;
  CUmemGenericAllocationHandle handle;
  if (CUresult r = d.create(&handle, static_cast<size_t>(size), &prop, 0); r != CUDA_SUCCESS) {
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cuda:", device, " has not ", size >> 20, " MiB free for the KV cache (cuMemCreate)"));
    }
    return DriverError(r, "cuMemCreate", device);
  }
  m->handle_ = handle;
  // With a reach, the address space up to it is reserved too: imports go there (room()).
  const int64_t span = std::max<int64_t>(
      size, reach / static_cast<int64_t>(granularity) * static_cast<int64_t>(granularity));
  CUdeviceptr address = 0;
  if (CUresult r = d.reserve(&address, static_cast<size_t>(span), granularity, 0, 0);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemAddressReserve", device);
  }
  m->address_ = address;
  if (span > size) {
    m->room_ = std::make_shared<AddressRoom>(device, address, span, size);
  }
  if (CUresult r = d.map(address, static_cast<size_t>(size), 0, handle, 0); r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemMap", device);
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = d.set_access(address, static_cast<size_t>(size), &access, 1);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemSetAccess", device);
  }
  // Stale data would be read as page contents by nothing (every slot is written before it is
  // read), but a defined start makes tests and debugging saner.
  if (cudaError_t e = cudaMemset(reinterpret_cast<void*>(address), 0, static_cast<size_t>(size));
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemset of the KV cache on cuda:", device, ": ",
                                            cudaGetErrorString(e)));
  }
  return m;
}

DevicePageMemory::~DevicePageMemory() {
  const Driver& d = GetDriver();
  if (!d.status.ok()) return;
  if (address_ != 0) {
    d.unmap(address_, static_cast<size_t>(reserved_));
    // With room for imports, the room frees the whole reservation once its imports are gone.
    if (room_ == nullptr) d.address_free(address_, static_cast<size_t>(reserved_));
  }
  if (handle_ != 0) d.release(handle_);
}

absl::Status DevicePageMemory::Write(int64_t offset, const void* src, int64_t n) {
  if (cudaError_t e = cudaMemcpy(data() + offset, src, static_cast<size_t>(n),
                                 cudaMemcpyHostToDevice);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemcpy to the KV cache on cuda:", device_, ": ",
                                            cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

absl::Status DevicePageMemory::Read(int64_t offset, void* dst, int64_t n) const {
  if (cudaError_t e = cudaMemcpy(dst, reinterpret_cast<const uint8_t*>(address_) + offset,
                                 static_cast<size_t>(n), cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemcpy from the KV cache on cuda:", device_,
                                            ": ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> DevicePageMemory::ExportHandle() const {
  const Driver& d = GetDriver();
  if (!d.status.ok()) return d.status;
  int fd = -1;
  if (CUresult r = d.export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemExportToShareableHandle", device_);
  }
  return fd;
}

absl::StatusOr<std::unique_ptr<ImportedPageMemory>> ImportedPageMemory::Import(
    int device, int fd, int64_t bytes, std::shared_ptr<AddressRoom> room) {
  struct CloseFd {
    int fd;
    ~CloseFd() { close(fd); }
  } closer{fd};
  const Driver& d = GetDriver();
  if (!d.status.ok()) return d.status;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("cudaSetDevice(", device, "): ", cudaGetErrorString(e)));
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (CUresult r = d.get_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemGetAllocationGranularity", device);
  }
  std::unique_ptr<ImportedPageMemory> m(new ImportedPageMemory);
  m->device_ = device;
  m->size_ = bytes;
  m->reserved_ = (std::max<int64_t>(bytes, 1) + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle;
  if (CUresult r = d.import_handle(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemImportFromShareableHandle", device);
  }
  m->handle_ = handle;
  CUdeviceptr address = 0;
  if (room != nullptr && room->device() == device) {
    if (std::optional<CUdeviceptr> at = room->Take(m->reserved_)) {
      address = *at;
      m->room_ = std::move(room);
    }
  }
  if (address == 0) {
    if (CUresult r = d.reserve(&address, static_cast<size_t>(m->reserved_), granularity, 0, 0);
        r != CUDA_SUCCESS) {
      return DriverError(r, "cuMemAddressReserve", device);
    }
  }
  m->address_ = address;
  if (CUresult r = d.map(address, static_cast<size_t>(m->reserved_), 0, handle, 0);
      r != CUDA_SUCCESS) {
    m->address_ = 0;
    if (m->room_ != nullptr) {
      m->room_->Give(address, m->reserved_);
      m->room_.reset();
    } else {
      d.address_free(address, static_cast<size_t>(m->reserved_));
    }
    return DriverError(r, "cuMemMap (an imported pool)", device);
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = d.set_access(address, static_cast<size_t>(m->reserved_), &access, 1);
      r != CUDA_SUCCESS) {
    return DriverError(r, "cuMemSetAccess (an imported pool)", device);
  }
  return m;
}

ImportedPageMemory::~ImportedPageMemory() {
  const Driver& d = GetDriver();
  if (!d.status.ok()) return;
  if (address_ != 0) {
    d.unmap(address_, static_cast<size_t>(reserved_));
    if (room_ != nullptr) {
      room_->Give(address_, reserved_);
    } else {
      d.address_free(address_, static_cast<size_t>(reserved_));
    }
  }
  if (handle_ != 0) d.release(handle_);
}

absl::StatusOr<std::pair<std::string, std::string>> GpuUuidAndName(int device) {
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cuda:", device, ": no CUDA device is usable here (",
                                               cudaGetErrorString(e), ")"));
  }
  const auto* u = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  std::string uuid = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) uuid += '-';
    absl::StrAppend(&uuid, absl::Hex(u[i], absl::kZeroPad2));
  }
  return std::make_pair(uuid, std::string(prop.name));
}

PageMemoryAllocator DevicePageMemoryAllocator(int device, int64_t reach) {
  return [device, reach](int64_t bytes) -> absl::StatusOr<std::unique_ptr<PageMemory>> {
    absl::StatusOr<std::unique_ptr<DevicePageMemory>> m =
        DevicePageMemory::Allocate(device, bytes, reach);
    if (!m.ok()) return m.status();
    return std::unique_ptr<PageMemory>(*std::move(m));
  };
}

}  // namespace kvstrata::engine
