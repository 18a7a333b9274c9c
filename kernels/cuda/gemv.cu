// y (+)= x · Wᵀ for 1..4 rows of x: one warp per output row at a time, each lane loading 16
// bytes (8 elements) of the row per step, four steps unrolled so that 2 KB per warp are in
// flight; x's matching 8 elements per row are read through L1 (every warp of the device reads
// the same x). The warp reduces its rows' sums with shuffles and lane 0 writes them.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/numeric.h"

namespace kvstrata::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 4;
// Float4s of each normed row a thread of the normed GEMVs holds in registers: rows of up to
// 4,096 values with RmsNormTo's 256 threads, all of a thread's loads in flight at once. The
// paired kernel at two rows, held to 64 registers, holds one (with two, it spilled more into
// its streaming loop and its 2-token steps were 0.5 % slower end to end).
template <int R, bool kPaired>
inline constexpr int kNormHeld = R > 1 && kPaired ? 1 : 4;

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
  if constexpr (kOverlap) {
    ptx::LaunchDependents();  // a GEMV after this one may start streaming its weights too
    ptx::GridDependencyWait();
  }
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

// One row of W against R rows of x held in shared memory (the fused kernel below): the same
// loads, sums and order as GemvKernel's, so the result is the same bit for bit. `pre` holds the
// row's first kUnroll chunks when `prefetched`.
template <typename T, int R>
__device__ __forceinline__ void RowDot(const uint4* __restrict__ row, const uint4* xs, int chunks,
                                       int lane, const uint4 (&pre)[kUnroll], bool prefetched,
                                       float (&acc)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  int c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wv[kUnroll];
    if (prefetched && c == lane) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[u] = pre[u];
    } else {
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
        ToFloat8<T>(xs[r * chunks + c + 32 * u], xf);
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
      ToFloat8<T>(xs[r * chunks + c], xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], s);
  }
}

// Two rows of W at once (rows a and b), their loads side by side so twice the bytes are in
// flight per warp; each row's sums in RowDot's order (the same bits). `pre` holds row a's first
// kUnroll chunks when `prefetched`.
template <typename T, int R>
__device__ __forceinline__ void RowDot2(const uint4* __restrict__ a, const uint4* __restrict__ b,
                                        const uint4* xs, int chunks, int lane,
                                        const uint4 (&pre)[kUnroll], bool prefetched,
                                        float (&acc_a)[R], float (&acc_b)[R]) {
#pragma unroll
  for (int r = 0; r < R; ++r) acc_a[r] = acc_b[r] = 0.0f;
  int c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 wa[kUnroll], wb[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wb[u] = __ldcs(b + c + 32 * u);
    if (prefetched && c == lane) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wa[u] = pre[u];
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wa[u] = __ldcs(a + c + 32 * u);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float fa[8], fb[8];
      ToFloat8<T>(wa[u], fa);
      ToFloat8<T>(wb[u], fb);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float xf[8];
        ToFloat8<T>(xs[r * chunks + c + 32 * u], xf);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          acc_a[r] = fmaf(fa[i], xf[i], acc_a[r]);
          acc_b[r] = fmaf(fb[i], xf[i], acc_b[r]);
        }
      }
    }
  }
  for (; c < chunks; c += 32) {
    float fa[8], fb[8];
    ToFloat8<T>(__ldcs(a + c), fa);
    ToFloat8<T>(__ldcs(b + c), fb);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float xf[8];
      ToFloat8<T>(xs[r * chunks + c], xf);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        acc_a[r] = fmaf(fa[i], xf[i], acc_a[r]);
        acc_b[r] = fmaf(fb[i], xf[i], acc_b[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) {
      acc_a[r] += __shfl_xor_sync(0xffffffffu, acc_a[r], s);
      acc_b[r] += __shfl_xor_sync(0xffffffffu, acc_b[r], s);
    }
  }
}

__device__ __forceinline__ uint16_t ToBits(float f, __nv_bfloat16*) { return FloatToBf16(f); }
__device__ __forceinline__ uint16_t ToBits(float f, __half*) { return FloatToFp16(f); }

// The GEMV of RMSNorm(x): each CTA normalises the R fp32 rows of x as RmsNormTo does into shared
// memory in the GEMV's type (with norm_threads <= kThreads, the threads of RmsNormTo's launch,
// each of as many threads sums the same float4s in the same order and the block reduction adds
// the same partial sums, the others' zeros changing nothing: the same bits), so the normed rows never go through global memory and the norm is
// not a launch of its own. Always launched as a programmatic dependent of the kernel before
// (which writes x). Plain: y[r][n] = Σ W[n]·xn[r]. SwiGLU (act != nullptr): W has 2·out rows,
// [gate | up], and act[r][n] = silu(g)·u of rows n and out + n, as SwiGluTo would write it.
template <typename T, int R, bool kPaired>
__global__ void __launch_bounds__(kThreads, kPaired ? 4 : 0)  // paired: still four CTAs an SM
    GemvNormedKernel(const float* __restrict__ x, int in, const float* __restrict__ norm_weight,
                     float eps, int norm_threads, const T* __restrict__ w, int out,
                     float* __restrict__ y, uint16_t* __restrict__ act) {
  extern __shared__ uint4 s_x[];  // [R][in / 8] chunks of the normed rows
  __shared__ float s_partial[R][kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int chunks = in / 8;
  const int first = blockIdx.x * kWarps + warp;
  const uint4* w4 = reinterpret_cast<const uint4*>(w);
  // The first weights depend on nothing before: ask for them, then wait for x.
  uint4 pre[kUnroll];
  const bool prefetched = first < out && lane + 32 * (kUnroll - 1) < chunks;
  if (prefetched) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) pre[u] = __ldcs(w4 + int64_t{first} * chunks + lane + 32 * u);
  }
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  ptx::GridDependencyWait();
  // Σx² per row in RmsNormToVec4Kernel's order (thread t < nt sums float4s t, t + nt, ...),
  // every load of a thread's x and norm weights asked for before its first sum: one trip to L2
  // where a loop of dependent loads took one per float4. The same threads then write the normed
  // values of the float4s they hold; a row longer than kNormHeld float4s a thread finishes from
  // a loop.
  const int n4 = in / 4;
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const float4* nw4 = reinterpret_cast<const float4*>(norm_weight);
  const int nt = norm_threads <= kThreads ? norm_threads : kThreads;
  const bool norms = threadIdx.x < nt;
  // At one row, x and the norm weights stay in registers until the rows are normed; at two,
  // those registers would spill the streaming loop's, so x is read again from L1 there.
  constexpr bool kHeldToNorm = R == 1;
  float4 xv[R][kNormHeld<R, kPaired>], gv[kNormHeld<R, kPaired>];
#pragma unroll
  for (int k = 0; k < kNormHeld<R, kPaired>; ++k) {
    const int i = threadIdx.x + k * nt;
    const bool held = norms && i < n4;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int r = 0; r < R; ++r) xv[r][k] = held ? __ldg(x4 + int64_t{r} * n4 + i) : zero;
    if constexpr (kHeldToNorm) gv[k] = held ? __ldg(nw4 + i) : zero;
  }
  float ss[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    ss[r] = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormHeld<R, kPaired>; ++k) {
      const float4 v = xv[r][k];  // zeros past the row: ss unchanged
      ss[r] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    for (int i = threadIdx.x + kNormHeld<R, kPaired> * nt; norms && i < n4; i += nt) {
      const float4 v = __ldg(x4 + int64_t{r} * n4 + i);
      ss[r] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss[r] += __shfl_xor_sync(0xffffffffu, ss[r], o);
    if (lane == 0) s_partial[r][warp] = ss[r];
  }
  __syncthreads();
  float inv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = lane < kWarps ? s_partial[r][lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    inv[r] = rsqrtf(v / in + eps);
  }
  // The normed rows, rounded to T, four values per thread and float4.
  uint2* s_x2 = reinterpret_cast<uint2*>(s_x);
  T* tag = nullptr;
  auto normed = [&](const float4& v, const float4& g, float s) {
    const uint32_t lo = ToBits(v.x * s * g.x, tag) | uint32_t{ToBits(v.y * s * g.y, tag)} << 16;
    const uint32_t hi = ToBits(v.z * s * g.z, tag) | uint32_t{ToBits(v.w * s * g.w, tag)} << 16;
    return make_uint2(lo, hi);
  };
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int k = 0; k < kNormHeld<R, kPaired>; ++k) {
      const int i = threadIdx.x + k * nt;
      if (!(norms && i < n4)) continue;
      if constexpr (kHeldToNorm) {
        s_x2[r * n4 + i] = normed(xv[r][k], gv[k], inv[r]);
      } else {  // x again, from L1 (a plain load: not merged with the first pass's)
        s_x2[r * n4 + i] = normed(x4[int64_t{r} * n4 + i], __ldg(nw4 + i), inv[r]);
      }
    }
    for (int i = threadIdx.x + kNormHeld<R, kPaired> * nt; norms && i < n4; i += nt) {
      s_x2[r * n4 + i] = normed(__ldg(x4 + int64_t{r} * n4 + i), __ldg(nw4 + i), inv[r]);
    }
  }
  __syncthreads();
  const int stride = gridDim.x * kWarps;
  for (int n = first; n < out;) {
    float acc[R];
    if (act == nullptr) {
      const int next = n + stride;
      if (kPaired && next < out) {  // rows n and n + stride together (GemvVariant::paired_rows)
        float acc2[R];
        RowDot2<T, R>(w4 + int64_t{n} * chunks, w4 + int64_t{next} * chunks, s_x, chunks, lane, pre,
                      prefetched && n == first, acc, acc2);
        if (lane == 0) {
#pragma unroll
          for (int r = 0; r < R; ++r) {
            y[int64_t{r} * out + n] = acc[r];
            y[int64_t{r} * out + next] = acc2[r];
          }
        }
        n = next + stride;
        continue;
      }
      RowDot<T, R>(w4 + int64_t{n} * chunks, s_x, chunks, lane, pre, prefetched && n == first, acc);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) y[int64_t{r} * out + n] = acc[r];
      }
      n = next;
      continue;
    }
    float up[R];
    if constexpr (kPaired) {  // the gate row and the up row together
      RowDot2<T, R>(w4 + int64_t{n} * chunks, w4 + int64_t{out + n} * chunks, s_x, chunks, lane,
                    pre, prefetched && n == first, acc, up);
    } else {
      RowDot<T, R>(w4 + int64_t{n} * chunks, s_x, chunks, lane, pre, prefetched && n == first, acc);
      RowDot<T, R>(w4 + int64_t{out + n} * chunks, s_x, chunks, lane, pre, false, up);
    }
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float g = acc[r];
        T* tag = nullptr;
        act[int64_t{r} * out + n] = ToBits(g / (1.0f + expf(-g)) * up[r], tag);
      }
    }
    n += stride;
  }
}

// CTAs of `kernel` with `smem` bytes of dynamic shared memory that fit the device at once (at
// least 1; 8192 if the device cannot be asked). Host queries, not stream work: they may run
// inside graph capture.
template <typename Kernel>
int WaveWith(Kernel kernel, size_t smem) {
  int device = 0, sms = 0, per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem) !=
          cudaSuccess) {
    return 8192;
  }
  return std::max(1, sms * per_sm);
}

// WaveWith(kernel, 0), asked once per kernel: a template per kernel, as kernels of one type
// (GemvKernel with and without kOverlap) would share a function-local static otherwise.
template <auto kernel>
int OneWave() {
  static const int ctas = WaveWith(kernel, 0);
  return ctas;
}

template <typename T, int R, bool kOverlap>
cudaError_t LaunchRowsAs(const T* x, int in, const T* w, int out, float* y, bool accumulate,
                       cudaStream_t stream, const GemvVariant& v) {
  // One warp per row of W; past the cap the grid-stride loop covers the rest.
  const int cap = v.one_wave ? OneWave<GemvKernel<T, R, kOverlap>>() : 8192;
  const int blocks = std::max(1, std::min((out + kWarps - 1) / kWarps, cap));
  return LaunchKernel(kOverlap, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                      GemvKernel<T, R, kOverlap>, x, in, w, out, y, accumulate);
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

template <typename T, int R>
cudaError_t LaunchNormedRows(const float* x, int in, const float* norm_weight, float eps,
                             const T* w, int out, float* y, void* act, cudaStream_t stream,
                             const GemvVariant& v) {
  const size_t smem = static_cast<size_t>(R) * in * sizeof(T);
  // One warp per row, or (one_wave) as many CTAs as fit at once, each warp taking several rows:
  // each CTA normalises the rows once, and no CTA of a later wave starts with the norm. Asked
  // per launch (smem follows the rows' length; a decode graph asks once, at capture).
  auto kernel = v.paired_rows ? GemvNormedKernel<T, R, true> : GemvNormedKernel<T, R, false>;
  const int cap = v.one_wave ? WaveWith(kernel, smem) : 8192;
  const dim3 grid(static_cast<unsigned>(std::max(1, std::min((out + kWarps - 1) / kWarps, cap))));
  // RmsNormTo's threads for a row of in / 4 float4s, up to kNormMaxVec each (model_ops.cu).
  const int per_thread = (in / 4 + 3) / 4;
  const int norm_threads = std::min(1024, std::max(32, (per_thread + 31) / 32 * 32));
  return LaunchKernel(true, grid, dim3(kThreads), smem, stream, kernel, x, in, norm_weight, eps,
                      norm_threads, w, out, y, static_cast<uint16_t*>(act));
}

template <typename T>
cudaError_t LaunchNormed(const float* x, int rows, int in, const float* norm_weight, float eps,
                         const void* w, int out, float* y, void* act, cudaStream_t stream,
                         const GemvVariant& v) {
  const T* wt = static_cast<const T*>(w);
  return rows == 1 ? LaunchNormedRows<T, 1>(x, in, norm_weight, eps, wt, out, y, act, stream, v)
                   : LaunchNormedRows<T, 2>(x, in, norm_weight, eps, wt, out, y, act, stream, v);
}

cudaError_t Normed(const float* x, int rows, int in, const float* norm_weight, float eps,
                   const void* w, int out, float* y, void* act, GemmType type, cudaStream_t stream,
                   const GemvVariant& v) {
  if (!GemvRmsNormedSupports(rows, in, type, x, norm_weight, w) || out <= 0 ||
      (act == nullptr && y == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return type == GemmType::kBf16
             ? LaunchNormed<__nv_bfloat16>(x, rows, in, norm_weight, eps, w, out, y, act, stream, v)
             : LaunchNormed<__half>(x, rows, in, norm_weight, eps, w, out, y, act, stream, v);
}

}  // namespace

bool GemvRmsNormedSupports(int rows, int in, GemmType type, const float* x,
                           const float* norm_weight, const void* w) {
  return rows >= 1 && rows <= kGemvNormedMaxRows && in > 0 && in % 8 == 0 &&
         int64_t{rows} * in * 2 <= kGemvNormedMaxSmemBytes &&
         (type == GemmType::kBf16 || type == GemmType::kFp16) &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(norm_weight) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

cudaError_t GemvRmsNormed(const float* x, int rows, int in, const float* norm_weight, float eps,
                          const void* w, int out, float* y, GemmType type, cudaStream_t stream,
                          const GemvVariant& variant) {
  if (y == nullptr) return cudaErrorInvalidValue;
  return Normed(x, rows, in, norm_weight, eps, w, out, y, nullptr, type, stream, variant);
}

cudaError_t GemvRmsNormedSwiGlu(const float* x, int rows, int in, const float* norm_weight,
                                float eps, const void* w, int out, void* act, GemmType type,
                                cudaStream_t stream, const GemvVariant& variant) {
  if (act == nullptr || reinterpret_cast<uintptr_t>(act) % 2 != 0) return cudaErrorInvalidValue;
  return Normed(x, rows, in, norm_weight, eps, w, out, nullptr, act, type, stream, variant);
}

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
