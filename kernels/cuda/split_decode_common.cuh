#pragma once

// What the split decode kernels share (kernels/cuda/split_decode*.cu[h]): the CTA shape, the
// workspace of partials, and the combine of a CTA's per-warp partials into one (o, lse).

#include <cmath>
#include <cstdint>

#include "kernels/cuda/split_decode.h"
#include "kernels/numeric.h"

namespace kvstrata::kernels::split {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxGroup = 8;
constexpr int kPageTokens = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct Workspace {
  float* part_o;    // [batch][kv_heads][slots][kMaxGroup][D]
  float* part_lse;  // [batch][kv_heads][slots][kMaxGroup]
  int slots;        // window pages (sink, then recent) and then the history ranges
  int window;       // the first `window` slots are BF16 window pages, window_pages_per_slot each
  int window_pages_per_slot = 1;
  bool head_weights = true;  // CombineWarps: weights per (warp, head) first (SplitDecodeVariant)
};

// The merge's output value for (sequence b, query head hq, channel d): into p.out, or rounded
// into the row p.out_row_ids[b] of p.out_rows (SplitDecodeCudaParams).
__device__ __forceinline__ void StoreOutput(const SplitDecodeCudaParams& p, int b, int hq, int d,
                                            float v) {
  const int D = p.geometry.head_dim;
  if (p.out_rows == nullptr) {
    p.out[(int64_t{b} * p.num_q_heads + hq) * D + d] = v;
    return;
  }
  const int64_t row = p.out_row_ids ? p.out_row_ids[b] : b;
  p.out_rows[(row * p.num_q_heads + hq) * D + d] = p.out_rows_fp16 ? FloatToFp16(v) : FloatToBf16(v);
}

__device__ __forceinline__ int64_t PartialRow(const Workspace& ws, int b, int kv_heads, int h,
                                              int slot) {
  return ((int64_t{b} * kv_heads + h) * ws.slots + slot) * kMaxGroup;
}

// Combines the CTA's warps' partials and writes one slot's (o, lse): s_o[w][n][d] is warp w's
// unnormalised output for head n, s_m[w][n] its running max (log2 units, -inf when it saw no
// token) and s_l[w][n] its Σp. Every thread of the CTA calls it, after a __syncthreads().
template <int D>
__device__ __forceinline__ void CombineWarps(const float (*s_o)[kMaxGroup][D],
                                             const float (*s_m)[kMaxGroup],
                                             const float (*s_l)[kMaxGroup], int G, int64_t row0,
                                             const Workspace& ws) {
  if (ws.head_weights) {
    // Each head's warp weights exp2(m_w - M) / L once (a thread per head), then every output is
    // four fused multiply-adds over float4s of s_o: no exponent, division or branch per channel.
    __shared__ float s_f[kWarps][kMaxGroup];
    if (threadIdx.x < G) {
      const int n = threadIdx.x;
      float M = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w][n]);
      float f[kWarps], L = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        f[w] = s_m[w][n] == -INFINITY ? 0.0f : exp2f(s_m[w][n] - M);
        L += f[w] * s_l[w][n];
      }
      const float inv = L > 0.0f ? 1.0f / L : 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s_f[w][n] = f[w] * inv;
      ws.part_lse[row0 + n] = L > 0.0f ? (M + log2f(L)) * kLn2 : -INFINITY;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * D / 4; i += kThreads) {
      const int n = i / (D / 4), d = 4 * (i % (D / 4));
      float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float f = s_f[w][n];
        const float4 x = *reinterpret_cast<const float4*>(&s_o[w][n][d]);
        o.x += f * x.x;
        o.y += f * x.y;
        o.z += f * x.z;
        o.w += f * x.w;
      }
      *reinterpret_cast<float4*>(ws.part_o + (row0 + n) * D + d) = o;
    }
    return;
  }
  for (int i = threadIdx.x; i < G * D; i += kThreads) {
    const int n = i / D, d = i % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w][n]);
    float L = 0.0f, O = 0.0f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        if (s_m[w][n] == -INFINITY) continue;
        const float f = exp2f(s_m[w][n] - M);
        L += f * s_l[w][n];
        O += f * s_o[w][n][d];
      }
    }
    ws.part_o[(row0 + n) * D + d] = L > 0.0f ? O / L : 0.0f;
    if (d == 0) ws.part_lse[row0 + n] = L > 0.0f ? (M + log2f(L)) * kLn2 : -INFINITY;
  }
}

}  // namespace kvstrata::kernels::split
