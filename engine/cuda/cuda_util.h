#pragma once

// What the CUDA engine's files share: CUDA errors as Status naming the call and the device, and
// buffers that free themselves.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvstrata::engine {

inline absl::Status CudaError(cudaError_t e, const char* what, int device) {
  return absl::InternalError(
      absl::StrCat(what, " failed on cuda:", device, ": ", cudaGetErrorString(e)));
}

// Returns the error of a CUDA call as a Status naming `what` and the member device_.
#define KV_CUDA_RETURN_IF_ERROR(call, what)                       \
  do {                                                            \
    if (cudaError_t kv_cuda_e = (call); kv_cuda_e != cudaSuccess) \
      return CudaError(kv_cuda_e, what, device_);                 \
  } while (0)

// Device memory (cudaMalloc) or pinned host memory (cudaMallocHost) that frees itself.
template <bool kPinnedHost>
class CudaMemory {
 public:
  CudaMemory() = default;
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  ~CudaMemory() { Free(); }
  // Replaces the buffer by one of at least `bytes` (the contents are not kept).
  cudaError_t Allocate(size_t bytes) {
    Free();
    bytes_ = std::max<size_t>(bytes, 256);
    return kPinnedHost ? cudaMallocHost(&ptr_, bytes_) : cudaMalloc(&ptr_, bytes_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Free() {
    if (ptr_ != nullptr) kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = CudaMemory<false>;
using PinnedBuffer = CudaMemory<true>;

}  // namespace kvstrata::engine
