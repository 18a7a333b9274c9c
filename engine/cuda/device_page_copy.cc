#include "engine/cuda/device_page_copy.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/page_digest.h"
#include "kernels/cuda/page_gather.h"

namespace kvstrata::engine {
namespace {

absl::Status CudaError(cudaError_t e, const char* what, int device) {
  return absl::InternalError(
      absl::StrCat(what, " on cuda:", device, " (importing device pages): ", cudaGetErrorString(e)));
}

}  // namespace

CudaDevicePageAccess::CudaDevicePageAccess(int device, cudaStream_t stream, const KvCache* cache)
    : device_(device), stream_(stream) {
  const PagePool* history = cache->int2_pool();
  const KvCacheFormat format = cache->options().format;
  if (history == nullptr || (format != KvCacheFormat::kInt2 && format != KvCacheFormat::kCodec)) {
    return;
  }
  if (const auto* memory = dynamic_cast<const DevicePageMemory*>(history->memory().get())) {
    room_ = memory->room();
  }
  history_base_ = history->base();
  history_encoding_ = cache->int2_encoding();
}

CudaDevicePageAccess::~CudaDevicePageAccess() {
  cudaFree(copies_);
  cudaFree(sums_);
  cudaFree(mismatch_);
}

absl::Status CudaDevicePageAccess::Reserve(int pages) {
  if (pages <= capacity_) return absl::OkStatus();
  const int n = std::max(pages, 2 * capacity_);
  cudaFree(copies_);
  cudaFree(sums_);
  cudaFree(mismatch_);
  copies_ = nullptr;
  sums_ = nullptr;
  mismatch_ = nullptr;
  capacity_ = 0;
  if (cudaError_t e = cudaMalloc(&copies_, sizeof(kernels::PageCopy) * n); e != cudaSuccess) {
    return CudaError(e, "cudaMalloc", device_);
  }
  if (cudaError_t e = cudaMalloc(&sums_, sizeof(unsigned long long) * n); e != cudaSuccess) {
    return CudaError(e, "cudaMalloc", device_);
  }
  if (cudaError_t e = cudaMalloc(&mismatch_, sizeof(uint32_t) * n); e != cudaSuccess) {
    return CudaError(e, "cudaMalloc", device_);
  }
  capacity_ = n;
  return absl::OkStatus();
}

absl::Status CudaDevicePageAccess::CopyPages(std::span<const Copy> copies) {
  if (copies.empty()) return absl::OkStatus();
  const int n = static_cast<int>(copies.size());
  if (absl::Status s = Reserve(n); !s.ok()) return s;
  std::vector<kernels::PageCopy> host(n);
  uint64_t max_bytes = 0;
  for (int i = 0; i < n; ++i) {
    host[i] = {.src = copies[i].src,
               .dst = copies[i].dst,
               .bytes = static_cast<uint64_t>(copies[i].bytes),
               .expected_digest = copies[i].digest64};
    max_bytes = std::max(max_bytes, host[i].bytes);
  }
  if (cudaError_t e = cudaMemcpyAsync(copies_, host.data(), sizeof(kernels::PageCopy) * n,
                                      cudaMemcpyHostToDevice, stream_);
      e != cudaSuccess) {
    return CudaError(e, "cudaMemcpyAsync", device_);
  }
  if (cudaError_t e = kernels::LaunchPageGather(
          {.copies = static_cast<const kernels::PageCopy*>(copies_), .num_pages = n,
           .max_page_bytes = max_bytes, .sums = sums_, .mismatch = mismatch_},
          stream_);
      e != cudaSuccess) {
    return CudaError(e, "the page gather kernel", device_);
  }
  std::vector<uint32_t> mismatch(n);
  if (cudaError_t e = cudaMemcpyAsync(mismatch.data(), mismatch_, sizeof(uint32_t) * n,
                                      cudaMemcpyDeviceToHost, stream_);
      e != cudaSuccess) {
    return CudaError(e, "cudaMemcpyAsync", device_);
  }
  if (cudaError_t e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
    return CudaError(e, "the page gather", device_);
  }
  const int bad = static_cast<int>(std::count(mismatch.begin(), mismatch.end(), 1u));
  if (bad > 0) {
    const int first = static_cast<int>(std::find(mismatch.begin(), mismatch.end(), 1u) -
                                       mismatch.begin());
    return absl::DataLossError(absl::StrCat(bad, " of ", n, " device pages failed their digest (",
                                            "the first is the ", first + 1, "th copied)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaDevicePageAccess::ReadPage(const DevicePage& page) {
  std::string bytes(static_cast<size_t>(page.byte_length), '\0');
  if (cudaError_t e = cudaMemcpy(bytes.data(), page.bytes, bytes.size(), cudaMemcpyDeviceToHost);
      e != cudaSuccess) {
    return CudaError(e, "cudaMemcpy", device_);
  }
  if (PageDigest64(bytes.data(), bytes.size()) != page.digest64) {
    return absl::DataLossError(absl::StrCat("device page ", page.key.ToHex(),
                                            " failed its digest on the way to the host"));
  }
  return bytes;
}

}  // namespace kvstrata::engine

namespace kvstrata::engine {

absl::StatusOr<std::unique_ptr<SharedPageMemory>> CudaDevicePageAccess::MapShared(int fd,
                                                                                  int64_t bytes) {
  absl::StatusOr<std::unique_ptr<ImportedPageMemory>> m =
      ImportedPageMemory::Import(device_, fd, bytes, room_);
  if (!m.ok()) return m.status();
  return std::unique_ptr<SharedPageMemory>(*std::move(m));
}

bool CudaDevicePageAccess::CanReadInPlace(const DevicePage& page) const {
  if (history_base_ == nullptr || page.encoding != history_encoding_ || page.bytes == nullptr) {
    return false;
  }
  // Within reach of the history pool's page tables: after its start, on a unit boundary, and
  // ending before the reach (the units are int32 indices; see kHistoryReachBytes).
  const auto at = reinterpret_cast<uintptr_t>(page.bytes);
  const auto base = reinterpret_cast<uintptr_t>(history_base_);
  if (at < base) return false;
  const uint64_t offset = at - base;
  return offset % kHistoryUnitBytes == 0 && offset + static_cast<uint64_t>(page.byte_length) <=
                                                static_cast<uint64_t>(kHistoryReachBytes);
}

}  // namespace kvstrata::engine
