#pragma once

// Split decode over a history of codec fragment blocks (PageEncoding::kCodecFragment;
// kernels/codec_fragment.h): the INT2 history kernel's shape (one CTA of 4 warps per page range,
// each warp streaming whole pages through bulk copies, both products on mma.m16n8k16 with fp16
// inputs and fp32 accumulators, transposed so the query heads fill the n = 8 side), with the
// codes decoded in registers. A part of a step holds, per lane, `width` words whose group j
// shifted right gives a fragment register's two pairs of codes; each pair becomes an exact fp16x2
// of 2·(code − mid) (the second pair times 2^width) with one logic op and one subtraction:
//   (x & (mask << (sh + 1))) | 0x6400 = 1024 + 2^(sh+1)·field,   minus (1024 + c)
// where sh is the part's place in the code (0, or 2 for a 3-bit code's high bit) and the c of
// a code's parts add up to 2^bits − 1. The other operand carries every scale but the token's:
//   K: Sᵀ = K·Qᵀ with B = q · Δ_b/2 · ρ_k (· 2^-width for the second pair), the token's row
//      scale s_t then multiplies its score row (fp32);
//   V: Oᵀ = Vᵀ·(P·s_v)ᵀ with B = p·s_t · ρ_k (· 2^-width), and Δ_b/2 multiplies each output
//      channel once at the end.
// The page ratios ρ_k and row scales s_t are LogScaleValue's of the stored codes, read from a
// 256-entry table in shared memory that each CTA fills once.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/codec_fragment.h"
#include "kernels/cuda/codec_block.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_bf16.cuh"
#include "kernels/cuda/split_decode_common.cuh"

namespace kvstrata::kernels::split {

constexpr int kFragmentStages = 2;  // pages in flight per warp
constexpr int kFragmentStep = 16;   // channels per step

// One side's block at most: 4-bit codes, the row scales and at most kMaxCodecRegions ratios.
template <int D>
constexpr int kFragmentSideBytes = kPageTokens * D / 2 + kPageTokens + kMaxCodecRegions;
static_assert(kFragmentSideBytes<64> % 16 == 0 && kFragmentSideBytes<128> % 16 == 0, "aligned");
template <int D>
constexpr int kFragmentStageBytes = 2 * kFragmentSideBytes<D>;  // K block, then V block
template <int D>
constexpr int kFragmentSmemBytes =
    kWarps * kFragmentStages * kFragmentStageBytes<D> > kBf16StageBytes<D>
        ? kWarps * kFragmentStages * kFragmentStageBytes<D>
        : kBf16StageBytes<D>;
static_assert(kWarps * kMaxGroup * 128 * 4 <= kFragmentSmemBytes<128>, "warp outputs fit");
static_assert(kFragmentSmemBytes<64> >= 2 * kBf16StageBytes<64> &&
                  kFragmentSmemBytes<128> >= 2 * kBf16StageBytes<128>,
              "a window CTA stages two BF16 pages");

// The uniform levels' steps Δ_b (kCodecFragmentLevelStep), bits 1..4.
__device__ __forceinline__ float FragmentLevelStep(int bits) {
  constexpr float s1 = kCodecFragmentLevelStep[1], s2 = kCodecFragmentLevelStep[2];
  constexpr float s3 = kCodecFragmentLevelStep[3], s4 = kCodecFragmentLevelStep[4];
  return bits == 1 ? s1 : bits == 2 ? s2 : bits == 3 ? s3 : s4;
}

// LogScaleValue of a stored code: 2^((code − 160) / 8), 0 for code 0 (what the CTA's table holds).
__device__ __forceinline__ float FragmentScale(uint32_t code) {
  return code == 0 ? 0.0f : ptx::Exp2(static_cast<float>(code) * 0.125f - 20.0f);
}

__device__ __forceinline__ uint32_t FragmentLop3(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));  // (a & b) | c
  return d;
}

__device__ __forceinline__ uint32_t HSub2(uint32_t a, uint32_t b) {
  const __half2 r = __hsub2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t HMul2(uint32_t a, uint32_t b) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t Half2Of(float x) { return ptx::PackHalf2(x, x); }

// A step's description, per side, in shared memory: its first part's byte offset in the block,
// its bits (0: a dropped region) and its region.
__device__ __forceinline__ uint32_t StepOffset(uint32_t desc) { return desc & 0xffffu; }
__device__ __forceinline__ int StepBits(uint32_t desc) { return (desc >> 16) & 7; }
__device__ __forceinline__ int StepRegion(uint32_t desc) { return desc >> 20; }

// The 8 fragment registers' worth of pairs of one part of a step: group r's two pairs, each an
// exact fp16x2 of 2^(sh+1)·field − c (the second pair times 2^W).
template <int W, int SH>
__device__ __forceinline__ void DecodePart(const uint8_t* part, int lane, uint32_t (&first)[8],
                                           uint32_t (&second)[8]) {
  uint32_t w[4];
  codec::LoadFragmentLane<W>(part, lane, w);
  constexpr int kPerWord = 8 / W;
  constexpr uint32_t kLow = ((1u << W) - 1) * 0x00010001u;
  constexpr int L = SH + 1;  // where a group's first field goes: weight 2^L
  constexpr uint32_t c = W == 4 ? 15 : W == 2 ? 3 : SH == 0 ? 1 : 4;
  constexpr uint32_t kSubFirst = (0x6400u + c) * 0x00010001u;
  constexpr uint32_t kSubSecond = (0x6400u + (c << W)) * 0x00010001u;
#pragma unroll
  for (int m = 0; m < W; ++m) {
#pragma unroll
    for (int j = 0; j < kPerWord; ++j) {
      const int shift = 2 * W * j - L;
      const uint32_t x = shift >= 0 ? w[m] >> shift : w[m] << -shift;
      first[m * kPerWord + j] = HSub2(FragmentLop3(x, kLow << L, 0x64006400u), kSubFirst);
      second[m * kPerWord + j] = HSub2(FragmentLop3(x, kLow << (L + W), 0x64006400u), kSubSecond);
    }
  }
}

// One part of a K step into the four score tiles: B = q·Δ/2 · ρ (the second pair's · 2^-W).
template <int W, int SH>
__device__ __forceinline__ void KPart(float (&s)[4][4], const uint8_t* part, int lane,
                                      const uint32_t (&bq)[2], float rho) {
  uint32_t first[8], second[8];
  DecodePart<W, SH>(part, lane, first, second);
  const uint32_t b0 = HMul2(bq[0], Half2Of(rho));
  const uint32_t b1 = HMul2(bq[1], Half2Of(rho * (1.0f / (1 << W))));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    ptx::MmaF16(s[i], first[2 * i], first[2 * i + 1], second[2 * i], second[2 * i + 1], b0, b1);
  }
}

// One part of a V tile (16 channels) over the page's four k-steps: B = P'·ρ (· 2^-W).
template <int W, int SH>
__device__ __forceinline__ void VPart(float (&o)[4], const uint8_t* part, int lane,
                                      const uint32_t (&pb0)[4], const uint32_t (&pb1)[4],
                                      float rho) {
  uint32_t first[8], second[8];
  DecodePart<W, SH>(part, lane, first, second);
  const uint32_t f0 = Half2Of(rho), f1 = Half2Of(rho * (1.0f / (1 << W)));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    ptx::MmaF16(o, first[2 * i], first[2 * i + 1], second[2 * i], second[2 * i + 1],
                HMul2(pb0[i], f0), HMul2(pb1[i], f1));
  }
}

template <int D>
struct FragmentWarpState {
  float o[D / 16][4];  // Oᵀ accumulators: (dim 16mb+g | +8, heads 2t | 2t+1)
  float m[2], l[2];    // running max (log2 units) and Σp (this thread's rows only)
};

// One page (staged at `st`: K block, then V block kFragmentSideBytes<D> after it) into the
// warp's state. desc: the CTA's step descriptions [K|V][D/16]; bq: Q·Δ/2 fragments.
template <int D>
__device__ __forceinline__ void FragmentPage(FragmentWarpState<D>& st, const uint8_t* stage,
                                             const SplitDecodeCudaParams& p,
                                             const uint32_t (*desc)[D / 16],
                                             const uint32_t (&bq)[D / 16][2], const float* scale,
                                             int lane) {
  const int g = lane >> 2;
  const uint8_t* kb = stage;
  const uint8_t* vb = stage + kFragmentSideBytes<D>;
  const CodecSideLayout& ks = p.codec.side[0];
  const CodecSideLayout& vs = p.codec.side[1];
  // Sᵀ = K·Qᵀ: tile i holds tokens g + 16i (row g) and g + 16i + 8 (row g + 8).
  float s[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {
    const uint32_t d = desc[0][step];
    const int bits = StepBits(d);
    if (bits == 0) continue;
    const float rho = scale[kb[ks.ratios + StepRegion(d)]];
    const uint8_t* base = kb + StepOffset(d);
    switch (bits) {  // warp-uniform
      case 1:
        KPart<1, 0>(s, base, lane, bq[step], rho);
        break;
      case 2:
        KPart<2, 0>(s, base, lane, bq[step], rho);
        break;
      case 3:  // the low two bits, then the high bit (weight 4) 256 bytes on
        KPart<2, 0>(s, base, lane, bq[step], rho);
        KPart<1, 2>(s, base + 256, lane, bq[step], rho);
        break;
      default:
        KPart<4, 0>(s, base, lane, bq[step], rho);
        break;
    }
  }
  // The tokens' row scales (K on the scores, V on the probabilities).
  float sk[8], sv[8];
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    sk[r] = scale[kb[ks.row_scales + g + 8 * r]];
    sv[r] = scale[vb[vs.row_scales + g + 8 * r]];
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] *= sk[2 * i + (e >> 1)];
  }
  // Online softmax per head column, as the INT2 kernel's.
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
    alpha[col] = ptx::Exp2(st.m[col] - m_new);
    st.m[col] = m_new;
  }
  if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      st.l[col] *= alpha[col];
#pragma unroll
      for (int mb = 0; mb < D / 16; ++mb) {
        st.o[mb][col] *= alpha[col];
        st.o[mb][col + 2] *= alpha[col];
      }
    }
  }
  // P·s_v as the B operand (tokens x heads, transposed), for every tile.
  uint32_t pb0[4], pb1[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float pv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = e & 1;
      const float pr = ptx::Exp2(s[i][e] - st.m[col]);
      st.l[col] += pr;
      pv[e] = pr * sv[2 * i + (e >> 1)];
    }
    pb0[i] = ptx::Transpose8x8(ptx::PackHalf2(pv[0], pv[1]));
    pb1[i] = ptx::Transpose8x8(ptx::PackHalf2(pv[2], pv[3]));
  }
  // Oᵀ += Vᵀ·P'ᵀ, one 16-channel tile (one region) at a time.
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) {
    const uint32_t d = desc[1][mb];
    const int bits = StepBits(d);
    if (bits == 0) continue;
    const float rho = scale[vb[vs.ratios + StepRegion(d)]];
    const uint8_t* base = vb + StepOffset(d);
    switch (bits) {
      case 1:
        VPart<1, 0>(st.o[mb], base, lane, pb0, pb1, rho);
        break;
      case 2:
        VPart<2, 0>(st.o[mb], base, lane, pb0, pb1, rho);
        break;
      case 3:
        VPart<2, 0>(st.o[mb], base, lane, pb0, pb1, rho);
        VPart<1, 2>(st.o[mb], base + 256, lane, pb0, pb1, rho);
        break;
      default:
        VPart<4, 0>(st.o[mb], base, lane, pb0, pb1, rho);
        break;
    }
  }
}

}  // namespace kvstrata::kernels::split

// The kernel, in split_decode.cu's unnamed namespace (this header is included there only).
namespace kvstrata::kernels {
namespace {

using namespace split;  // NOLINT: the kernels' shared constants and workspace

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
    Bf16WindowSlot<D, 2>(p, ws, blockIdx.x, h, b, smem);
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
  __shared__ float s_scale[256];  // LogScaleValue of every scale code
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
    ptx::BarrierExpect(bar, ks.block_bytes + vs.block_bytes);
    ptx::BulkCopy(dst, base + k_offset, ks.block_bytes, bar);
    ptx::BulkCopy(dst + kFragmentSideBytes<D>, base + v_offset, vs.block_bytes, bar);
  };
  if (lane == 0) {
    for (int i = 0; i < kFragmentStages; ++i) ptx::BarrierInit(&s_bar[warp][i]);
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
  for (int c = threadIdx.x; c < 256; c += kThreads) s_scale[c] = FragmentScale(c);
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
    bq[step][0] = ptx::PackHalf2(s_q[g][d0] * c, s_q[g][d0 + 1] * c);
    bq[step][1] = ptx::PackHalf2(s_q[g][d1] * c, s_q[g][d1 + 1] * c);
  }
  FragmentWarpState<D> st;
#pragma unroll
  for (int col = 0; col < 2; ++col) st.m[col] = -INFINITY, st.l[col] = 0.0f;
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) st.o[mb][0] = st.o[mb][1] = st.o[mb][2] = st.o[mb][3] = 0.0f;
  for (int i = 0; i < my_pages; ++i) {
    ptx::BarrierWait(bars + i % kFragmentStages, (i / kFragmentStages) & 1);
    FragmentPage<D>(st, stages + (i % kFragmentStages) * kFragmentStageBytes<D>, p, s_desc, bq,
                    s_scale, lane);
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

}  // namespace
}  // namespace kvstrata::kernels
