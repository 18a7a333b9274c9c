#pragma once

// The device's copy bandwidth, which the GPU benchmarks put their figures beside: bytes read
// plus bytes written per second by cudaMemcpy device to device of 4 GiB (one copy to warm up,
// five timed). 0 when the buffers cannot be allocated.

#include <cuda_runtime.h>

#include <cstddef>

namespace kvstrata::bench {

inline double CopyBandwidth() {
  const size_t bytes = size_t{4} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return 0.0;
  }
  cudaMemset(a, 1, bytes);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  for (int i = 0; i < 5; ++i) cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return ms > 0 ? 2.0 * bytes * 5 / (ms * 1e-3) : 0.0;
}

}  // namespace kvstrata::bench
