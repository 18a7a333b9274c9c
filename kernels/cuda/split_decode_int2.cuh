#pragma once

// Split decode over an INT2 history on tensor cores (kernels/cuda/split_decode.cu's file comment
// says how the codes become fp16 operands): the page layout's registers, the scores and the V
// product of one page, and the history kernel itself. Included by split_decode.cu only: its
// kernels live in that file's unnamed namespace, as they did when they were written there.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_bf16.cuh"
#include "kernels/cuda/split_decode_common.cuh"
#include "kernels/int2_key_bytes.h"

namespace kvstrata::kernels {
namespace {

using namespace split;  // NOLINT: the kernels' shared constants and workspace

constexpr int kInt2Stages = 2;  // shared-memory pages in flight per warp (INT2)

// What a warp does with each page it streams (SplitDecodeVariant chooses).
enum class Int2Flow {
  kWholePage,   // the page's scores, softmax and V product, one page after the other
  kOverlap,     // the next page's scores before this page's softmax and V product
  kStreamOnly,  // a bandwidth probe for benchmarks: pages streamed, no math (empty output)
};

// Pair p of a word as fp16x2 subnormals {4^j·code(bits 2p), 4^j·code(bits 16+2p)} · 2^-24: the
// masked bits are the mantissa of a half whose exponent bits are zero (p >= 5 uses w >> 10).
__device__ __forceinline__ uint32_t ExtractPair(uint32_t w, uint32_t w10, int p) {
  return p < 5 ? w & (0x00030003u << (2 * p)) : w10 & (0x00030003u << (2 * (p - 5)));
}

// The codes' unit as fp16 subnormals (ExtractPair), undone on the fp32 side.
constexpr float kCodeUnitInv = 16777216.0f;  // 2^24

// Keys on integer tensor cores (SplitDecodeVariant::int2_int8_keys_min_pages). A mask keeps four
// codes of a word as bytes at once, each byte an 8-bit integer of the product: w & 0x03030303
// the codes at bits 0-1 of each byte, w & 0x0C0C0C0C those at bits 2-3 (4·code), and the same
// masks on w >> 4 the two upper pairs of bits: four masks and a shift for a word's 16 codes,
// where fp16 pairs take eight masks. The bytes of one register are four channels of one token
// (KCodeBit's layout), none of them consecutive; the product does not mind the k order as long
// as Q's fragments follow it (KCodeByteChannel). Q is scaled so that its largest |q| is 127·256,
// divided by 4 where its codes carry the weight 4, and split into 8-bit integers hi·256 + lo:
// two integer products a tile, exact in 32-bit accumulators, joined as hi·256 + lo before one
// conversion to float. Q's error is then about 2^-15 of the group's largest value, where fp16
// rounds each value to 11 bits. (e4m3 operands would take the codes the same way, bytes 0..15
// being n·2^-9, but mma.sync with e4m3 runs as fp16 on sm_90: docs/data/sass-fp8-keys/.)
constexpr uint32_t kByteLowCodes = 0x03030303u, kByteHighCodes = 0x0C0C0C0Cu;

// 1 / 4^j for the weight of pair p: an exact power of two, built from its exponent bits.
__device__ __forceinline__ float PairWeightInv(int p) {
  return __int_as_float((127 - 2 * (p < 5 ? p : p - 5)) << 23);
}

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
constexpr int kInt2StageBytes = 2 * (kPageTokens * (D / 4 + 4));

// Registers from a page staged in shared memory (K block at `st`, V block after it).
template <int D>
__device__ __forceinline__ void LoadPage(PageRegs<D>& r, const uint8_t* st, int lane) {
  const uint8_t* kb = st;
  const uint8_t* vb = st + kInt2StageBytes<D> / 2;
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

// Per-warp online-softmax state over the pages it has seen. Columns 2t, 2t+1 are the heads 2t,
// 2t+1, or with split rows (Int2Queries) heads 2t % 4, 2t % 4 + 1 over this lane's half of the
// tokens.
template <int D>
struct WarpState {
  float o[D / 16][4];  // Oᵀ accumulators: (dim 16mb+g | +8, columns 2t | 2t+1)
  float m[2], l[2];    // running max (log2 units) and Σp (this thread's rows only)
  float spo[2];        // Σ p·offset_v (this thread's rows)

  __device__ __forceinline__ void Clear() {
#pragma unroll
    for (int col = 0; col < 2; ++col) m[col] = -INFINITY, l[col] = spo[col] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < D / 16; ++mb) o[mb][0] = o[mb][1] = o[mb][2] = o[mb][3] = 0.0f;
  }
};

// The row halves of each 16-token tile a lane works on: both, or with split rows one.
template <bool kSplitRows>
constexpr int kTileRows = kSplitRows ? 1 : 2;

// What a warp keeps of its KV head's queries through the page loop. Column n of the mma is
// head n, or with kSplitRows (a group of at most 4 heads) head n % 4: every head twice.
template <int D>
struct Int2Queries {
  uint32_t bq[D / 16][2];  // B fragments of Q' (dims 16s+2t, +1 | 16s+2t+8, +9 ; column g)
  // With int8 keys instead: B fragments of Q as 8-bit integers, [word][mask pair m][b0 | b1]
  // [hi | lo]: the channels of bit pairs 2m and 2m + 1 (KCodeByteChannel), column g.
  uint32_t bk[D / 64][2][2][2];
  float sumq[2];  // Σq of columns 2t and 2t+1
  float kunit;    // what undoes the K codes' unit (and Q's int8 scale): S = scale·kunit·R + ...
};

// The page's scores Sᵀ = K·Qᵀ (log2 units) less `ref`, a reference per head column (the warp's
// running maximum when the page's scores are computed, or 0 before the first page): four
// 16-token tiles; tile i holds tokens g+16i (row g) and g+16i+8 (row g+8). With the reference
// taken off in the same fused multiply-adds that apply the token's scale and offset, the
// softmax needs no subtraction once the running maxima have settled.
//
// kSplitRows (a group of at most 4 heads, each in two of the mma's 8 columns, Int2Queries): lane
// (g, t) keeps only the tile's row g (t < 2) or row g + 8 (t >= 2, `upper`), in s[i][0..1];
// otherwise s[i][2 * half + col] holds row g + 8·half.
//
// kInt8Keys: the codes four at a time on integer tensor cores (KCodeByteChannel).
template <int D, bool kSplitRows, bool kInt8Keys>
__device__ __forceinline__ void KScores(float (&s)[4][4], const PageRegs<D>& r,
                                        const Int2Queries<D>& q, const float (&ref)[2],
                                        bool upper) {
  const float(&sumq)[2] = q.sumq;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
    if constexpr (kInt8Keys) {
      int hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
#pragma unroll
      for (int wi = 0; wi < D / 64; ++wi) {
        const uint32_t w0 = r.k[2 * i][wi], w1 = r.k[2 * i + 1][wi];
        const uint32_t w0s = w0 >> 4, w1s = w1 >> 4;
        const uint32_t a[2][4] = {
            {w0 & kByteLowCodes, w1 & kByteLowCodes, w0 & kByteHighCodes, w1 & kByteHighCodes},
            {w0s & kByteLowCodes, w1s & kByteLowCodes, w0s & kByteHighCodes, w1s & kByteHighCodes}};
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          ptx::MmaS8(hi, a[m][0], a[m][1], a[m][2], a[m][3], q.bk[wi][m][0][0], q.bk[wi][m][1][0]);
          ptx::MmaS8(lo, a[m][0], a[m][1], a[m][2], a[m][3], q.bk[wi][m][0][1], q.bk[wi][m][1][1]);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = static_cast<float>(hi[e] * 256 + lo[e]);
    } else {
#pragma unroll
      for (int step = 0; step < D / 16; ++step) {
        const uint32_t w0 = r.k[2 * i][step / 4], w1 = r.k[2 * i + 1][step / 4];
        const uint32_t w0s = w0 >> 10, w1s = w1 >> 10;
        const int pl = 2 * (step % 4), ph = pl + 1;
        Mma(s[i], ExtractPair(w0, w0s, pl), ExtractPair(w1, w1s, pl), ExtractPair(w0, w0s, ph),
            ExtractPair(w1, w1s, ph), q.bq[step][0], q.bq[step][1]);
      }
    }
    // S = offset·Σq + scale·kunit·R, less the reference (fp32), for the lane's row halves.
#pragma unroll
    for (int half = 0; half < kTileRows<kSplitRows>; ++half) {
      const bool lower_row = kSplitRows ? upper : half == 1;  // row g + 8 of the tile
      const uint32_t kp = lower_row ? r.kp[2 * i + 1] : r.kp[2 * i];
      const float scale = ptx::HalfLo(kp) * q.kunit, offset = ptx::HalfHi(kp);
#pragma unroll
      for (int col = 0; col < 2; ++col) {
        const float x = lower_row ? s[i][2 + col] : s[i][col];
        s[i][2 * half + col] = fmaf(scale, x, fmaf(offset, sumq[col], -ref[col]));
      }
    }
  }
}

// The reference KScores takes off a page's scores: the running maximum, 0 before the first page.
template <int D>
__device__ __forceinline__ void ScoreReference(const WarpState<D>& st, float (&ref)[2]) {
#pragma unroll
  for (int col = 0; col < 2; ++col) ref[col] = st.m[col] == -INFINITY ? 0.0f : st.m[col];
}

// The page's scores s (KScores, less `ref`) into the warp's softmax state and its V product.
// kSplitRows: the lane's one row of each tile (KScores); lanes t and t + 2 hold the same heads'
// states over different tokens, and their sums meet at the end (WriteInt2Partial).
template <int D, bool kSplitRows>
__device__ __forceinline__ void SoftmaxAndV(WarpState<D>& st, float (&s)[4][4],
                                            const float (&ref)[2], const VRegs<D>& r, bool upper) {
  constexpr int kRows = kTileRows<kSplitRows>;
  // Online softmax per head column. Once the running maxima settle, the page's scores were
  // taken off the current maximum and none is above 0: a warp-uniform vote then skips the
  // maxima's reduction across the warp, the rescale and the shift, which would change nothing
  // (alpha exactly 1, the shift exactly 0). Otherwise (the first page, a new maximum, or
  // scores taken off an older maximum) the warp finds the page's maxima and moves to them.
  float mx[2];
  bool above = false;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    float tile[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) tile[i] = kRows == 1 ? s[i][col] : fmaxf(s[i][col], s[i][col + 2]);
    mx[col] = fmaxf(fmaxf(tile[0], tile[1]), fmaxf(tile[2], tile[3]));
    above |= mx[col] > 0.0f || ref[col] != st.m[col];
  }
  if (__any_sync(0xffffffffu, above)) {
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      float m = mx[col];
      if constexpr (kSplitRows) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
      m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
      const float m_new = fmaxf(st.m[col], ref[col] + m);
      const float alpha = ptx::Exp2(st.m[col] - m_new);  // 0 on the first page (m = -inf)
      const float shift = m_new - ref[col];
      st.m[col] = m_new;
      st.l[col] *= alpha;
      st.spo[col] *= alpha;
#pragma unroll
      for (int mb = 0; mb < D / 16; ++mb) {
        st.o[mb][col] *= alpha;
        st.o[mb][col + 2] *= alpha;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int row = 0; row < kRows; ++row) s[i][col + 2 * row] -= shift;
      }
    }
  }
  // P, then P' = P·s_v as the B operand of the second product (tokens x heads, transposed): a
  // token's two head columns are rounded to fp16 together and take its V scale in one fp16x2
  // multiply (the scale is fp16 in the page already). pb0 holds the k-step's tokens 0-7 (rows
  // g), pb1 its tokens 8-15 (rows g + 8). With split rows the lane's one row goes to its own half
  // and zero to the other: column n < 4 then sums head n over tokens 0-7 and column n + 4 the
  // same head over tokens 8-15.
  uint32_t pb0[4], pb1[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t x[2];
#pragma unroll
    for (int half = 0; half < kRows; ++half) {
      const bool lower_row = kSplitRows ? upper : half == 1;
      const uint32_t vp = lower_row ? r.vp[2 * i + 1] : r.vp[2 * i];
      float p[2];
#pragma unroll
      for (int col = 0; col < 2; ++col) {
        p[col] = ptx::Exp2(s[i][2 * half + col]);
        st.l[col] += p[col];
        st.spo[col] += p[col] * ptx::HalfHi(vp);
      }
      x[half] = ptx::MulByLowHalf(ptx::PackHalf2(p[0], p[1]), vp);
    }
    if constexpr (kSplitRows) {
      x[1] = upper ? x[0] : 0u;
      x[0] = upper ? 0u : x[0];
    }
    pb0[i] = ptx::Transpose8x8(x[0]);
    pb1[i] = ptx::Transpose8x8(x[1]);
  }
  // Oᵀ += Vᵀ·P'ᵀ over the page's 64 tokens, one 16-channel tile at a time, straight into the
  // warp's accumulators: the codes carry no bias (ExtractPair), so nothing large builds up
  // there beside the outputs themselves.
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) {
    const int ug = (2 * mb) / 8;
    const int pl = (2 * mb) % 8, ph = pl + 1;
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // k-step i: tokens 16i .. 16i + 15
      const int slot0 = (i * 2 + 0) * (D / 64) + ug, slot1 = (i * 2 + 1) * (D / 64) + ug;
      const uint32_t w0 = Component(r.v[slot0 / 4], slot0 % 4);
      const uint32_t w1 = Component(r.v[slot1 / 4], slot1 % 4);
      const uint32_t w0s = w0 >> 10, w1s = w1 >> 10;
      Mma(st.o[mb], ExtractPair(w0, w0s, pl), ExtractPair(w0, w0s, ph), ExtractPair(w1, w1s, pl),
          ExtractPair(w1, w1s, ph), pb0[i], pb1[i]);
    }
  }
}

// A row of the queries in shared memory: the head's channels and 8 floats of padding, so that the
// eight heads a warp's lanes read at once (one per row group g) fall in different banks.
template <int D>
constexpr int kQRowFloats = D + 8;

// The queries of KV head h's group, scaled for exp2, into s_q, then each warp's fragments and
// sums. quick: 16-byte loads, one lane per 8 channels, and sums from shuffles; `after_load`
// runs once the queries are in shared memory (the kernel asks for more pages there).
// Otherwise one element per thread and a loop over s_q for the sums.
template <int D, bool kSplitRows, bool kInt8Keys, typename AfterLoad>
__device__ __forceinline__ void LoadInt2Queries(const SplitDecodeCudaParams& p, int b, int h, int G,
                                                bool quick, float (&s_q)[kMaxGroup][kQRowFloats<D>],
                                                float (&s_sumq)[kMaxGroup], Int2Queries<D>& q,
                                                AfterLoad after_load) {
  __shared__ float s_qmax[kWarps];  // kInt8Keys, quick: each warp's largest |q|
  const int lane = threadIdx.x % 32, t = lane & 3;
  const int g = kSplitRows ? (lane >> 2) & 3 : lane >> 2;  // the head of column lane >> 2
  const int t2 = kSplitRows ? (2 * t) & 3 : 2 * t;         // the head of column 2t
  const float qscale = p.sm_scale * kLog2e;
  if (quick) {
    constexpr int kLanesPerHead = D / 8;  // each lane takes 8 channels of one head
    const int n = threadIdx.x / kLanesPerHead, d0 = threadIdx.x % kLanesPerHead * 8;
    float part_q = 0.0f, max_q = 0.0f;
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
      for (int j = 0; j < 8; ++j) part_q += v[j], max_q = fmaxf(max_q, fabsf(v[j]));
    }
#pragma unroll
    for (int x = 1; x < kLanesPerHead; x <<= 1) part_q += __shfl_xor_sync(0xffffffffu, part_q, x);
    if (n < kMaxGroup && threadIdx.x % kLanesPerHead == 0) s_sumq[n] = part_q;
    if constexpr (kInt8Keys) {
#pragma unroll
      for (int x = 1; x < 32; x <<= 1) max_q = fmaxf(max_q, __shfl_xor_sync(0xffffffffu, max_q, x));
      if (lane == 0) s_qmax[threadIdx.x / 32] = max_q;
    }
    __syncthreads();
    after_load();
#pragma unroll
    for (int col = 0; col < 2; ++col) q.sumq[col] = s_sumq[t2 + col];
  } else {
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
    after_load();
  }
  if constexpr (kInt8Keys) {
    // The scale: the group's largest |q| to 127·256 (from the warps' maxima as the queries came
    // in; otherwise the lane's channels of head g, then the warp's).
    float mx = 0.0f;
    if (quick) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_qmax[w]);
    } else {
#pragma unroll
      for (int wi = 0; wi < D / 64; ++wi) {
#pragma unroll
        for (int qq = 0; qq < 4; ++qq) {
#pragma unroll
          for (int j = 0; j < 4; ++j) mx = fmaxf(mx, fabsf(s_q[g][KCodeByteChannel(wi, qq, j, t)]));
        }
      }
#pragma unroll
      for (int x = 1; x < 32; x <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
    }
    const float f = mx > 0.0f ? 32512.0f / mx : 1.0f;
    q.kunit = 1.0f / f;
#pragma unroll
    for (int wi = 0; wi < D / 64; ++wi) {
#pragma unroll
      for (int qq = 0; qq < 4; ++qq) {
        uint32_t hi = 0, lo = 0;
        // Bytes 0 and 2 are channels c and c + 1, bytes 1 and 3 c + 32 and c + 33.
        const float2 x02 =
            *reinterpret_cast<const float2*>(&s_q[g][KCodeByteChannel(wi, qq, 0, t)]);
        const float2 x13 =
            *reinterpret_cast<const float2*>(&s_q[g][KCodeByteChannel(wi, qq, 1, t)]);
        const float xs[4] = {x02.x, x13.x, x02.y, x13.y};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float x = xs[j] * f * ((qq & 1) ? 0.25f : 1.0f);
          const int h8 = max(-127, min(127, __float2int_rn(x * (1.0f / 256.0f))));
          const int l8 = max(-128, min(127, __float2int_rn(x - 256.0f * h8)));
          hi |= (static_cast<uint32_t>(h8) & 0xffu) << (8 * j);
          lo |= (static_cast<uint32_t>(l8) & 0xffu) << (8 * j);
        }
        q.bk[wi][qq / 2][qq % 2][0] = hi;
        q.bk[wi][qq / 2][qq % 2][1] = lo;
      }
    }
  } else {
    // Head g's fragments, divided by the pair weights.
    q.kunit = kCodeUnitInv;
#pragma unroll
    for (int step = 0; step < D / 16; ++step) {
      const int d0 = 16 * step + 2 * t, d1 = d0 + 8;
      const float w0 = PairWeightInv(2 * (step % 4)), w1 = PairWeightInv(2 * (step % 4) + 1);
      q.bq[step][0] = ptx::PackHalf2(s_q[g][d0] * w0, s_q[g][d0 + 1] * w0);
      q.bq[step][1] = ptx::PackHalf2(s_q[g][d1] * w1, s_q[g][d1 + 1] * w1);
    }
  }
  // Σq per head: lane (g, t) sums a quarter of head g's channels, the quad reduces, then each
  // lane fetches its two columns' heads.
  if (!quick) {
    float part_q = 0.0f;
#pragma unroll
    for (int d = t * (D / 4); d < (t + 1) * (D / 4); ++d) part_q += s_q[g][d];
    part_q += __shfl_xor_sync(0xffffffffu, part_q, 1);
    part_q += __shfl_xor_sync(0xffffffffu, part_q, 2);
#pragma unroll
    for (int col = 0; col < 2; ++col)
      q.sumq[col] = __shfl_sync(0xffffffffu, part_q, 4 * (t2 + col));
  }
}

// A warp's pages through its softmax state, as kFlow asks. load(r, i) brings page i into
// registers (and hands its stage on); wait(i) and release(i) are its two halves.
template <int D, Int2Flow kFlow, bool kSplitRows, bool kInt8Keys, typename Load, typename Wait,
          typename Release>
__device__ __forceinline__ void RunInt2Pages(WarpState<D>& st, int my_pages,
                                             const Int2Queries<D>& q, Load load, Wait wait,
                                             Release release) {
  const bool upper = (threadIdx.x & 3) >= 2;  // kSplitRows: this lane takes rows g + 8
  if constexpr (kFlow == Int2Flow::kStreamOnly) {
    for (int i = 0; i < my_pages; ++i) {
      wait(i);
      release(i);
    }
  } else if constexpr (kFlow == Int2Flow::kOverlap) {
    // The scores of page i + 1 are computed before page i's softmax and V product, so the two
    // pages' independent tensor-core chains interleave (a warp's page is otherwise one long
    // dependent chain, and 3 warps per scheduler do not hide it).
    if (my_pages > 0) {
      VRegs<D> cur;
      float s[4][4], ref[2];
      {
        PageRegs<D> first;
        load(first, 0);
        ScoreReference(st, ref);
        KScores<D, kSplitRows, kInt8Keys>(s, first, q, ref, upper);
        cur = first;
      }
      for (int i = 0; i < my_pages; ++i) {
        PageRegs<D> next;
        float s_next[4][4], ref_next[2];
        const bool more = i + 1 < my_pages;
        if (more) {
          load(next, i + 1);
          ScoreReference(st, ref_next);  // page i's maxima are not in yet: SoftmaxAndV shifts
          KScores<D, kSplitRows, kInt8Keys>(s_next, next, q, ref_next, upper);
        }
        SoftmaxAndV<D, kSplitRows>(st, s, ref, cur, upper);
        if (more) {
          cur = next;  // its V half
          ref[0] = ref_next[0];
          ref[1] = ref_next[1];
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
      float s[4][4], ref[2];
      ScoreReference(st, ref);
      KScores<D, kSplitRows, kInt8Keys>(s, cur, q, ref, upper);
      SoftmaxAndV<D, kSplitRows>(st, s, ref, cur, upper);
    }
  }
}

// The CTA's partial for its page range: each warp's unnormalised output per (head, dim) (the
// codes' unit and pair weights undone, the offsets added) into s_o, its maxima and sums beside
// it, then the warps combined into the workspace's row. s_o may alias the staging area.
// kSplitRows: lanes t and t + 2 (columns n and n + 4, the same head) add up first; the copy in
// columns 4-7 lands in heads 4-7 of s_o, which CombineWarps does not read (G <= 4).
template <int D, bool kSplitRows>
__device__ __forceinline__ void WriteInt2Partial(WarpState<D>& st, float (*s_o)[kMaxGroup][D],
                                                 float (&s_m)[kWarps][kMaxGroup],
                                                 float (&s_l)[kWarps][kMaxGroup], int G,
                                                 int64_t row, const Workspace& ws) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
  // Row sums over the 8 row groups of the warp (and with kSplitRows the head's two lanes).
#pragma unroll
  for (int col = 0; col < 2; ++col) {
#pragma unroll
    for (int x = kSplitRows ? 2 : 4; x <= 16; x <<= 1) {
      st.l[col] += __shfl_xor_sync(0xffffffffu, st.l[col], x);
      st.spo[col] += __shfl_xor_sync(0xffffffffu, st.spo[col], x);
    }
  }
  if constexpr (kSplitRows) {
#pragma unroll
    for (int mb = 0; mb < D / 16; ++mb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[mb][e] += __shfl_xor_sync(0xffffffffu, st.o[mb][e], 2);
    }
  }
  __syncthreads();  // every warp is done with the staging area
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = e & 1, row_half = e >> 1;
      const int d = 16 * mb + g + 8 * row_half;
      const float winv = PairWeightInv((2 * mb + row_half) % 8) * kCodeUnitInv;
      s_o[warp][2 * t + col][d] = st.o[mb][e] * winv + st.spo[col];
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
  CombineWarps<D>(s_o, s_m, s_l, G, row, ws);
}

// kSplitRows: for groups of at most 4 query heads (the caller checks), each head in two of the
// mma's columns and each lane's softmax work over half of a tile's rows (KScores).
template <int D, Int2Flow kFlow, bool kSplitRows, bool kInt8Keys = false>
__global__ void __launch_bounds__(kThreads, 3)
    Int2HistoryKernel(SplitDecodeCudaParams p, int pages_per_split, int window_ctas, Workspace ws,
                      bool quick_start, bool early, bool slots_ahead, bool dependents_at_start) {
  const int h = blockIdx.y, b = blockIdx.z;
  // The staging area: INT2 pages in flight, or a window CTA's BF16 page (one at a time: two
  // need more shared memory than the INT2 pages, and were slower end to end,
  // docs/benchmarks/attention.md, round 5).
  constexpr int kPagesBytes = kWarps * kInt2Stages * kInt2StageBytes<D>;
  constexpr int kStagingBytes =
      (kPagesBytes > kBf16StageBytes<D>) ? kPagesBytes : kBf16StageBytes<D>;
  __shared__ alignas(128) uint8_t s_stage[kStagingBytes];
  if (static_cast<int>(blockIdx.x) < window_ctas) {  // sink or recent pages of the same launch
    Bf16WindowSlot<D, 1>(p, ws, blockIdx.x, h, b, s_stage);
    return;
  }
  const int split = blockIdx.x - window_ctas;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const KvGeometry& geo = p.geometry;
  const int G = p.num_q_heads / geo.num_kv_heads;
  const PagedSegmentView& seg = p.segments[kHistorySegment];
  const int npages = seg.num_pages(b);
  const int begin = split * pages_per_split;
  const int end = min(npages, begin + pages_per_split);

  __shared__ uint64_t s_bar[kWarps][kInt2Stages];
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  __shared__ alignas(16) float s_q[kMaxGroup][kQRowFloats<D>];
  __shared__ float s_sumq[kMaxGroup];
  // After the page loop the staging area holds the warps' outputs.
  float(*s_o)[kMaxGroup][D] = reinterpret_cast<float(*)[kMaxGroup][D]>(s_stage);
  static_assert(kWarps * kMaxGroup * D * 4 <= kStagingBytes, "staging area");

  // Each warp streams pages begin + warp, + 4, ... through kInt2Stages shared-memory stages filled
  // by the bulk copy engine, so several pages per warp are in flight while it computes. The first
  // ones are asked for before the queries are read, so the two latencies overlap.
  const int my_pages = begin + warp < end ? (end - (begin + warp) + kWarps - 1) / kWarps : 0;
  uint8_t* stages = s_stage + warp * kInt2Stages * kInt2StageBytes<D>;
  uint64_t* bars = s_bar[warp];
  const uint32_t block_bytes = kPageTokens * (D / 4 + 4);
  const int64_t k_offset = BlockOffset(geo, seg.encoding, p.layer, 0, h);
  const int64_t v_offset = BlockOffset(geo, seg.encoding, p.layer, 1, h);
  // slots_ahead: lane 0 reads the slot of the page it will ask for next right after asking for
  // one, so that read's latency passes while a page is computed; otherwise the whole warp waits
  // at each request for two dependent reads (the sequence's page table, then the slot).
  const int32_t* my_slots = seg.indices + seg.indptr[b] + begin + warp;  // page i: [i * kWarps]
  int next_slot = slots_ahead && lane == 0 && my_pages > 0 ? my_slots[0] : 0;
  auto issue = [&](int i) {  // lane 0: page i of this warp into stage i % kInt2Stages
    int64_t slot;
    if (slots_ahead) {  // pages are asked for in order: 0, 1, 2, ...
      slot = next_slot;
      if (i + 1 < my_pages) next_slot = my_slots[(i + 1) * kWarps];
    } else {  // the former kernel: both reads again at each request, not my_slots
      slot = seg.indices[seg.indptr[b] + begin + warp + i * kWarps];
    }
    const uint8_t* base = seg.pool + slot * seg.slot_stride;
    uint8_t* dst = stages + (i % kInt2Stages) * kInt2StageBytes<D>;
    uint64_t* bar = bars + i % kInt2Stages;
    ptx::BarrierExpect(bar, 2 * block_bytes);
    ptx::BulkCopy(dst, base + k_offset, block_bytes, bar);
    ptx::BulkCopy(dst + block_bytes, base + v_offset, block_bytes, bar);
  };
  // quick_start: one page per warp in the launch's first burst of copies (the second is asked
  // for once the queries are in), so first pages land sooner; the queries come in 16-byte loads
  // and their sums from shuffles instead of a loop over shared memory.
  // early (launched before the kernel in front has finished, SplitDecodeVariant::early_launch):
  // every stage is filled while that kernel runs; the queries and the workspace wait for it.
  const bool quick = quick_start && (reinterpret_cast<uintptr_t>(p.q) & 15) == 0;
  const int first_burst = min(my_pages, quick && !early ? 1 : kInt2Stages);
  if (lane == 0) {
    for (int i = 0; i < kInt2Stages; ++i) ptx::BarrierInit(&s_bar[warp][i]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int i = 0; i < first_burst; ++i) issue(i);
  }
  if (dependents_at_start) ptx::LaunchDependents();  // the merge may launch (and wait for us)
  ptx::GridDependencyWait();

  Int2Queries<D> q;
  LoadInt2Queries<D, kSplitRows, kInt8Keys>(p, b, h, G, quick, s_q, s_sumq, q, [&] {
    if (quick && lane == 0) {  // the rest of the first burst
      for (int i = first_burst; i < min(my_pages, kInt2Stages); ++i) issue(i);
    }
  });
  WarpState<D> st;
  st.Clear();

  // Page i's stage, once its copies have landed.
  auto wait = [&](int i) {
    ptx::BarrierWait(bars + i % kInt2Stages, (i / kInt2Stages) & 1);
    return stages + (i % kInt2Stages) * kInt2StageBytes<D>;
  };
  // The warp is done reading page i's stage, which then takes page i + kInt2Stages.
  auto release = [&](int i) {
    __syncwarp();
    if (lane == 0 && i + kInt2Stages < my_pages) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // our reads before its writes
      issue(i + kInt2Stages);
    }
  };
  // Page i from its stage into registers; the stage then takes page i + kInt2Stages.
  auto load = [&](PageRegs<D>& r, int i) {
    LoadPage(r, wait(i), lane);
    release(i);
  };
  RunInt2Pages<D, kFlow, kSplitRows, kInt8Keys>(st, my_pages, q, load, wait, release);
  if (!dependents_at_start) ptx::LaunchDependents();  // the merge may launch (it waits for us)
  WriteInt2Partial<D, kSplitRows>(st, s_o, s_m, s_l, G,
                                  PartialRow(ws, b, geo.num_kv_heads, h, ws.window + split), ws);
}

}  // namespace
}  // namespace kvstrata::kernels
