#pragma once

// The split decode kernels this round replaced, kept only so the benchmark can measure what
// each step bought side by side (SplitDecodeVariant with bf16_tensor_cores or parallel_merge
// off): BF16 window pages and a BF16 history in plain fp32 math, and the merge with one thread
// per channel walking every slot. Included by split_decode.cu only. Drop them with their
// variants once the step table (docs/benchmarks/attention.md) is no longer wanted.

#include <cuda_bf16.h>

#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_common.cuh"

namespace kvstrata::kernels::split {

// Sink and recent window: a few BF16 pages per sequence, one CTA per page, plain fp32 math.
// Window slot i of a sequence is its i-th sink page, then its recent pages. The variant with
// bf16_tensor_cores off (the former default, kept for the benchmark's side-by-side steps).
template <int D>
__global__ void __launch_bounds__(kThreads) Bf16PageKernel(SplitDecodeCudaParams p, Workspace ws) {
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const KvGeometry& geo = p.geometry;
  const int G = p.num_q_heads / geo.num_kv_heads;
  const int n0 = p.segments[0].num_pages(b), n2 = p.segments[2].num_pages(b);
  const int64_t row0 = PartialRow(ws, b, geo.num_kv_heads, h, i);
  if (i >= n0 + n2) {
    for (int e = threadIdx.x; e < G * D; e += kThreads) {
      ws.part_o[(row0 + e / D) * D + e % D] = 0.0f;
      if (e % D == 0) ws.part_lse[row0 + e / D] = -INFINITY;
    }
    return;
  }
  const PagedSegmentView& seg = i < n0 ? p.segments[0] : p.segments[2];
  const int page = i < n0 ? i : i - n0;
  const int tokens = page + 1 == seg.num_pages(b) ? seg.last_page_len[b] : geo.page_tokens;
  const uint32_t* kb = reinterpret_cast<const uint32_t*>(seg.block(geo, b, page, p.layer, 0, h));
  const uint32_t* vb = reinterpret_cast<const uint32_t*>(seg.block(geo, b, page, p.layer, 1, h));

  __shared__ float s_q[kMaxGroup][D];
  __shared__ uint32_t s_k[kPageTokens][D / 2 + 1];  // +1 word: rows fall in different banks
  __shared__ uint32_t s_v[kPageTokens][D / 2];
  __shared__ float s_p[kMaxGroup][kPageTokens];
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup];
  const float qscale = p.sm_scale * kLog2e;
  for (int e = threadIdx.x; e < kMaxGroup * D; e += kThreads) {
    const int n = e / D, d = e % D;
    s_q[n][d] = n < G ? __bfloat162float(__ushort_as_bfloat16(
                            p.q[(int64_t{b} * p.num_q_heads + h * G + n) * D + d])) *
                            qscale
                      : 0.0f;
  }
  for (int w = threadIdx.x; w < tokens * D / 2; w += kThreads) {
    s_k[w / (D / 2)][w % (D / 2)] = __ldg(kb + w);
    s_v[w / (D / 2)][w % (D / 2)] = __ldg(vb + w);
  }
  __syncthreads();
  {  // scores: thread -> (token, 4 heads)
    const int tok = threadIdx.x % kPageTokens, n0h = (threadIdx.x / kPageTokens) * 4;
    float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (tok < tokens) {
      for (int c = 0; c < D / 2; ++c) {
        const uint32_t w = s_k[tok][c];
        const float k0 = __uint_as_float(w << 16), k1 = __uint_as_float(w & 0xffff0000u);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          dot[j] += k0 * s_q[n0h + j][2 * c] + k1 * s_q[n0h + j][2 * c + 1];
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) s_p[n0h + j][tok] = tok < tokens ? dot[j] : -INFINITY;
  }
  __syncthreads();
  {  // softmax: warp -> 2 heads, lane -> tokens lane and lane + 32
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int n = warp; n < kMaxGroup; n += kWarps) {
      const float a = s_p[n][lane], c = s_p[n][lane + 32];
      float mx = fmaxf(a, c);
      for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
      const float pa = exp2f(a - mx), pc = exp2f(c - mx);
      float sum = pa + pc;
      for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
      s_p[n][lane] = pa;
      s_p[n][lane + 32] = pc;
      if (lane == 0) s_m[n] = mx, s_l[n] = sum;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < G * D; e += kThreads) {  // PV: thread -> (head, channel)
    const int n = e / D, d = e % D;
    float o = 0.0f;
    for (int tok = 0; tok < tokens; ++tok) {
      const uint32_t w = s_v[tok][d / 2];
      o += s_p[n][tok] * __uint_as_float(d % 2 ? (w & 0xffff0000u) : (w << 16));
    }
    ws.part_o[(row0 + n) * D + d] = o / s_l[n];
    if (d == 0) ws.part_lse[row0 + n] = (s_m[n] + log2f(s_l[n])) * kLn2;
  }
}

// History in BF16 with plain fp32 math, a page range per CTA, the softmax carried online from
// page to page: the variant with bf16_tensor_cores off (the former default, kept for the
// benchmark's side-by-side steps; Bf16HistoryMmaKernel is the one used).
template <int D>
__global__ void __launch_bounds__(kThreads)
    Bf16HistoryKernel(SplitDecodeCudaParams p, int pages_per_split, Workspace ws) {
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const KvGeometry& geo = p.geometry;
  const int G = p.num_q_heads / geo.num_kv_heads;
  const PagedSegmentView& seg = p.segments[kHistorySegment];
  const int npages = seg.num_pages(b);
  const int begin = split * pages_per_split;
  const int end = min(npages, begin + pages_per_split);
  const int64_t row0 = PartialRow(ws, b, geo.num_kv_heads, h, ws.window + split);

  __shared__ float s_q[kMaxGroup][D];
  __shared__ uint32_t s_k[kPageTokens][D / 2 + 1];  // +1 word: rows fall in different banks
  __shared__ uint32_t s_v[kPageTokens][D / 2];
  __shared__ float s_p[kMaxGroup][kPageTokens];
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup], s_alpha[kMaxGroup];
  const float qscale = p.sm_scale * kLog2e;
  for (int e = threadIdx.x; e < kMaxGroup * D; e += kThreads) {
    const int n = e / D, d = e % D;
    s_q[n][d] = n < G ? __bfloat162float(__ushort_as_bfloat16(
                            p.q[(int64_t{b} * p.num_q_heads + h * G + n) * D + d])) *
                            qscale
                      : 0.0f;
  }
  if (threadIdx.x < kMaxGroup) {
    s_m[threadIdx.x] = -INFINITY;
    s_l[threadIdx.x] = 0.0f;
  }
  // This thread's outputs: channel d = threadIdx.x % D of heads n = threadIdx.x / D + k * (kThreads / D).
  constexpr int kHeadStep = kThreads / D;  // 2 for D = 64, 1 for D = 128
  const int d = threadIdx.x % D, n_first = threadIdx.x / D;
  float o[kMaxGroup / kHeadStep];
#pragma unroll
  for (int j = 0; j < kMaxGroup / kHeadStep; ++j) o[j] = 0.0f;

  for (int page = begin; page < end; ++page) {
    const int tokens = page + 1 == npages ? seg.last_page_len[b] : geo.page_tokens;
    const uint32_t* kb = reinterpret_cast<const uint32_t*>(seg.block(geo, b, page, p.layer, 0, h));
    const uint32_t* vb = reinterpret_cast<const uint32_t*>(seg.block(geo, b, page, p.layer, 1, h));
    __syncthreads();  // the previous page is done with the staging area
    for (int w = threadIdx.x; w < tokens * D / 2; w += kThreads) {
      s_k[w / (D / 2)][w % (D / 2)] = __ldg(kb + w);
      s_v[w / (D / 2)][w % (D / 2)] = __ldg(vb + w);
    }
    __syncthreads();
    {  // scores: thread -> (token, 4 heads)
      const int tok = threadIdx.x % kPageTokens, n0h = (threadIdx.x / kPageTokens) * 4;
      if (n0h < G) {
        float dot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (tok < tokens) {
          for (int c = 0; c < D / 2; ++c) {
            const uint32_t w = s_k[tok][c];
            const float k0 = __uint_as_float(w << 16), k1 = __uint_as_float(w & 0xffff0000u);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float2 q2 = *reinterpret_cast<const float2*>(&s_q[n0h + j][2 * c]);
              dot[j] += k0 * q2.x + k1 * q2.y;
            }
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) s_p[n0h + j][tok] = tok < tokens ? dot[j] : -INFINITY;
      }
    }
    __syncthreads();
    // Online softmax: warp -> heads, lane -> tokens lane and lane + 32.
    for (int n = warp; n < G; n += kWarps) {
      const float a = s_p[n][lane], c = s_p[n][lane + 32];
      float mx = fmaxf(a, c);
      for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
      const float m_old = s_m[n], m_new = fmaxf(m_old, mx);  // a page has >= 1 token: finite
      const float pa = exp2f(a - m_new), pc = exp2f(c - m_new);
      float sum = pa + pc;
      for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
      s_p[n][lane] = pa;
      s_p[n][lane + 32] = pc;
      __syncwarp();
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first page (m_old = -inf)
        s_alpha[n] = alpha;
        s_l[n] = s_l[n] * alpha + sum;
        s_m[n] = m_new;
      }
    }
    __syncthreads();
    // PV: every token's value of channel d, for each of this thread's heads.
    float acc[kMaxGroup / kHeadStep];
#pragma unroll
    for (int j = 0; j < kMaxGroup / kHeadStep; ++j) acc[j] = 0.0f;
    for (int tok = 0; tok < tokens; ++tok) {
      const uint32_t w = s_v[tok][d / 2];
      const float v = __uint_as_float(d % 2 ? (w & 0xffff0000u) : (w << 16));
#pragma unroll
      for (int j = 0; j < kMaxGroup / kHeadStep; ++j) {
        const int n = n_first + j * kHeadStep;
        if (n < G) acc[j] += s_p[n][tok] * v;
      }
    }
#pragma unroll
    for (int j = 0; j < kMaxGroup / kHeadStep; ++j) {
      const int n = n_first + j * kHeadStep;
      if (n < G) o[j] = o[j] * s_alpha[n] + acc[j];
    }
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kMaxGroup / kHeadStep; ++j) {
    const int n = n_first + j * kHeadStep;
    if (n >= G) continue;
    const float L = s_l[n];
    ws.part_o[(row0 + n) * D + d] = L > 0.0f ? o[j] / L : 0.0f;
    if (d == 0) ws.part_lse[row0 + n] = L > 0.0f ? (s_m[n] + log2f(L)) * kLn2 : -INFINITY;
  }
}

// The merge with one thread per channel walking every slot (parallel_merge off: the former
// default, kept for the benchmark's side-by-side steps).
template <int D>
__global__ void MergeKernel(SplitDecodeCudaParams p, Workspace ws) {
  ptx::GridDependencyWait();  // the partials (a no-op unless launched early)
  ptx::LaunchDependents();
  const int b = blockIdx.x / p.num_q_heads, hq = blockIdx.x % p.num_q_heads;
  const int G = p.num_q_heads / p.geometry.num_kv_heads;
  const int h = hq / G, n = hq % G;
  const int64_t row0 = PartialRow(ws, b, p.geometry.num_kv_heads, h, 0);
  float M = -INFINITY;
  for (int s = 0; s < ws.slots; ++s) M = fmaxf(M, ws.part_lse[row0 + int64_t{s} * kMaxGroup + n]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float O = 0.0f, L = 0.0f;
    if (M != -INFINITY) {
      for (int s = 0; s < ws.slots; ++s) {
        const float lse = ws.part_lse[row0 + int64_t{s} * kMaxGroup + n];
        if (lse == -INFINITY) continue;
        const float w = __expf(lse - M);
        L += w;
        O += w * ws.part_o[(row0 + int64_t{s} * kMaxGroup + n) * D + d];
      }
    }
    StoreOutput(p, b, hq, d, L > 0.0f ? O / L : 0.0f);
    if (d == 0 && p.lse)
      p.lse[int64_t{b} * p.num_q_heads + hq] = L > 0.0f ? M + logf(L) : -INFINITY;
  }
}

}  // namespace kvstrata::kernels::split
