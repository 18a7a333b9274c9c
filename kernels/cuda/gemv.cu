// y (+)= x · Wᵀ for 1..4 rows of x: one warp per output row at a time, each lane loading 16
// bytes (8 elements) of the row per step, four steps unrolled so that 2 KB per warp are in
// flight; x's matching 8 elements per row are read through L1 (every warp of the device reads
// the same x). The warp reduces its rows' sums with shuffles and lane 0 writes them.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/ptx.cuh"

namespace kvstrata::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;

template <typename T>
__device__ __forceinline__ void ToFloat8(const uint4& v, float (&f)[8]);

template <>
__device__ __forceinline__ void ToFloat8<__nv_bfloat16>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

template <>
__device__ __forceinline__ void ToFloat8<__half>(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// kOverlap: launched as a programmatic dependent of the kernel before it (GemvVariant).
template <typename T, int R, bool kOverlap>
__global__ void __launch_bounds__(kThreads) GemvKernel(const T* __restrict__ x, int in,
                                                       const T* __restrict__ w, int out,
                                                       float* __restrict__ y, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int chunks = in / 8;  // 16-byte chunks per row
  const uint4* x4 = reinterpret_cast<const uint4*>(x);
  const int first = blockIdx.x * kWarps + threadIdx.x / 32;
  // The first weights do not depend on the kernel before (only x and y do): ask for them, then
  // wait for that kernel (a no-op unless launched as its programmatic dependent).
  uint4 wv[kUnroll];
  const bool prefetched = kOverlap && first < out && lane + 32 * (kUnroll - 1) < chunks;
  if (prefetched) {
    const uint4* row = reinterpret_cast<const uint4*>(w) + int64_t{first} * chunks;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(row + lane + 32 * u);
  }
  if constexpr (kOverlap) ptx::GridDependencyWait();
  for (int n = first; n < out; n += gridDim.x * kWarps) {
    const uint4* row = reinterpret_cast<const uint4*>(w) + int64_t{n} * chunks;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    int c = lane;
    for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
      if (!(prefetched && n == first && c == lane)) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(row + c + 32 * u);  // streamed once
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float wf[8];
        ToFloat8<T>(wv[u], wf);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float xf[8];
          ToFloat8<T>(__ldg(x4 + r * chunks + c + 32 * u), xf);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
        }
      }
    }
    for (; c < chunks; c += 32) {
      float wf[8];
      ToFloat8<T>(__ldcs(row + c), wf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xf[8];
        ToFloat8<T>(__ldg(x4 + r * chunks + c), xf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int s = 16; s > 0; s >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], s);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float* dst = y + int64_t{r} * out + n;
        *dst = accumulate ? *dst + acc[r] : acc[r];
      }
    }
  }
}

// CTAs of one wave of kernel k on the current device, asked once per kernel (the queries are
// not stream work, so they may run inside graph capture).
template <typename Kernel>
int OneWave(Kernel k) {
  static const int ctas = [&] {
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kThreads, 0) != cudaSuccess) {
      return 8192;
    }
    return std::max(1, sms * per_sm);
  }();
  return ctas;
}

template <typename T, int R, bool kOverlap>
cudaError_t LaunchRowsAs(const T* x, int in, const T* w, int out, float* y, bool accumulate,
                       cudaStream_t stream, const GemvVariant& v) {
  // One warp per row of W; past the cap the grid-stride loop covers the rest.
  const int cap = v.one_wave ? OneWave(GemvKernel<T, R, kOverlap>) : 8192;
  const int blocks = std::max(1, std::min((out + kWarps - 1) / kWarps, cap));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute overlap[1];
  overlap[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap[0].val.programmaticStreamSerializationAllowed = 1;
  if (kOverlap) {
    config.attrs = overlap;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, GemvKernel<T, R, kOverlap>, x, in, w, out, y, accumulate);
}

template <typename T, int R>
cudaError_t LaunchRows(const T* x, int in, const T* w, int out, float* y, bool accumulate,
                       cudaStream_t stream, const GemvVariant& v) {
  return v.overlap_previous
             ? LaunchRowsAs<T, R, true>(x, in, w, out, y, accumulate, stream, v)
             : LaunchRowsAs<T, R, false>(x, in, w, out, y, accumulate, stream, v);
}

template <typename T>
cudaError_t Launch(const void* x, int rows, int in, const void* w, int out, float* y,
                   bool accumulate, cudaStream_t stream, const GemvVariant& v) {
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  switch (rows) {
    case 1: return LaunchRows<T, 1>(xt, in, wt, out, y, accumulate, stream, v);
    case 2: return LaunchRows<T, 2>(xt, in, wt, out, y, accumulate, stream, v);
    case 3: return LaunchRows<T, 3>(xt, in, wt, out, y, accumulate, stream, v);
    default: return LaunchRows<T, 4>(xt, in, wt, out, y, accumulate, stream, v);
  }
}

}  // namespace

bool GemvSupports(int rows, int in, GemmType type, const void* x, const void* w) {
  return rows >= 1 && rows <= kGemvMaxRows && in > 0 && in % 8 == 0 &&
         (type == GemmType::kBf16 || type == GemmType::kFp16) &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t Gemv(const void* x, int rows, int in, const void* w, int out, float* y,
                 bool accumulate, GemmType type, cudaStream_t stream, const GemvVariant& variant) {
  if (!GemvSupports(rows, in, type, x, w) || out <= 0) return cudaErrorInvalidValue;
  return type == GemmType::kBf16
             ? Launch<__nv_bfloat16>(x, rows, in, w, out, y, accumulate, stream, variant)
             : Launch<__half>(x, rows, in, w, out, y, accumulate, stream, variant);
}

}  // namespace kvstrata::kernels
