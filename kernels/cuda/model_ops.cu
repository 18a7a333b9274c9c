#include "kernels/cuda/model_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/numeric.h"

namespace kvstrata::kernels {

namespace {

// Element i of an array of `type`.
__device__ __forceinline__ void Store(void* out, int64_t i, float f, GemmType type) {
  switch (type) {
    case GemmType::kBf16:
      static_cast<uint16_t*>(out)[i] = FloatToBf16(f);
      break;
    case GemmType::kFp16:
      static_cast<uint16_t*>(out)[i] = FloatToFp16(f);
      break;
    case GemmType::kFp32:
      static_cast<float*>(out)[i] = f;
      break;
  }
}

// Elements i..i+3 of an array of `type` (i a multiple of 4, the array 16-byte aligned): one
// 8- or 16-byte store instead of four.
__device__ __forceinline__ void Store4(void* out, int64_t i, float4 f, GemmType type) {
  switch (type) {
    case GemmType::kBf16:
    case GemmType::kFp16: {
      const bool bf = type == GemmType::kBf16;
      const uint32_t lo = bf ? FloatToBf16(f.x) | uint32_t{FloatToBf16(f.y)} << 16
                             : FloatToFp16(f.x) | uint32_t{FloatToFp16(f.y)} << 16;
      const uint32_t hi = bf ? FloatToBf16(f.z) | uint32_t{FloatToBf16(f.w)} << 16
                             : FloatToFp16(f.z) | uint32_t{FloatToFp16(f.w)} << 16;
      reinterpret_cast<uint2*>(static_cast<uint16_t*>(out) + i)[0] = make_uint2(lo, hi);
      break;
    }
    case GemmType::kFp32:
      reinterpret_cast<float4*>(static_cast<float*>(out) + i)[0] = f;
      break;
  }
}

__device__ __forceinline__ float Load(const void* in, int64_t i, GemmType type) {
  switch (type) {
    case GemmType::kBf16:
      return Bf16ToFloat(static_cast<const uint16_t*>(in)[i]);
    case GemmType::kFp16:
      return Fp16ToFloat(static_cast<const uint16_t*>(in)[i]);
    case GemmType::kFp32:
      break;
  }
  return static_cast<const float*>(in)[i];
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024).
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = lane < warps ? partial[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kRowThreads = 256;

__global__ void EmbeddingKernel(const void* table, GemmType type, int vocab, int hidden,
                                const int32_t* ids, float* out) {
  const int t = blockIdx.x;
  const int id = ids[t];
  float* dst = out + int64_t{t} * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    dst[i] = id >= 0 && id < vocab ? Load(table, int64_t{id} * hidden + i, type) : 0.0f;
  }
}

__global__ void RmsNormToKernel(const float* x, int64_t x_stride, int dim, const float* weight,
                                float eps, void* y, GemmType type) {
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  const float* xr = x + blockIdx.x * x_stride;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / dim + eps);
  const int64_t y0 = int64_t{blockIdx.x} * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) Store(y, y0 + i, xr[i] * inv * weight[i], type);
}

// RmsNormToKernel for rows of dim % 4 == 0 values, 16-byte aligned: each thread loads up to
// kMaxVec float4s once, keeps them in registers for the second pass, and every load of a thread
// is independent of the others (the loop above waits on one load per iteration, ~13 us for one
// 4,096-wide row; a row at batch 1 is latency, not bandwidth).
constexpr int kNormMaxVec = 4;
__global__ void RmsNormToVec4Kernel(const float* __restrict__ x, int64_t x_stride, int dim,
                                    const float* __restrict__ weight, float eps,
                                    void* __restrict__ y, GemmType type) {
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  const float4* xr = reinterpret_cast<const float4*>(x + blockIdx.x * x_stride);
  const float4* w4 = reinterpret_cast<const float4*>(weight);
  const int n4 = dim / 4;
  float4 v[kNormMaxVec];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormMaxVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < n4 ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  ss = BlockSum(ss);
  const float inv = rsqrtf(ss / dim + eps);
  const int64_t y0 = int64_t{blockIdx.x} * dim;
#pragma unroll
  for (int k = 0; k < kNormMaxVec; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n4) break;
    const float4 w = w4[i];
    Store4(y, y0 + 4 * i,
           make_float4(v[k].x * inv * w.x, v[k].y * inv * w.y, v[k].z * inv * w.z,
                       v[k].w * inv * w.w),
           type);
  }
}

// One warp per row of head_dim <= 256 values.
__global__ void RmsNormInPlaceKernel(float* x, int rows, int dim, const float* weight, float eps) {
  const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float* xr = x + int64_t{row} * dim;
  float ss = 0.0f;
  for (int i = lane; i < dim; i += 32) ss += xr[i] * xr[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = rsqrtf(ss / dim + eps);
  for (int i = lane; i < dim; i += 32) xr[i] = xr[i] * inv * weight[i];
}

__global__ void AddBiasKernel(float* y, int64_t n, int cols, const float* bias) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] += bias[i % cols];
  }
}

__global__ void RopeTablesKernel(const int32_t* positions, int tokens, int half, int head_dim,
                                 float theta, float* cos_out, float* sin_out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= int64_t{tokens} * half) return;
  const int t = static_cast<int>(i / half), f = static_cast<int>(i % half);
  // As the CPU: the frequency in float, the angle and its cosine and sine in double.
  const float inv_freq = static_cast<float>(pow(double{theta}, -2.0 * f / head_dim));
  const double angle = static_cast<double>(positions[t]) * inv_freq;
  cos_out[i] = static_cast<float>(cos(angle));
  sin_out[i] = static_cast<float>(sin(angle));
}

__global__ void RopeKernel(float* x, int tokens, int heads, int head_dim, const float* cos_t,
                           const float* sin_t, bool interleaved) {
  const int half = head_dim / 2;
  const int64_t n = int64_t{tokens} * heads * half;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int f = static_cast<int>(i % half);
    const int64_t th = i / half;  // token * heads + head
    const int t = static_cast<int>(th / heads);
    float* v = x + th * head_dim;
    float* a = interleaved ? v + 2 * f : v + f;
    float* b = interleaved ? v + 2 * f + 1 : v + f + half;
    const float c = cos_t[int64_t{t} * half + f], s = sin_t[int64_t{t} * half + f];
    const float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
  }
}

__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, int cols,
                             int64_t in_stride, void* out, GemmType type) {
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t at = i / cols * in_stride + i % cols;
    const float g = gate[at];
    Store(out, i, g / (1.0f + expf(-g)) * up[at], type);
  }
}

// One warp per (token, head) of the q, k and v heads side by side; lane l holds elements
// l + 32 j, so RoPE's (i, i + D / 2) pairs sit in one lane and (2i, 2i + 1) in lanes l, l ^ 1.
template <int J>  // head_dim / 32
__global__ void SplitQkvHeadsKernel(QkvHeadsParams p) {
  if (p.dependents_at_start) ptx::LaunchDependents();
  ptx::GridDependencyWait();  // launched early (overlap_previous): qkv is the kernel before's
  if (!p.dependents_at_start) ptx::LaunchDependents();
  constexpr int D = 32 * J;
  const int heads = p.q_heads + 2 * p.kv_heads;
  const int64_t row = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= int64_t{p.tokens} * heads) return;
  const int lane = threadIdx.x % 32;
  const int t = static_cast<int>(row / heads), h = static_cast<int>(row % heads);
  const float* bias;
  const float* norm;
  float* dst = nullptr;
  uint16_t* dst_bf16 = nullptr;  // or the row in BF16 (a folded append or query gather)
  if (h < p.q_heads) {
    bias = p.bq ? p.bq + h * D : nullptr;
    norm = p.q_norm;
    const int64_t at = (int64_t{t} * p.q_heads + h) * D;
    if (p.q_bf16) {
      dst_bf16 = p.q_bf16 + at;
    } else {
      dst = p.q + at;
    }
  } else {
    const int kind = h < p.q_heads + p.kv_heads ? 0 : 1;
    const int kh = h - p.q_heads - kind * p.kv_heads;
    const float* b = kind == 0 ? p.bk : p.bv;
    bias = b ? b + kh * D : nullptr;
    norm = kind == 0 ? p.k_norm : nullptr;
    if (p.bf16_pool) {
      uint8_t* block = p.bf16_pool + int64_t{p.slot[t]} * p.slot_stride +
                       BlockOffset(p.geometry, PageEncoding::kBf16, 0, kind, kh);
      dst_bf16 = reinterpret_cast<uint16_t*>(block) + p.row[t] * D;
    } else {
      dst = (kind == 0 ? p.k : p.v) + (int64_t{t} * p.kv_heads + kh) * D;
    }
  }
  const float* src = p.qkv + row * D;
  float x[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    x[j] = src[lane + 32 * j];
    if (bias) x[j] += bias[lane + 32 * j];
  }
  if (h < p.q_heads + p.kv_heads) {
    if (norm) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < J; ++j) ss += x[j] * x[j];
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = rsqrtf(ss / D + p.eps);
#pragma unroll
      for (int j = 0; j < J; ++j) x[j] = x[j] * inv * norm[lane + 32 * j];
    }
    constexpr int kHalf = D / 2;
    const float* cos_t = p.cos + int64_t{t} * kHalf;
    const float* sin_t = p.sin + int64_t{t} * kHalf;
    if (p.interleaved) {
#pragma unroll
      for (int j = 0; j < J; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, x[j], 1);
        const int f = (lane + 32 * j) >> 1;
        const float c = cos_t[f], s = sin_t[f];
        x[j] = (lane & 1) == 0 ? x[j] * c - other * s : other * s + x[j] * c;
      }
    } else {
#pragma unroll
      for (int j = 0; j < J / 2; ++j) {
        const int f = lane + 32 * j;
        const float c = cos_t[f], s = sin_t[f];
        const float x0 = x[j], x1 = x[j + J / 2];
        x[j] = x0 * c - x1 * s;
        x[j + J / 2] = x0 * s + x1 * c;
      }
    }
  }
  if (dst_bf16) {
#pragma unroll
    for (int j = 0; j < J; ++j) dst_bf16[lane + 32 * j] = FloatToBf16(x[j]);
  } else {
#pragma unroll
    for (int j = 0; j < J; ++j) dst[lane + 32 * j] = x[j];
  }
}

__global__ void ConvertFloatKernel(const float* in, int64_t n, void* out, GemmType type) {
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    Store(out, i, in[i], type);
  }
}

// One CTA per (row tile, head): threads over output channels, the rows of the tile staged in
// shared memory; R is read through the cache (it is reused by every row).
constexpr int kRotateRows = 8;

template <int D>
__global__ void RotateHeadsKernel(const float* in, int rows, int heads, const float* R, int group,
                                  bool transpose, void* out, GemmType type) {
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  const int h = blockIdx.y;
  const int r0 = blockIdx.x * kRotateRows;
  const int c = threadIdx.x;
  const float* rot = R + int64_t{h / group} * D * D;
  __shared__ float x[kRotateRows][D];
  const int n = min(kRotateRows, rows - r0);
  for (int r = 0; r < n; ++r) x[r][c] = in[(int64_t{r0 + r} * heads + h) * D + c];
  __syncthreads();
  float acc[kRotateRows];
#pragma unroll
  for (int r = 0; r < kRotateRows; ++r) acc[r] = 0.0f;
  for (int i = 0; i < D; ++i) {
    // y[c] = Σ_i x[i] R[i][c], or Σ_i x[i] R[c][i] for Rᵀ.
    const float w = transpose ? __ldg(rot + int64_t{c} * D + i) : __ldg(rot + int64_t{i} * D + c);
#pragma unroll
    for (int r = 0; r < kRotateRows; ++r) acc[r] = fmaf(x[r][i], w, acc[r]);
  }
  for (int r = 0; r < n; ++r) Store(out, (int64_t{r0 + r} * heads + h) * D + c, acc[r], type);
}

__global__ void GatherRowsKernel(const float* in, int cols, const int32_t* row_ids, float* out) {
  const int r = blockIdx.x;
  const float* src = in + int64_t{row_ids[r]} * cols;
  float* dst = out + int64_t{r} * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

__global__ void GatherRowsToKernel(const float* in, int cols, const int32_t* row_ids, void* out,
                                   GemmType type) {
  // Launched early (overlap_previous): wait for the kernel before, then let the one after start
  // (the split decode asks for its pages then: every launch before this one has finished).
  ptx::GridDependencyWait();
  ptx::LaunchDependents();
  const int r = blockIdx.x;
  const float* src = in + int64_t{row_ids[r]} * cols;
  const int64_t dst = int64_t{r} * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) Store(out, dst + i, src[i], type);
}

// GatherRowsTo/ScatterRowsTo for rows of cols % 4 == 0 values, 16-byte aligned: one float4 per
// thread and iteration, the loads of a thread independent (restrict), so a 4,096-wide row is one
// round trip to memory instead of sixteen.
template <bool kScatter>
__global__ void MoveRowsToVec4Kernel(const float* __restrict__ in, int cols,
                                     const int32_t* __restrict__ row_ids, void* __restrict__ out,
                                     GemmType type) {
  // Launched early (overlap_previous): wait for the kernel before, then let the one after start,
  // a GEMV streaming its weights (after a scatter) or the split decode asking for its pages
  // (after the query gather: every launch before this one has finished by then).
  ptx::GridDependencyWait();
  ptx::LaunchDependents();
  const int r = blockIdx.x;
  const float4* src =
      reinterpret_cast<const float4*>(in + int64_t{kScatter ? r : row_ids[r]} * cols);
  const int64_t dst = int64_t{kScatter ? row_ids[r] : r} * cols;
#pragma unroll 4
  for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) Store4(out, dst + 4 * i, src[i], type);
}

__global__ void ScatterRowsKernel(const float* in, int cols, const int32_t* row_ids, float* out) {
  const int r = blockIdx.x;
  const float* src = in + int64_t{r} * cols;
  float* dst = out + int64_t{row_ids[r]} * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) dst[i] = src[i];
}

__global__ void ScatterRowsToKernel(const float* in, int cols, const int32_t* row_ids, void* out,
                                    GemmType type) {
  ptx::GridDependencyWait();  // launched early (overlap_previous)
  ptx::LaunchDependents();  // the GEMV after this one may start streaming its weights
  const int r = blockIdx.x;
  const float* src = in + int64_t{r} * cols;
  const int64_t dst = int64_t{row_ids[r]} * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) Store(out, dst + i, src[i], type);
}

// Threads for one row of n4 float4s, one float4 each where the block allows (a multiple of 32).
int Vec4Threads(int n4) { return std::min(1024, std::max(32, (n4 + 31) / 32 * 32)); }

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

}  // namespace

cudaError_t EmbeddingGather(const void* table, GemmType type, int vocab, int hidden,
                            const int32_t* ids, int tokens, float* out, cudaStream_t stream) {
  if (tokens <= 0) return cudaSuccess;
  EmbeddingKernel<<<tokens, kRowThreads, 0, stream>>>(table, type, vocab, hidden, ids, out);
  return cudaGetLastError();
}

cudaError_t RmsNormTo(const float* x, int64_t x_stride, int rows, int dim, const float* weight,
                      float eps, void* y, GemmType type, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int n4 = dim / 4;
  if (dim % 4 == 0 && x_stride % 4 == 0 && n4 <= 1024 * kNormMaxVec && Aligned16(x) &&
      Aligned16(weight) && Aligned16(y)) {
    RmsNormToVec4Kernel<<<rows, Vec4Threads((n4 + kNormMaxVec - 1) / kNormMaxVec), 0, stream>>>(
        x, x_stride, dim, weight, eps, y, type);
  } else {
    RmsNormToKernel<<<rows, kRowThreads, 0, stream>>>(x, x_stride, dim, weight, eps, y, type);
  }
  return cudaGetLastError();
}

cudaError_t RmsNormInPlace(float* x, int rows, int dim, const float* weight, float eps,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  constexpr int kWarpsPerBlock = 8;
  RmsNormInPlaceKernel<<<(rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 32 * kWarpsPerBlock, 0,
                         stream>>>(x, rows, dim, weight, eps);
  return cudaGetLastError();
}

cudaError_t AddBias(float* y, int rows, int cols, const float* bias, cudaStream_t stream) {
  const int64_t n = int64_t{rows} * cols;
  if (n <= 0) return cudaSuccess;
  AddBiasKernel<<<GridFor(n, 256), 256, 0, stream>>>(y, n, cols, bias);
  return cudaGetLastError();
}

cudaError_t RopeTables(const int32_t* positions, int tokens, int head_dim, float theta,
                       float* cos, float* sin, cudaStream_t stream) {
  const int half = head_dim / 2;
  const int64_t n = int64_t{tokens} * half;
  if (n <= 0) return cudaSuccess;
  RopeTablesKernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(
      positions, tokens, half, head_dim, theta, cos, sin);
  return cudaGetLastError();
}

cudaError_t ApplyRope(float* x, int tokens, int heads, int head_dim, const float* cos,
                      const float* sin, bool interleaved, cudaStream_t stream) {
  const int64_t n = int64_t{tokens} * heads * (head_dim / 2);
  if (n <= 0) return cudaSuccess;
  RopeKernel<<<GridFor(n, 256), 256, 0, stream>>>(x, tokens, heads, head_dim, cos, sin,
                                                   interleaved);
  return cudaGetLastError();
}

cudaError_t SwiGluTo(const float* gate, const float* up, int64_t rows, int cols,
                     int64_t in_stride, void* out, GemmType type, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  if (in_stride < cols) return cudaErrorInvalidValue;
  SwiGluKernel<<<GridFor(n, 256), 256, 0, stream>>>(gate, up, n, cols, in_stride, out, type);
  return cudaGetLastError();
}

cudaError_t SplitQkvHeads(const QkvHeadsParams& p, cudaStream_t stream) {
  const int64_t rows = int64_t{p.tokens} * (p.q_heads + 2 * p.kv_heads);
  if (rows <= 0) return cudaSuccess;
  if ((p.q_norm == nullptr) != (p.k_norm == nullptr)) return cudaErrorInvalidValue;
  if (p.bf16_pool && (p.slot == nullptr || p.row == nullptr)) return cudaErrorInvalidValue;
  constexpr int kWarpsPerBlock = 8;
  const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const dim3 grid(blocks), block(32 * kWarpsPerBlock);
  switch (p.head_dim) {
    case 64:
      return LaunchKernel(p.overlap_previous, grid, block, 0, stream, SplitQkvHeadsKernel<2>, p);
    case 128:
      return LaunchKernel(p.overlap_previous, grid, block, 0, stream, SplitQkvHeadsKernel<4>, p);
    case 256:
      return LaunchKernel(p.overlap_previous, grid, block, 0, stream, SplitQkvHeadsKernel<8>, p);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t ConvertFloat(const float* in, int64_t n, void* out, GemmType type,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ConvertFloatKernel<<<GridFor(n, 256), 256, 0, stream>>>(in, n, out, type);
  return cudaGetLastError();
}

cudaError_t RotateHeads(const float* in, int rows, int heads, int head_dim, const float* R,
                        int group, bool transpose, float* out, cudaStream_t stream) {
  return RotateHeadsTo(in, rows, heads, head_dim, R, group, transpose, out, GemmType::kFp32,
                       stream);
}

cudaError_t RotateHeadsTo(const float* in, int rows, int heads, int head_dim, const float* R,
                          int group, bool transpose, void* out, GemmType type,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (group <= 0 || heads % group != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>((rows + kRotateRows - 1) / kRotateRows),
                  static_cast<unsigned>(heads));
  switch (head_dim) {
    case 64:
      RotateHeadsKernel<64>
          <<<grid, 64, 0, stream>>>(in, rows, heads, R, group, transpose, out, type);
      break;
    case 128:
      RotateHeadsKernel<128>
          <<<grid, 128, 0, stream>>>(in, rows, heads, R, group, transpose, out, type);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t GatherRows(const float* in, int cols, const int32_t* row_ids, int rows, float* out,
                       cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  GatherRowsKernel<<<rows, kRowThreads, 0, stream>>>(in, cols, row_ids, out);
  return cudaGetLastError();
}

cudaError_t GatherRowsTo(const float* in, int cols, const int32_t* row_ids, int rows, void* out,
                         GemmType type, cudaStream_t stream, bool overlap_previous) {
  if (rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows));
  if (cols % 4 == 0 && Aligned16(in) && Aligned16(out)) {
    return LaunchKernel(overlap_previous, grid, dim3(Vec4Threads(cols / 4)), 0, stream,
                        MoveRowsToVec4Kernel<false>, in, cols, row_ids, out, type);
  }
  return LaunchKernel(overlap_previous, grid, dim3(kRowThreads), 0, stream, GatherRowsToKernel, in,
                      cols, row_ids, out, type);
}

cudaError_t ScatterRows(const float* in, int cols, const int32_t* row_ids, int rows, float* out,
                        cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  ScatterRowsKernel<<<rows, kRowThreads, 0, stream>>>(in, cols, row_ids, out);
  return cudaGetLastError();
}

cudaError_t ScatterRowsTo(const float* in, int cols, const int32_t* row_ids, int rows, void* out,
                          GemmType type, cudaStream_t stream, bool overlap_previous) {
  if (rows <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(rows));
  if (cols % 4 == 0 && Aligned16(in) && Aligned16(out)) {
    return LaunchKernel(overlap_previous, grid, dim3(Vec4Threads(cols / 4)), 0, stream,
                        MoveRowsToVec4Kernel<true>, in, cols, row_ids, out, type);
  }
  return LaunchKernel(overlap_previous, grid, dim3(kRowThreads), 0, stream, ScatterRowsToKernel, in,
                      cols, row_ids, out, type);
}

}  // namespace kvstrata::kernels
