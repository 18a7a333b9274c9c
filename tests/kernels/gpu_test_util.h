#pragma once

// What the GPU kernel tests share: whether a device is there (they skip without one), and
// copying host vectors to device memory with checked CUDA calls.

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace kvstrata::kernels {

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// A device copy of `v` (at least one element allocated); the caller frees it with cudaFree.
template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(T)), cudaSuccess);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  return d;
}

}  // namespace kvstrata::kernels
