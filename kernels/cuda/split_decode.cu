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
#include <atomic>
#include <cmath>

#include "kernels/attention_ref.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_bf16.cuh"
#include "kernels/cuda/split_decode_codec.cuh"
#include "kernels/cuda/split_decode_common.cuh"
#include "kernels/cuda/split_decode_fp32.cuh"
#include "kernels/cuda/split_decode_fragment.cuh"
#include "kernels/dispatch.h"

namespace kvstrata::kernels {

namespace {

using namespace split;  // NOLINT: the kernels' shared constants and workspace
using ptx::BarrierExpect;
using ptx::BarrierInit;
using ptx::BarrierWait;
using ptx::BulkCopy;
using ptx::Exp2;
using ptx::HalfHi;
using ptx::HalfLo;
using ptx::PackHalf2;
using ptx::Transpose8x8;

constexpr int kStages = 2;  // shared-memory pages in flight per warp (INT2)
constexpr int kBf16Stages = 3;  // BF16 pages in flight per CTA (BF16 history)

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
  ptx::MmaF16(c, a0, a1, a2, a3, b0, b1);
}

// What one thread holds of a page's V block.
template <int D>
struct VRegs {
  uint32_t vp[8];   // V {scale, offset} of tokens g + 8r
  uint4 v[D / 32];  // V code chunks
};

// What one thread loads of one page (one layer, one KV head).
template <int D>
struct PageRegs : VRegs<D> {
  uint32_t k[8][D / 64];  // K row words of tokens g + 8r
  uint32_t kp[8];         // K {scale, offset} of those tokens
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
__device__ __forceinline__ void KScores(float (&s)[4][4], const PageRegs<D>& r,
                                        const uint32_t (&bq)[D / 16][2], const float (&sumq)[2],
                                        const float (&sumq4)[2]) {
  // Sᵀ = K·Qᵀ, four 16-token tiles; tile i holds tokens g+16i (row g) and g+16i+8 (row g+8).
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
}

// The page's scores s (KScores) into the warp's softmax state and its V product.
template <int D>
__device__ __forceinline__ void SoftmaxAndV(WarpState<D>& st, float (&s)[4][4],
                                            const VRegs<D>& r) {
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

template <int D, bool Overlap>
__global__ void __launch_bounds__(kThreads, 3)
    Int2HistoryKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas,
                      Workspace ws, bool quick_start, bool early) {
  const int h = blockIdx.y, b = blockIdx.z;
  // The staging area: INT2 pages in flight, or one BF16 window page.
  constexpr int kStagingBytes = kWarps * kStages * kStageBytes<D> > kBf16StageBytes<D>
                                    ? kWarps * kStages * kStageBytes<D>
                                    : kBf16StageBytes<D>;
  __shared__ alignas(128) uint8_t s_stage[kStagingBytes];
  if (static_cast<int>(blockIdx.x) < window_ctas) {  // a sink or recent page of the same launch
    Bf16WindowSlot<D>(p, ws, blockIdx.x, h, b, s_stage);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const KvGeometry& geo = p.geometry;
  const int G = p.num_q_heads / geo.num_kv_heads;
  const PagedSegmentView& seg = p.segments[kHistorySegment];
  const int npages = seg.num_pages(b);
  const int begin = split * pages_per_split;
  const int end = min(npages, begin + pages_per_split);

  __shared__ uint64_t s_bar[kWarps][kStages];
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  __shared__ float s_q[kMaxGroup][D];
  __shared__ float s_sumq[kMaxGroup], s_sumq4[kMaxGroup];
  // After the page loop the staging area holds the warps' outputs.
  float(*s_o)[kMaxGroup][D] = reinterpret_cast<float(*)[kMaxGroup][D]>(s_stage);
  static_assert(kWarps * kMaxGroup * D * 4 <= kStagingBytes, "staging area");

  // Each warp streams pages begin + warp, + 4, ... through kStages shared-memory stages filled by
  // the bulk copy engine, so several pages per warp are in flight while it computes. The first
  // ones are asked for before the queries are read, so the two latencies overlap.
  const int my_pages = begin + warp < end ? (end - (begin + warp) + kWarps - 1) / kWarps : 0;
  uint8_t* stages = s_stage + warp * kStages * kStageBytes<D>;
  uint64_t* bars = s_bar[warp];
  const uint32_t block_bytes = kPageTokens * (D / 4 + 4);
  const int64_t k_offset = BlockOffset(geo, seg.encoding, p.layer, 0, h);
  const int64_t v_offset = BlockOffset(geo, seg.encoding, p.layer, 1, h);
  auto issue = [&](int i) {  // lane 0: page i of this warp into stage i % kStages
    const int64_t slot = seg.indices[seg.indptr[b] + begin + warp + i * kWarps];
    const uint8_t* base = seg.pool + slot * seg.slot_stride;
    uint8_t* dst = stages + (i % kStages) * kStageBytes<D>;
    uint64_t* bar = bars + i % kStages;
    BarrierExpect(bar, 2 * block_bytes);
    BulkCopy(dst, base + k_offset, block_bytes, bar);
    BulkCopy(dst + block_bytes, base + v_offset, block_bytes, bar);
  };
  // quick_start: one page per warp in the launch's first burst of copies (the second is asked
  // for once the queries are in), so first pages land sooner; the queries come in 16-byte loads
  // and their sums from shuffles instead of a loop over shared memory.
  // early (launched before the kernel in front has finished, SplitDecodeVariant::early_launch):
  // every stage is filled while that kernel runs; the queries and the workspace wait for it.
  const bool quick = quick_start && (reinterpret_cast<uintptr_t>(p.q) & 15) == 0;
  const int first_burst = min(my_pages, quick && !early ? 1 : kStages);
  if (lane == 0) {
    for (int i = 0; i < kStages; ++i) BarrierInit(&s_bar[warp][i]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int i = 0; i < first_burst; ++i) issue(i);
  }
  ptx::GridDependencyWait();

  // Queries of this KV head's group, scaled for exp2.
  const float qscale = p.sm_scale * kLog2e;
  float sumq[2], sumq4[2];
  if (quick) {
    constexpr int kLanesPerHead = D / 8;  // each lane takes 8 channels of one head
    const int n = threadIdx.x / kLanesPerHead, d0 = threadIdx.x % kLanesPerHead * 8;
    float part_q = 0.0f, part_q4 = 0.0f;
    if (n < kMaxGroup) {
      float v[8] = {};
      if (n < G) {
        const uint4 raw = *reinterpret_cast<const uint4*>(
            p.q + (int64_t{b} * p.num_q_heads + h * G + n) * D + d0);
        const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[2 * j] = __uint_as_float(w[j] << 16) * qscale;
          v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u) * qscale;
        }
      }
      *reinterpret_cast<float4*>(&s_q[n][d0]) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(&s_q[n][d0 + 4]) = make_float4(v[4], v[5], v[6], v[7]);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        part_q += v[j];
        part_q4 += __half2float(__float2half_rn(v[j] * PairWeightInv(KPairOf(d0 + j))));
      }
    }
#pragma unroll
    for (int x = 1; x < kLanesPerHead; x <<= 1) {
      part_q += __shfl_xor_sync(0xffffffffu, part_q, x);
      part_q4 += __shfl_xor_sync(0xffffffffu, part_q4, x);
    }
    if (n < kMaxGroup && threadIdx.x % kLanesPerHead == 0) {
      s_sumq[n] = part_q;
      s_sumq4[n] = part_q4;
    }
    __syncthreads();
    if (lane == 0 && first_burst == 1 && 1 < my_pages) issue(1);
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      sumq[col] = s_sumq[2 * t + col];
      sumq4[col] = s_sumq4[2 * t + col];
    }
  }
  for (int i = threadIdx.x; !quick && i < kMaxGroup * D; i += kThreads) {
    const int n = i / D, d = i % D;
    float v = 0.0f;
    if (n < G) {
      const uint16_t bits = p.q[(int64_t{b} * p.num_q_heads + h * G + n) * D + d];
      v = __bfloat162float(__ushort_as_bfloat16(bits)) * qscale;
    }
    s_q[n][d] = v;
  }
  if (!quick) __syncthreads();
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
  if (!quick) {
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
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      sumq[col] = __shfl_sync(0xffffffffu, part_q, 4 * (2 * t + col));
      sumq4[col] = __shfl_sync(0xffffffffu, part_q4, 4 * (2 * t + col));
    }
  }

  WarpState<D> st;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    st.m[col] = -INFINITY;
    st.l[col] = st.sp[col] = st.spo[col] = 0.0f;
  }
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) st.o[mb][0] = st.o[mb][1] = st.o[mb][2] = st.o[mb][3] = 0.0f;

  // Page i from its stage into registers; the stage then takes page i + kStages.
  auto load = [&](PageRegs<D>& r, int i) {
    BarrierWait(bars + i % kStages, (i / kStages) & 1);
    LoadPage(r, stages + (i % kStages) * kStageBytes<D>, lane);
    __syncwarp();
    if (lane == 0 && i + kStages < my_pages) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads before its writes
      issue(i + kStages);
    }
  };
  if constexpr (Overlap) {
    // The scores of page i + 1 are computed before page i's softmax and V product, so the two
    // pages' independent tensor-core chains interleave (a warp's page is otherwise one long
    // dependent chain, and 3 warps per scheduler do not hide it).
    if (my_pages > 0) {
      VRegs<D> cur;
      float s[4][4];
      {
        PageRegs<D> first;
        load(first, 0);
        KScores(s, first, bq, sumq, sumq4);
        cur = first;
      }
      for (int i = 0; i < my_pages; ++i) {
        PageRegs<D> next;
        float s_next[4][4];
        const bool more = i + 1 < my_pages;
        if (more) {
          load(next, i + 1);
          KScores(s_next, next, bq, sumq, sumq4);
        }
        SoftmaxAndV(st, s, cur);
        if (more) {
          cur = next;  // its V half
#pragma unroll
          for (int t4 = 0; t4 < 4; ++t4) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[t4][e] = s_next[t4][e];
          }
        }
      }
    }
  } else {
    for (int i = 0; i < my_pages; ++i) {
      PageRegs<D> cur;
      load(cur, i);
      float s[4][4];
      KScores(s, cur, bq, sumq, sumq4);
      SoftmaxAndV(st, s, cur);
    }
  }
  ptx::LaunchDependents();  // the merge may launch (it waits for this kernel's end)
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
  CombineWarps<D>(s_o, s_m, s_l, G, PartialRow(ws, b, geo.num_kv_heads, h, ws.window + split),
                  ws);
}

// History in codec fragment blocks (split_decode_fragment.cuh): the INT2 kernel's page stream,
// each warp's pages through kFragmentStages bulk-copy stages, decoded in registers. The first
// window_ctas CTAs take the window pages.
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    FragmentHistoryKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas,
                          Workspace ws) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  if (static_cast<int>(blockIdx.x) < window_ctas) {
    Bf16WindowSlot<D>(p, ws, blockIdx.x, h, b, smem);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const KvGeometry& geo = p.geometry;
  const int G = p.num_q_heads / geo.num_kv_heads;
  const PagedSegmentView& seg = p.segments[kHistorySegment];
  const int npages = seg.num_pages(b);
  const int begin = split * pages_per_split;
  const int end = min(npages, begin + pages_per_split);

  __shared__ uint64_t s_bar[kWarps][kFragmentStages];
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  __shared__ float s_q[kMaxGroup][D];
  __shared__ uint32_t s_desc[2][D / 16];
  // After the page loop the stages hold the warps' outputs.
  float(*s_o)[kMaxGroup][D] = reinterpret_cast<float(*)[kMaxGroup][D]>(smem);

  const int my_pages = begin + warp < end ? (end - (begin + warp) + kWarps - 1) / kWarps : 0;
  uint8_t* stages = smem + warp * kFragmentStages * kFragmentStageBytes<D>;
  uint64_t* bars = s_bar[warp];
  const CodecSideLayout& ks = p.codec.side[0];
  const CodecSideLayout& vs = p.codec.side[1];
  const int64_t k_offset = ks.block0 + int64_t{h} * ks.block_bytes;
  const int64_t v_offset = vs.block0 + int64_t{h} * vs.block_bytes;
  auto issue = [&](int i) {  // lane 0: page i of this warp into stage i % kFragmentStages
    const int64_t slot = seg.indices[seg.indptr[b] + begin + warp + i * kWarps];
    const uint8_t* base = seg.pool + slot * seg.slot_stride;
    uint8_t* dst = stages + (i % kFragmentStages) * kFragmentStageBytes<D>;
    uint64_t* bar = bars + i % kFragmentStages;
    BarrierExpect(bar, ks.block_bytes + vs.block_bytes);
    BulkCopy(dst, base + k_offset, ks.block_bytes, bar);
    BulkCopy(dst + kFragmentSideBytes<D>, base + v_offset, vs.block_bytes, bar);
  };
  if (lane == 0) {
    for (int i = 0; i < kFragmentStages; ++i) BarrierInit(&s_bar[warp][i]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int i = 0; i < min(my_pages, kFragmentStages); ++i) issue(i);
  }
  if (threadIdx.x < 2) {  // each side's steps: offset in the block, bits, region
    const CodecSideLayout& s = p.codec.side[threadIdx.x];
    int step = 0;
    uint32_t offset = 0;
    for (int k = 0; k < s.num_regions; ++k) {
      for (int j = 0; j < s.channels[k] / kFragmentStep; ++j, ++step) {
        s_desc[threadIdx.x][step] = offset | uint32_t{s.bits[k]} << 16 | uint32_t(k) << 20;
        offset += 128u * s.bits[k];
      }
    }
  }
  ptx::GridDependencyWait();
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
  // B fragments of Q·Δ/2: (dims 16s+2t, +1 | 16s+2t+8, +9 ; head g).
  uint32_t bq[D / 16][2];
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {
    const int bits = StepBits(s_desc[0][step]);
    const float c = bits > 0 ? 0.5f * FragmentLevelStep(bits) : 0.0f;
    const int d0 = 16 * step + 2 * t, d1 = d0 + 8;
    bq[step][0] = PackHalf2(s_q[g][d0] * c, s_q[g][d0 + 1] * c);
    bq[step][1] = PackHalf2(s_q[g][d1] * c, s_q[g][d1 + 1] * c);
  }
  FragmentWarpState<D> st;
#pragma unroll
  for (int col = 0; col < 2; ++col) st.m[col] = -INFINITY, st.l[col] = 0.0f;
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) st.o[mb][0] = st.o[mb][1] = st.o[mb][2] = st.o[mb][3] = 0.0f;
  for (int i = 0; i < my_pages; ++i) {
    BarrierWait(bars + i % kFragmentStages, (i / kFragmentStages) & 1);
    FragmentPage<D>(st, stages + (i % kFragmentStages) * kFragmentStageBytes<D>, p, s_desc, bq,
                    lane);
    __syncwarp();
    if (lane == 0 && i + kFragmentStages < my_pages) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads before its writes
      issue(i + kFragmentStages);
    }
  }
  ptx::LaunchDependents();  // the merge may launch (it waits for this kernel's end)
#pragma unroll
  for (int col = 0; col < 2; ++col) {
#pragma unroll
    for (int x = 4; x <= 16; x <<= 1) st.l[col] += __shfl_xor_sync(0xffffffffu, st.l[col], x);
  }
  __syncthreads();  // every warp is done with the stages
  // This warp's unnormalised output per (head, dim): the value tile's Δ/2.
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) {
    const int bits = StepBits(s_desc[1][mb]);
    const float c = bits > 0 ? 0.5f * FragmentLevelStep(bits) : 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = e & 1, row_half = e >> 1;
      s_o[warp][2 * t + col][16 * mb + g + 8 * row_half] = st.o[mb][e] * c;
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
  CombineWarps<D>(s_o, s_m, s_l, G, PartialRow(ws, b, geo.num_kv_heads, h, ws.window + split),
                  ws);
}

// History in BF16 (the BF16 cache format, all of whose pages are BF16) on bf16 tensor cores: a
// range of pages per CTA as for INT2, kBf16Stages pages in flight (split_decode_bf16.cuh). The
// first window_ctas CTAs of the launch take the window pages.
template <int D>
constexpr int kBf16HistorySmemBytes = kBf16Stages * kBf16StageBytes<D>;

template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    Bf16HistoryMmaKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas,
                         Workspace ws) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  if (static_cast<int>(blockIdx.x) < window_ctas) {
    Bf16WindowSlot<D>(p, ws, blockIdx.x, h, b, smem);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int begin = split * pages_per_split;
  Bf16PageRange<D, kBf16Stages>(p, p.segments[kHistorySegment], b, h, begin,
                                begin + pages_per_split, smem,
                                PartialRow(ws, b, p.geometry.num_kv_heads, h, ws.window + split),
                                ws);
}

// History in a codec (the codec cache format), decoded to fp16 rows page by page
// (split_decode_codec.cuh); the first window_ctas CTAs take the window pages.
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    CodecHistoryKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas,
                       Workspace ws, bool page_tables) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int h = blockIdx.y, b = blockIdx.z;
  if (static_cast<int>(blockIdx.x) < window_ctas) {
    Bf16WindowSlot<D>(p, ws, blockIdx.x, h, b, smem);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int begin = split * pages_per_split;
  CodecPageRange<D>(p, p.segments[kHistorySegment], b, h, begin, begin + pages_per_split, smem,
                    PartialRow(ws, b, p.geometry.num_kv_heads, h, ws.window + split), ws,
                    page_tables);
}

// The window pages as a launch of their own, on tensor cores (fuse_window off).
template <int D>
__global__ void __launch_bounds__(kThreads) Bf16WindowKernel(SplitDecodeCudaParams p, Workspace ws) {
  __shared__ alignas(128) uint8_t s_stage[kBf16StageBytes<D>];
  Bf16WindowSlot<D>(p, ws, blockIdx.x, blockIdx.y, blockIdx.z, s_stage);
}

// The merge of one query head's partials, spread over the CTA: the weights exp(lse - max) of
// every slot first (shared memory, dynamic: one float per slot), then each thread sums four
// channels over a share of the slots, loads of several slots in flight at once.
template <int D>
__global__ void __launch_bounds__(kThreads) MergeParallelKernel(SplitDecodeCudaParams p,
                                                                Workspace ws) {
  extern __shared__ float s_w[];  // [ws.slots]
  constexpr int kLanesPerRow = D / 4, kGroups = kThreads / kLanesPerRow;
  __shared__ float s_red[kWarps];
  __shared__ float4 s_acc[kGroups][kLanesPerRow];
  ptx::GridDependencyWait();  // the partials (a no-op unless launched early)
  ptx::LaunchDependents();    // the row scatter after it (launched early) may launch
  const int b = blockIdx.x / p.num_q_heads, hq = blockIdx.x % p.num_q_heads;
  const int G = p.num_q_heads / p.geometry.num_kv_heads;
  const int h = hq / G, n = hq % G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = PartialRow(ws, b, p.geometry.num_kv_heads, h, 0) + n;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < ws.slots; s += kThreads) {
    const float lse = ws.part_lse[row0 + int64_t{s} * kMaxGroup];
    s_w[s] = lse;
    mx = fmaxf(mx, lse);
  }
  for (int x = 16; x > 0; x >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
  if (lane == 0) s_red[warp] = mx;
  __syncthreads();
  float M = s_red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) M = fmaxf(M, s_red[w]);
  float sum = 0.0f;
  for (int s = threadIdx.x; s < ws.slots; s += kThreads) {
    const float w = M == -INFINITY || s_w[s] == -INFINITY ? 0.0f : __expf(s_w[s] - M);
    s_w[s] = w;
    sum += w;
  }
  for (int x = 16; x > 0; x >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, x);
  __syncthreads();  // everyone has read s_red's maxima
  if (lane == 0) s_red[warp] = sum;
  __syncthreads();
  float L = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) L += s_red[w];
  const int c4 = threadIdx.x % kLanesPerRow, group = threadIdx.x / kLanesPerRow;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int s = group; s < ws.slots; s += kGroups) {
    const float w = s_w[s];
    if (w == 0.0f) continue;
    const float4 v = *reinterpret_cast<const float4*>(
        ws.part_o + (row0 + int64_t{s} * kMaxGroup) * D + 4 * c4);
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  }
  s_acc[group][c4] = acc;
  __syncthreads();
  if (threadIdx.x < D) {
    const int d = threadIdx.x;
    float O = 0.0f;
#pragma unroll
    for (int gr = 0; gr < kGroups; ++gr) {
      const float4 a = s_acc[gr][d / 4];
      O += d % 4 == 0 ? a.x : d % 4 == 1 ? a.y : d % 4 == 2 ? a.z : a.w;
    }
    StoreOutput(p, b, hq, d, L > 0.0f ? O / L : 0.0f);
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

namespace {

// The BF16 and codec history kernels want more than the default 48 KB of dynamic shared memory;
// set once
// per device (a function attribute, not a stream operation, but done before any capture by
// SplitDecodeCtasPerSm, which callers run while planning).
cudaError_t AllowBf16HistorySmem() {
  static std::atomic<uint64_t> done{0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) {
    return cudaErrorInvalidDevice;
  }
  if (done.load(std::memory_order_acquire) & (uint64_t{1} << device)) return cudaSuccess;
  cudaError_t e = cudaFuncSetAttribute(Bf16HistoryMmaKernel<64>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       kBf16HistorySmemBytes<64>);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(Bf16HistoryMmaKernel<128>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kBf16HistorySmemBytes<128>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(CodecHistoryKernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kCodecHistorySmemBytes<64>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(CodecHistoryKernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kCodecHistorySmemBytes<128>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(FragmentHistoryKernel<64>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kFragmentSmemBytes<64>);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(FragmentHistoryKernel<128>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, kFragmentSmemBytes<128>);
  }
  if (e == cudaSuccess) done.fetch_or(uint64_t{1} << device, std::memory_order_release);
  return e;
}

template <typename Kernel>
int Occupancy(Kernel kernel, int dynamic_smem) {
  int blocks = 0;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, dynamic_smem) ==
                     cudaSuccess &&
                 blocks > 0
             ? blocks
             : 1;
}

// Window pages run as CTAs of the history launch when the variant allows it and they are few
// (at most a quarter of a wave): then they fill places the history leaves, where a launch of
// their own would cost a kernel boundary. Many of them would instead push the history into
// more waves, or into fewer ranges (measured: batch 8 and 32 are faster apart).
bool WindowCtas(const SplitDecodeVariant& v, int64_t window_ctas, int64_t capacity) {
  return v.fuse_window && v.bf16_tensor_cores && 4 * window_ctas <= capacity;
}

}  // namespace

int SplitDecodeCtasPerSm(int head_dim, PageEncoding history, const SplitDecodeVariant& variant) {
  const bool d64 = head_dim == 64;
  if (history == PageEncoding::kCodecFragment) {
    if (AllowBf16HistorySmem() != cudaSuccess) return 1;
    return d64 ? Occupancy(FragmentHistoryKernel<64>, kFragmentSmemBytes<64>)
               : Occupancy(FragmentHistoryKernel<128>, kFragmentSmemBytes<128>);
  }
  if (history == PageEncoding::kCodec) {
    if (AllowBf16HistorySmem() != cudaSuccess) return 1;
    return d64 ? Occupancy(CodecHistoryKernel<64>, kCodecHistorySmemBytes<64>)
               : Occupancy(CodecHistoryKernel<128>, kCodecHistorySmemBytes<128>);
  }
  if (history != PageEncoding::kBf16) {
    if (variant.int2_overlap_pages) {
      return d64 ? Occupancy(Int2HistoryKernel<64, true>, 0)
                 : Occupancy(Int2HistoryKernel<128, true>, 0);
    }
    return d64 ? Occupancy(Int2HistoryKernel<64, false>, 0)
               : Occupancy(Int2HistoryKernel<128, false>, 0);
  }
  if (!variant.bf16_tensor_cores) {
    return d64 ? Occupancy(Bf16HistoryKernel<64>, 0) : Occupancy(Bf16HistoryKernel<128>, 0);
  }
  if (AllowBf16HistorySmem() != cudaSuccess) return 1;
  return d64 ? Occupancy(Bf16HistoryMmaKernel<64>, kBf16HistorySmemBytes<64>)
             : Occupancy(Bf16HistoryMmaKernel<128>, kBf16HistorySmemBytes<128>);
}

SplitDecodePlan PlanSplitDecode(int batch, int num_kv_heads, int head_dim, int max_history_pages,
                                int max_window_pages, int num_sms, int ctas_per_sm,
                                PageEncoding history, const SplitDecodeVariant& variant) {
  SplitDecodePlan plan;
  plan.variant = variant;
  plan.window_pages = std::max(1, max_window_pages);
  const int64_t units = std::max(1, batch * num_kv_heads);
  const int64_t capacity = int64_t{std::max(1, num_sms)} * std::max(1, ctas_per_sm);
  const int pages = std::max(1, max_history_pages);
  // Window pages that run as CTAs of the history launch take places in its waves.
  const int window_ctas = WindowCtas(variant, units * plan.window_pages, capacity)
                              ? plan.window_pages
                              : 0;
  plan.fused_window = window_ctas > 0;
  // Time ~ waves x (pages per CTA + a setup cost of about two pages): choose the split count
  // that minimises it, so the last wave is not a sliver of a few CTAs. A BF16 history streams
  // faster in ranges of at most 64 pages (measured: one wave of ranges of 500 pages at batch 8
  // ran 10 % slower than seven waves of 73), so longer ranges are not considered for it.
  const int max_pps = history == PageEncoding::kBf16 && variant.bf16_tensor_cores &&
                              variant.bf16_max_pages_per_split > 0
                          ? variant.bf16_max_pages_per_split
                          : pages;
  const int max_splits = std::min(pages, 512);
  const int min_splits = std::min(max_splits, (pages + max_pps - 1) / max_pps);
  double best = 1e300;
  for (int splits = min_splits; splits <= max_splits; ++splits) {
    const int pps = (pages + splits - 1) / splits;
    const int used = (pages + pps - 1) / pps;  // ranges that hold a page: <= splits
    const int64_t ctas = units * (used + window_ctas);
    const int64_t waves = (ctas + capacity - 1) / capacity;
    const double cost = static_cast<double>(waves) * (static_cast<double>(pps) / kWarps + 2.0);
    if (cost < best - 1e-9) best = cost, plan.splits = used, plan.pages_per_split = pps;
  }
  const int64_t rows = units * (plan.window_pages + plan.splits) * kMaxGroup;
  plan.workspace_bytes = rows * head_dim * 4 + rows * 4;
  return plan;
}

bool SplitDecodeTakesCodec(const CodecLayerLayout& layout, int head_dim) {
  return (head_dim == 64 || head_dim == 128) &&
         codec::GpuLayoutOk(layout, head_dim,
                            head_dim == 64 ? kCodecSideBytes<64> : kCodecSideBytes<128>,
                            kCodecTablePairs);
}

bool SplitDecodeTakesCodecFragment(const CodecLayerLayout& layout, int head_dim) {
  if ((head_dim != 64 && head_dim != 128) ||
      !codec::GpuLayoutOk(layout, head_dim,
                          head_dim == 64 ? kFragmentSideBytes<64> : kFragmentSideBytes<128>)) {
    return false;
  }
  // And a fragment block's own shape: whole steps, the codes right up to the row scales.
  for (const CodecSideLayout& s : layout.side) {
    int code_bytes = 0;
    for (int k = 0; k < s.num_regions; ++k) {
      if (s.channels[k] % kFragmentStep != 0) return false;
      code_bytes += 128 * s.bits[k] * (s.channels[k] / kFragmentStep);
    }
    if (s.row_scales != code_bytes || s.ratios != s.row_scales + kPageTokens ||
        s.ratios + s.num_regions > s.block_bytes) {
      return false;
    }
  }
  return true;
}

cudaError_t LaunchSplitDecode(const SplitDecodeCudaParams& p, const SplitDecodePlan& plan,
                              void* workspace, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  const SplitDecodeVariant& v = plan.variant;
  const PageEncoding history = p.segments[kHistorySegment].encoding;
  const bool bf16_history = history == PageEncoding::kBf16;
  const bool codec_history = history == PageEncoding::kCodec;
  const bool fragment_history = history == PageEncoding::kCodecFragment;
  if (g.num_kv_heads <= 0 || p.num_q_heads % g.num_kv_heads != 0 ||
      p.num_q_heads / g.num_kv_heads > kMaxGroup || g.page_tokens != kPageTokens ||
      (history == PageEncoding::kInt2Uniform && g.group_size != g.head_dim) ||
      (codec_history && (!v.bf16_tensor_cores || !SplitDecodeTakesCodec(p.codec, g.head_dim))) ||
      (fragment_history && !SplitDecodeTakesCodecFragment(p.codec, g.head_dim)) ||
      (!bf16_history && !codec_history && !fragment_history &&
       history != PageEncoding::kInt2Uniform) ||
      p.segments[0].encoding != PageEncoding::kBf16 ||
      p.segments[2].encoding != PageEncoding::kBf16) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  if (((bf16_history || codec_history) && v.bf16_tensor_cores) || fragment_history) {
    if (const cudaError_t e = AllowBf16HistorySmem(); e != cudaSuccess) return e;
  }
  Workspace ws;
  ws.window = plan.window_pages;
  ws.slots = plan.window_pages + plan.splits;
  ws.head_weights = v.combine_head_weights;
  const int64_t rows = int64_t{p.batch} * g.num_kv_heads * ws.slots * kMaxGroup;
  ws.part_o = static_cast<float*>(workspace);
  ws.part_lse = ws.part_o + rows * g.head_dim;
  const int window_ctas = plan.fused_window ? plan.window_pages : 0;
  const dim3 history_grid(window_ctas + plan.splits, g.num_kv_heads, p.batch);
  const dim3 window_grid(plan.window_pages, g.num_kv_heads, p.batch);
  const bool early = v.early_launch;
  const int pps = plan.pages_per_split;
  const unsigned merge_ctas = static_cast<unsigned>(p.batch * p.num_q_heads);
  return KV_DISPATCH_HEAD_DIM(g.head_dim, D, {
    cudaError_t e = cudaSuccess;
    if (fragment_history) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), kFragmentSmemBytes<D>, stream,
                       FragmentHistoryKernel<D>, p, pps, window_ctas, ws);
    } else if (codec_history) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), kCodecHistorySmemBytes<D>, stream,
                       CodecHistoryKernel<D>, p, pps, window_ctas, ws, v.codec_page_tables);
    } else if (bf16_history && v.bf16_tensor_cores) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), kBf16HistorySmemBytes<D>, stream,
                       Bf16HistoryMmaKernel<D>, p, pps, window_ctas, ws);
    } else if (bf16_history) {
      Bf16HistoryKernel<D><<<dim3(plan.splits, g.num_kv_heads, p.batch), kThreads, 0, stream>>>(
          p, pps, ws);
    } else if (v.int2_overlap_pages) {
      e = LaunchKernel(early, history_grid, dim3(kThreads), 0, stream, Int2HistoryKernel<D, true>,
                       p, pps, window_ctas, ws, v.int2_quick_start, early);
    } else {
      e = LaunchKernel(early, history_grid, dim3(kThreads), 0, stream,
                       Int2HistoryKernel<D, false>, p, pps, window_ctas, ws, v.int2_quick_start,
                       early);
    }
    if (e != cudaSuccess) return e;
    if (window_ctas == 0) {
      if (v.bf16_tensor_cores) {
        Bf16WindowKernel<D><<<window_grid, kThreads, 0, stream>>>(p, ws);
      } else {
        Bf16PageKernel<D><<<window_grid, kThreads, 0, stream>>>(p, ws);
      }
    }
    if (v.parallel_merge) {
      e = LaunchKernel(early, dim3(merge_ctas), dim3(kThreads), ws.slots * sizeof(float), stream,
                       MergeParallelKernel<D>, p, ws);
    } else {
      e = LaunchKernel(early, dim3(merge_ctas), dim3(D), 0, stream, MergeKernel<D>, p, ws);
    }
    return e != cudaSuccess ? e : cudaGetLastError();
  });
}

cudaError_t FillRandomInt2Pages(uint8_t* pool, int64_t slot_stride, int num_pages,
                                const KvGeometry& geometry, uint32_t seed, cudaStream_t stream) {
  if (num_pages <= 0) return cudaSuccess;
  FillKernel<<<1024, 256, 0, stream>>>(pool, slot_stride, num_pages, geometry, seed);
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels
