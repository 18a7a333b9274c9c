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
// (docs/benchmarks/engine-gpu.md); kvstrata_bench_gemv times the variants side by side and the
// GPU test checks each.
struct GemvVariant {
  // At most one wave of CTAs, each warp taking rows n, n + warps of the grid, ...; false: one
  // warp per row, as many CTAs as that takes (the tail wave runs part-empty).
  bool one_wave = false;
  // Launched as a programmatic dependent of the kernel before it: the CTAs start streaming
  // their first weights while that kernel finishes, and read x once it has.
  bool overlap_previous = false;
  // The normed GEMVs only: each warp streams two rows at once (rows n and n + the grid's warps;
  // for SwiGLU, the gate and the up row), twice the bytes in flight per warp, each row summed
  // in the same order (the same bits).
  bool paired_rows = false;
};

// cudaErrorInvalidValue where GemvSupports is false.
cudaError_t Gemv(const void* x, int rows, int in, const void* w, int out, float* y,
                 bool accumulate, GemmType type, cudaStream_t stream,
                 const GemvVariant& variant = {});

// The GEMV of an RMS-normed input, the norm done inside the GEMV's CTAs (for decode at 1-2
// rows, where the norm as a launch of its own costs more than its work): x fp32 [rows][in]
// (contiguous), normalised as RmsNormTo does it with norm_weight [in] and eps, rounded to `type`
// in each CTA's shared memory; the normed rows are never written out. Launched as a programmatic
// dependent of the kernel before it (which may be writing x): the CTAs ask for their first
// weights, then wait for x. On rows of up to 4,096 values the results equal RmsNormTo + Gemv
// (+ SwiGluTo) bit for bit (the sum of squares is taken in RmsNormTo's order).
inline constexpr int kGemvNormedMaxRows = 2;
inline constexpr int64_t kGemvNormedMaxSmemBytes = 48 * 1024;  // the normed rows, per CTA

// rows in [1, kGemvNormedMaxRows], in a multiple of 8 with rows·in 16-bit values within
// kGemvNormedMaxSmemBytes, a bf16 or fp16 type, x, norm_weight and w 16-byte aligned.
bool GemvRmsNormedSupports(int rows, int in, GemmType type, const float* x,
                           const float* norm_weight, const void* w);

// y fp32 [rows][out] = RMSNorm(x) · Wᵀ, W [out][in].
// Of `variant`, one_wave and paired_rows apply (the launch always overlaps the kernel before):
// one_wave, as many CTAs as fit at once, each warp taking several rows, so each CTA computes
// the norm once and none starts with it after the first wave.
cudaError_t GemvRmsNormed(const float* x, int rows, int in, const float* norm_weight, float eps,
                          const void* w, int out, float* y, GemmType type, cudaStream_t stream,
                          const GemvVariant& variant = {});

// The MLP's front in one launch: W [2·out][in] holds the gate rows then the up rows, and
// act `type` [rows][out] = silu(g)·u for g, u = RMSNorm(x) · (gate row n, up row n), as
// SwiGluTo writes it; the products themselves are never written out.
cudaError_t GemvRmsNormedSwiGlu(const float* x, int rows, int in, const float* norm_weight,
                                float eps, const void* w, int out, void* act, GemmType type,
                                cudaStream_t stream, const GemvVariant& variant = {});

}  // namespace kvstrata::kernels
