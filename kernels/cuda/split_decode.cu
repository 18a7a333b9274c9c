// Split decode attention over the INT2 page format, on tensor cores.
//
// History kernel, one CTA of 4 warps per (history page range, KV head, sequence); each warp
// streams whole 64-token pages. Both products run as mma.m16n8k16 with fp16 inputs and fp32
// accumulators, transposed so that the G <= 8 query heads of a KV head fill the n = 8 side:
//   Sᵀ[tokens x heads] = K[tokens x dims] · Qᵀ          (A = K codes, B = Q)
//   Oᵀ[dims x heads]   = Vᵀ[dims x tokens] · (P·s_v)ᵀ   (A = V codes, B = probabilities)
// The page layout (kv_layout.h: KCodeBit, VCodeBit) puts every A-fragment pair of codes at bits
// (2p, 16 + 2p) of one 32-bit word, so a pair becomes an fp16x2 with one lop3:
//   (w & (3 << 2p)) | 0x6400 = 1024 + 4^p · code        (p < 5; p >= 5 uses w >> 10)
// The 1024 bias and the 4^p weights are exact in fp16 and are undone on the fp32 side: per
// token for K (S = offset·Σq + scale·(R - 1024·Σq')), with q' = q / 4^p folded into Q, and
// per output channel for V. Dequantisation thus costs one logic op per two codes, and the
// per-token scale and offset never touch the codes.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_ref.h"
#include "kernels/cuda/split_decode.h"
#include "kernels/dispatch.h"

namespace kvstrata::kernels {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxGroup = 8;
constexpr int kPageTokens = 64;
constexpr int kStages = 2;  // shared-memory pages in flight per warp
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ uint32_t Lop3AndOr(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));  // (a & b) | c
  return d;
}

// Pair p of a word as fp16x2 {1024 + 4^j·code(bits 2p), 1024 + 4^j·code(bits 16+2p)}.
__device__ __forceinline__ uint32_t ExtractPair(uint32_t w, uint32_t w10, int p) {
  return p < 5 ? Lop3AndOr(w, 0x00030003u << (2 * p), 0x64006400u)
               : Lop3AndOr(w10, 0x00030003u << (2 * (p - 5)), 0x64006400u);
}

// 1 / 4^j for the weight of pair p: an exact power of two, built from its exponent bits.
__device__ __forceinline__ float PairWeightInv(int p) {
  return __int_as_float((127 - 2 * (p < 5 ? p : p - 5)) << 23);
}

// The K pair index of channel d (KCodeBit's `pair`).
__device__ __forceinline__ int KPairOf(int d) { return 2 * ((d / 16) % 4) + (d % 16) / 8; }

__device__ __forceinline__ void Mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 2^x in one MUFU instruction (exp2f adds range fix-ups we do not need: x <= 0 here, and
// results below 2^-126 are as good as zero for softmax weights).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t Transpose8x8(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float HalfLo(uint32_t x) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x & 0xffff)));
}
__device__ __forceinline__ float HalfHi(uint32_t x) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(x >> 16)));
}

// What one thread loads of one page (one layer, one KV head).
template <int D>
struct PageRegs {
  uint32_t k[8][D / 64];  // K row words of tokens g + 8r
  uint32_t kp[8];         // K {scale, offset} of those tokens
  uint32_t vp[8];         // V {scale, offset} of those tokens
  uint4 v[D / 32];        // V code chunks
};

// Bytes of one (page, layer, KV head): its K block then its V block.
template <int D>
constexpr int kStageBytes = 2 * kPageTokens*(D / 4 + 4);

// Registers from a page staged in shared memory (K block at `st`, V block after it).
template <int D>
__device__ __forceinline__ void LoadPage(PageRegs<D>& r, const uint8_t* st, int lane) {
  const uint8_t* kb = st;
  const uint8_t* vb = st + kStageBytes<D> / 2;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = g + 8 * i;
    if constexpr (D == 128) {
      const uint2 x = *reinterpret_cast<const uint2*>(kb + row * 32 + t * 8);
      r.k[i][0] = x.x;
      r.k[i][1] = x.y;
    } else {
      r.k[i][0] = *reinterpret_cast<const uint32_t*>(kb + row * 16 + t * 4);
    }
    r.kp[i] = *reinterpret_cast<const uint32_t*>(kb + kPageTokens * D / 4 + row * 4);
    r.vp[i] = *reinterpret_cast<const uint32_t*>(vb + kPageTokens * D / 4 + row * 4);
  }
#pragma unroll
  for (int c = 0; c < D / 32; ++c)
    r.v[c] = *reinterpret_cast<const uint4*>(vb + (c * 32 + lane) * 16);
}

// The bulk copy engine: global -> shared, completing on an mbarrier (sm_90).
__device__ __forceinline__ void BarrierInit(uint64_t* bar) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
}
__device__ __forceinline__ void BarrierExpect(uint64_t* bar, uint32_t bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  const uint32_t b = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(d),
      "l"(src), "r"(bytes), "r"(b)
      : "memory");
}
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra WAIT_%=;\n}" ::"r"(a),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ uint32_t Component(const uint4& x, int i) {
  return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

// Per-warp online-softmax state over the pages it has seen. Columns are the heads 2t, 2t+1.
template <int D>
struct WarpState {
  float o[D / 16][4];  // Oᵀ accumulators: (dim 16mb+g | +8, heads 2t | 2t+1)
  float m[2], l[2];    // running max (log2 units) and Σp (this thread's rows only)
  float sp[2];         // Σ p·s_v      (this thread's rows)
  float spo[2];        // Σ p·offset_v (this thread's rows)
};

template <int D>
__device__ __forceinline__ void ProcessPage(WarpState<D>& st, const PageRegs<D>& r,
                                            const uint32_t (&bq)[D / 16][2], const float (&sumq)[2],
                                            const float (&sumq4)[2]) {
  // Sᵀ = K·Qᵀ, four 16-token tiles; tile i holds tokens g+16i (row g) and g+16i+8 (row g+8).
  float s[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int step = 0; step < D / 16; ++step) {
      const uint32_t w0 = r.k[2 * i][step / 4], w1 = r.k[2 * i + 1][step / 4];
      const uint32_t w0s = w0 >> 10, w1s = w1 >> 10;
      const int pl = 2 * (step % 4), ph = pl + 1;
      Mma(s[i], ExtractPair(w0, w0s, pl), ExtractPair(w1, w1s, pl), ExtractPair(w0, w0s, ph),
          ExtractPair(w1, w1s, ph), bq[step][0], bq[step][1]);
    }
    // Undo the code bias and apply the token's scale and offset (fp32).
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t kp = r.kp[2 * i + (e >> 1)];
      const int col = e & 1;
      s[i][e] = HalfHi(kp) * sumq[col] + HalfLo(kp) * (s[i][e] - 1024.0f * sumq4[col]);
    }
  }
  // Online softmax per head column. Once the running maxima settle the rescale is skipped
  // (a warp-uniform vote), which changes nothing numerically: alpha would be exactly 1.
  float alpha[2];
  bool moved = false;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    float mx = fmaxf(fmaxf(s[0][col], s[0][col + 2]), fmaxf(s[1][col], s[1][col + 2]));
    mx = fmaxf(mx, fmaxf(fmaxf(s[2][col], s[2][col + 2]), fmaxf(s[3][col], s[3][col + 2])));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(st.m[col], mx);
    moved |= m_new != st.m[col];
    alpha[col] = Exp2(st.m[col] - m_new);  // 0 on the first page (m = -inf)
    st.m[col] = m_new;
  }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      st.l[col] *= alpha[col];
      st.sp[col] *= alpha[col];
      st.spo[col] *= alpha[col];
#pragma unroll
      for (int mb = 0; mb < D / 16; ++mb) {
        st.o[mb][col] *= alpha[col];
        st.o[mb][col + 2] *= alpha[col];
      }
    }
  }
  // P, then P' = P·s_v as the B operand of the second product (tokens x heads, transposed).
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float pv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = e & 1;
      const uint32_t vp = r.vp[2 * i + (e >> 1)];
      const float p = Exp2(s[i][e] - st.m[col]);
      st.l[col] += p;
      st.spo[col] += p * HalfHi(vp);
      pv[e] = p * HalfLo(vp);
    }
    const uint32_t h01 = PackHalf2(pv[0], pv[1]), h23 = PackHalf2(pv[2], pv[3]);
    // Σp' over the fp16 values the mma multiplies: the 1024 bias cancels only against those.
    st.sp[0] += HalfLo(h01) + HalfLo(h23);
    st.sp[1] += HalfHi(h01) + HalfHi(h23);
    const uint32_t b0 = Transpose8x8(h01);
    const uint32_t b1 = Transpose8x8(h23);
    // Oᵀ += Vᵀ·P'ᵀ over the 16 tokens of tile i (k-step i).
#pragma unroll
    for (int mb = 0; mb < D / 16; ++mb) {
      const int ug = (2 * mb) / 8;
      const int pl = (2 * mb) % 8, ph = pl + 1;
      const int slot0 = (i * 2 + 0) * (D / 64) + ug, slot1 = (i * 2 + 1) * (D / 64) + ug;
      const uint32_t w0 = Component(r.v[slot0 / 4], slot0 % 4);
      const uint32_t w1 = Component(r.v[slot1 / 4], slot1 % 4);
      const uint32_t w0s = w0 >> 10, w1s = w1 >> 10;
      Mma(st.o[mb], ExtractPair(w0, w0s, pl), ExtractPair(w0, w0s, ph), ExtractPair(w1, w1s, pl),
          ExtractPair(w1, w1s, ph), b0, b1);
    }
  }
}

struct Workspace {
  float* part_o;    // [batch][kv_heads][slots][kMaxGroup][D]
  float* part_lse;  // [batch][kv_heads][slots][kMaxGroup]
  int slots;        // window pages (sink, then recent) and then the history ranges
  int window;       // the first `window` slots are BF16 pages
};

__device__ __forceinline__ int64_t PartialRow(const Workspace& ws, int b, int kv_heads, int h,
                                              int slot) {
  return ((int64_t{b} * kv_heads + h) * ws.slots + slot) * kMaxGroup;
}

template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    Int2HistoryKernel(SplitDecodeCudaParams p, int pages_per_split, Workspace ws) {
  const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const KvGeometry& geo = p.geometry;
  const int G = p.num_q_heads / geo.num_kv_heads;
  const PagedSegmentView& seg = p.segments[kHistorySegment];
  const int npages = seg.num_pages(b);
  const int begin = split * pages_per_split;
  const int end = min(npages, begin + pages_per_split);

  __shared__ alignas(128) uint8_t s_stage[kWarps * kStages * kStageBytes<D>];
  __shared__ uint64_t s_bar[kWarps][kStages];
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  // Before the page loop the staging area holds the queries, after it the warps' outputs.
  float(*s_q)[D] = reinterpret_cast<float(*)[D]>(s_stage);
  float(*s_o)[kMaxGroup][D] = reinterpret_cast<float(*)[kMaxGroup][D]>(s_stage);
  static_assert(kWarps * kMaxGroup * D * 4 <= kWarps * kStages * kStageBytes<D>, "staging area");
  if (lane == 0) {
    for (int i = 0; i < kStages; ++i) BarrierInit(&s_bar[warp][i]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }

  // Queries of this KV head's group, scaled for exp2.
  const float qscale = p.sm_scale * kLog2e;
  for (int i = threadIdx.x; i < kMaxGroup * D; i += kThreads) {
    const int n = i / D, d = i % D;
    float v = 0.0f;
    if (n < G) {
      const uint16_t bits = p.q[(int64_t{b} * p.num_q_heads + h * G + n) * D + d];
      v = __bfloat162float(__ushort_as_bfloat16(bits)) * qscale;
    }
    s_q[n][d] = v;
  }
  __syncthreads();
  // B fragments of Q': (dims 16s+2t, +1 | 16s+2t+8, +9 ; head g), divided by the pair weights.
  uint32_t bq[D / 16][2];
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {
    const int d0 = 16 * step + 2 * t, d1 = d0 + 8;
    const float w0 = PairWeightInv(2 * (step % 4)), w1 = PairWeightInv(2 * (step % 4) + 1);
    bq[step][0] = PackHalf2(s_q[g][d0] * w0, s_q[g][d0 + 1] * w0);
    bq[step][1] = PackHalf2(s_q[g][d1] * w1, s_q[g][d1 + 1] * w1);
  }
  // Σq and Σq' (the latter over the fp16 values the mma sees) per head: lane (g, t) sums a
  // quarter of head g's channels, the quad reduces, then each lane fetches heads 2t and 2t+1.
  float part_q = 0.0f, part_q4 = 0.0f;
#pragma unroll
  for (int d = t * (D / 4); d < (t + 1) * (D / 4); ++d) {
    const float q = s_q[g][d];
    part_q += q;
    part_q4 += __half2float(__float2half_rn(q * PairWeightInv(KPairOf(d))));
  }
  part_q += __shfl_xor_sync(0xffffffffu, part_q, 1);
  part_q += __shfl_xor_sync(0xffffffffu, part_q, 2);
  part_q4 += __shfl_xor_sync(0xffffffffu, part_q4, 1);
  part_q4 += __shfl_xor_sync(0xffffffffu, part_q4, 2);
  float sumq[2], sumq4[2];
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    sumq[col] = __shfl_sync(0xffffffffu, part_q, 4 * (2 * t + col));
    sumq4[col] = __shfl_sync(0xffffffffu, part_q4, 4 * (2 * t + col));
  }
  __syncthreads();  // every thread has its query fragments: the staging area is free

  WarpState<D> st;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    st.m[col] = -INFINITY;
    st.l[col] = st.sp[col] = st.spo[col] = 0.0f;
  }
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) st.o[mb][0] = st.o[mb][1] = st.o[mb][2] = st.o[mb][3] = 0.0f;

  // Each warp streams pages begin + warp, + 4, ... through kStages shared-memory stages filled by
  // the bulk copy engine, so several pages per warp are in flight while it computes.
  const int my_pages = begin + warp < end ? (end - (begin + warp) + kWarps - 1) / kWarps : 0;
  uint8_t* stages = s_stage + warp * kStages * kStageBytes<D>;
  uint64_t* bars = s_bar[warp];
  const uint32_t block_bytes = kPageTokens * (D / 4 + 4);
  auto issue = [&](int i) {  // lane 0: page i of this warp into stage i % kStages
    const int64_t slot = seg.indices[seg.indptr[b] + begin + warp + i * kWarps];
    const uint8_t* base = seg.pool + slot * seg.slot_stride;
    uint8_t* dst = stages + (i % kStages) * kStageBytes<D>;
    uint64_t* bar = bars + i % kStages;
    BarrierExpect(bar, 2 * block_bytes);
    BulkCopy(dst, base + BlockOffset(geo, seg.encoding, p.layer, 0, h), block_bytes, bar);
    BulkCopy(dst + block_bytes, base + BlockOffset(geo, seg.encoding, p.layer, 1, h), block_bytes,
             bar);
  };
  if (lane == 0) {
    for (int i = 0; i < kStages && i < my_pages; ++i) issue(i);
  }
  for (int i = 0; i < my_pages; ++i) {
    BarrierWait(bars + i % kStages, (i / kStages) & 1);
    PageRegs<D> cur;
    LoadPage(cur, stages + (i % kStages) * kStageBytes<D>, lane);
    __syncwarp();
    if (lane == 0 && i + kStages < my_pages) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads before its writes
      issue(i + kStages);
    }
    ProcessPage(st, cur, bq, sumq, sumq4);
  }
  // Row sums over the 8 row groups of the warp.
#pragma unroll
  for (int col = 0; col < 2; ++col) {
#pragma unroll
    for (int x = 4; x <= 16; x <<= 1) {
      st.l[col] += __shfl_xor_sync(0xffffffffu, st.l[col], x);
      st.sp[col] += __shfl_xor_sync(0xffffffffu, st.sp[col], x);
      st.spo[col] += __shfl_xor_sync(0xffffffffu, st.spo[col], x);
    }
  }
  __syncthreads();  // every warp is done with the staging area
  // This warp's unnormalised output per (head, dim): undo the bias and the pair weights.
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = e & 1, row_half = e >> 1;
      const int d = 16 * mb + g + 8 * row_half;
      const float winv = PairWeightInv((2 * mb + row_half) % 8);
      s_o[warp][2 * t + col][d] = (st.o[mb][e] - 1024.0f * st.sp[col]) * winv + st.spo[col];
    }
  }
  if (g == 0) {
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      s_m[warp][2 * t + col] = st.m[col];
      s_l[warp][2 * t + col] = st.l[col];
    }
  }
  __syncthreads();
  // Combine the warps and write this range's partial (o, lse).
  const int64_t row0 = PartialRow(ws, b, geo.num_kv_heads, h, ws.window + split);
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

// Sink and recent window: a few BF16 pages per sequence, one CTA per page, plain fp32 math.
// Window slot i of a sequence is its i-th sink page, then its recent pages.
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

// History in BF16 (the BF16 cache format, all of whose pages are BF16): a range of pages per
// CTA as for INT2, each page staged in shared memory and attended with plain fp32 math, the
// softmax carried online from page to page. Simpler than the INT2 kernel's tensor-core path;
// it makes the BF16 format's decode a paged split decode like INT2's, so the two compare.
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

template <int D>
__global__ void MergeKernel(SplitDecodeCudaParams p, Workspace ws) {
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
    p.out[(int64_t{b} * p.num_q_heads + hq) * D + d] = L > 0.0f ? O / L : 0.0f;
    if (d == 0 && p.lse)
      p.lse[int64_t{b} * p.num_q_heads + hq] = L > 0.0f ? M + logf(L) : -INFINITY;
  }
}

__global__ void FillKernel(uint8_t* pool, int64_t stride, int num_pages, KvGeometry g,
                           uint32_t seed) {
  const int64_t block_bytes = BlockBytes(g, PageEncoding::kInt2Uniform);
  const int64_t code_bytes = int64_t{g.page_tokens} * g.head_dim / 4;
  const int64_t body_words = NumBlocks(g) * block_bytes / 4;
  const int64_t total = body_words * num_pages;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t page = i / body_words, off = (i % body_words) * 4;
    const int64_t within = off % block_bytes;
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 15;
    x *= 2246822519u;
    x ^= x >> 13;
    uint32_t word = x;
    if (within >= code_bytes) {
      const float scale = 0.01f + (x & 0xff) * 1e-4f;
      word = static_cast<uint32_t>(__half_as_ushort(__float2half(scale))) |
             static_cast<uint32_t>(__half_as_ushort(__float2half(-1.5f * scale))) << 16;
    }
    *reinterpret_cast<uint32_t*>(pool + page * stride + kPageHeaderBytes + off) = word;
  }
}

}  // namespace

int SplitDecodeCtasPerSm(int head_dim, PageEncoding history) {
  int blocks = 0;
  const bool bf16 = history == PageEncoding::kBf16;
  const cudaError_t e =
      head_dim == 64
          ? (bf16 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Bf16HistoryKernel<64>,
                                                                 kThreads, 0)
                  : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Int2HistoryKernel<64>,
                                                                 kThreads, 0))
          : (bf16 ? cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Bf16HistoryKernel<128>,
                                                                 kThreads, 0)
                  : cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, Int2HistoryKernel<128>,
                                                                 kThreads, 0));
  return e == cudaSuccess && blocks > 0 ? blocks : 1;
}

SplitDecodePlan PlanSplitDecode(int batch, int num_kv_heads, int head_dim, int max_history_pages,
                                int max_window_pages, int num_sms, int ctas_per_sm) {
  SplitDecodePlan plan;
  plan.window_pages = std::max(1, max_window_pages);
  const int64_t units = std::max(1, batch * num_kv_heads);
  const int64_t capacity = int64_t{std::max(1, num_sms)} * std::max(1, ctas_per_sm);
  const int pages = std::max(1, max_history_pages);
  // Time ~ waves x (pages per CTA + a setup cost of about two pages): choose the split count
  // that minimises it, so the last wave is not a sliver of a few CTAs.
  double best = 1e300;
  for (int splits = 1; splits <= std::min(pages, 512); ++splits) {
    const int pps = (pages + splits - 1) / splits;
    const int used = (pages + pps - 1) / pps;
    if (used != splits) continue;
    const int64_t ctas = units * splits;
    const int64_t waves = (ctas + capacity - 1) / capacity;
    const double cost = static_cast<double>(waves) * (static_cast<double>(pps) / kWarps + 2.0);
    if (cost < best - 1e-9) best = cost, plan.splits = splits, plan.pages_per_split = pps;
  }
  const int64_t rows = units * (plan.window_pages + plan.splits) * kMaxGroup;
  plan.workspace_bytes = rows * head_dim * 4 + rows * 4;
  return plan;
}

cudaError_t LaunchSplitDecode(const SplitDecodeCudaParams& p, const SplitDecodePlan& plan,
                              void* workspace, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  const bool bf16_history = p.segments[kHistorySegment].encoding == PageEncoding::kBf16;
  if (g.num_kv_heads <= 0 || p.num_q_heads % g.num_kv_heads != 0 ||
      p.num_q_heads / g.num_kv_heads > kMaxGroup || g.page_tokens != kPageTokens ||
      (bf16_history ? false : g.group_size != g.head_dim) ||
      (!bf16_history && p.segments[kHistorySegment].encoding != PageEncoding::kInt2Uniform) ||
      p.segments[0].encoding != PageEncoding::kBf16 ||
      p.segments[2].encoding != PageEncoding::kBf16) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  Workspace ws;
  ws.window = plan.window_pages;
  ws.slots = plan.window_pages + plan.splits;
  const int64_t rows = int64_t{p.batch} * g.num_kv_heads * ws.slots * kMaxGroup;
  ws.part_o = static_cast<float*>(workspace);
  ws.part_lse = ws.part_o + rows * g.head_dim;
  return KV_DISPATCH_HEAD_DIM(g.head_dim, D, {
    if (bf16_history) {
      Bf16HistoryKernel<D><<<dim3(plan.splits, g.num_kv_heads, p.batch), kThreads, 0, stream>>>(
          p, plan.pages_per_split, ws);
    } else {
      Int2HistoryKernel<D><<<dim3(plan.splits, g.num_kv_heads, p.batch), kThreads, 0, stream>>>(
          p, plan.pages_per_split, ws);
    }
    Bf16PageKernel<D>
        <<<dim3(plan.window_pages, g.num_kv_heads, p.batch), kThreads, 0, stream>>>(p, ws);
    MergeKernel<D><<<p.batch * p.num_q_heads, D, 0, stream>>>(p, ws);
    return cudaGetLastError();
  });
}

cudaError_t FillRandomInt2Pages(uint8_t* pool, int64_t slot_stride, int num_pages,
                                const KvGeometry& geometry, uint32_t seed, cudaStream_t stream) {
  if (num_pages <= 0) return cudaSuccess;
  FillKernel<<<1024, 256, 0, stream>>>(pool, slot_stride, num_pages, geometry, seed);
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels
