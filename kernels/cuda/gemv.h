#pragma once

// Matrix-vector products for the few-token passes of decode (a batch of 1..4 sequences): y fp32
// [rows][out] (+)= x [rows][in] · Wᵀ with W [out][in] row-major, x and W bf16 or fp16, fp32
// accumulation. cuBLAS runs these shapes well under the copy bandwidth (the weights are read
// once per step, nothing is reused); here each warp streams whole rows of W with 16-byte loads,
// several in flight, and x comes from L1. The CPU specification is the same product in fp32.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/model_ops.h"

namespace kvstrata::kernels {

inline constexpr int kGemvMaxRows = 4;

// Whether Gemv takes these operands: rows in [1, kGemvMaxRows], in a multiple of 8, a bf16 or
// fp16 type, x and w 16-byte aligned.
bool GemvSupports(int rows, int in, GemmType type, const void* x, const void* w);

// How the kernel is launched. The defaults are the form measured end to end on the H200
// (docs/benchmarks.md); the other two are written and CPU-compiled but not yet run on a GPU
// (kvstrata_bench_gemv and the GPU test measure and check them side by side).
struct GemvVariant {
  // At most one wave of CTAs, each warp taking rows n, n + warps of the grid, ...; false: one
  // warp per row, as many CTAs as that takes (the tail wave runs part-empty).
  bool one_wave = false;
  // Launched as a programmatic dependent of the kernel before it: the CTAs start streaming
  // their first weights while that kernel finishes, and read x once it has.
  bool overlap_previous = false;
};

// cudaErrorInvalidValue where GemvSupports is false.
cudaError_t Gemv(const void* x, int rows, int in, const void* w, int out, float* y,
                 bool accumulate, GemmType type, cudaStream_t stream,
                 const GemvVariant& variant = {});

}  // namespace kvstrata::kernels
