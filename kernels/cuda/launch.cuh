#pragma once

// Launching a kernel as a programmatic dependent of the kernel before it in the stream (sm_90):
// the launch may begin while that kernel is still running, and the new kernel's
// ptx::GridDependencyWait() returns once that kernel has finished and its writes are visible.
// Every kernel launched this way waits before it touches memory the kernel before writes or
// reads. Include from .cu files.

#include <cuda_runtime.h>

#include <utility>

namespace kvstrata::kernels {

// `kernel` on grid x block with smem bytes of dynamic shared memory; with overlap_previous, as
// a programmatic dependent of the kernel before it; else a plain launch.
template <typename... Params, typename... Args>
cudaError_t LaunchKernel(bool overlap_previous, dim3 grid, dim3 block, size_t smem,
                         cudaStream_t stream, void (*kernel)(Params...), Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (overlap_previous) {
    config.attrs = attr;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace kvstrata::kernels
