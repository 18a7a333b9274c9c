#pragma once

// BF16 pages on tensor cores, for split decode (included by split_decode.cu only): a CTA of 4
// warps attends a range of BF16 pages of one (sequence, KV head), the pages streamed through
// shared memory by cp.async, `Stages` pages in flight. Each warp takes 16 of a page's 64 tokens
// and runs both products as mma.m16n8k16 in bf16 with fp32 accumulators, the G <= 8 query heads
// on the n = 8 side, as the INT2 kernel does:
//   Sᵀ[16 tokens x heads] = K[16 tokens x dims] · Qᵀ      (A = K rows, ldmatrix)
//   Oᵀ[dims x heads]     += Vᵀ[dims x 16 tokens] · Pᵀ     (A = V rows, ldmatrix.trans)
// Rows of K and V are staged with their 16-byte chunks XOR-swizzled by (row % 8), so the eight
// row addresses of every ldmatrix phase fall in eight different bank groups. Each warp keeps
// its own online softmax; the warps combine at the end (CombineWarps).

#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_common.cuh"

namespace kvstrata::kernels::split {

// Bytes one BF16 page (one layer, one KV head) takes in shared memory: K rows then V rows.
template <int D>
constexpr int kBf16StageBytes = 2 * kPageTokens * D * 2;
static_assert(kWarps * kMaxGroup * 64 * 4 <= kBf16StageBytes<64>, "warp outputs fit a stage");

// Byte offset of chunk `ch` (16 bytes) of row `row` in a staged K or V block.
template <int D>
__device__ __forceinline__ int SwizzledChunk(int row, int ch) {
  return row * (2 * D) + ((ch ^ (row & 7)) << 4);
}

// A page of the split cache: page `page` of segment `seg`.
struct PageRef {
  const PagedSegmentView* seg;
  int page;
};

// The tokens page `ref` holds for sequence b.
__device__ __forceinline__ int PageTokens(const PageRef& ref, int b) {
  return ref.page + 1 == ref.seg->num_pages(b) ? ref.seg->last_page_len[b] : kPageTokens;
}

// All threads of the CTA: cp.async of page `ref` (sequence b, this layer, KV head h) into
// `stage`; rows past the page's tokens are zero-filled. The caller commits the group.
template <int D>
__device__ __forceinline__ void StageBf16Page(const SplitDecodeCudaParams& p, const PageRef& ref,
                                              int b, int h, uint8_t* stage) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  const int tokens = PageTokens(ref, b);
  const int64_t slot = ref.seg->indices[ref.seg->indptr[b] + ref.page];
  const uint8_t* base = ref.seg->pool + slot * ref.seg->slot_stride;
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
    const uint8_t* src = base + BlockOffset(p.geometry, PageEncoding::kBf16, p.layer, kind, h);
    uint8_t* dst = stage + kind * (kPageTokens * 2 * D);
#pragma unroll
    for (int j = 0; j < kPageTokens * kChunks / kThreads; ++j) {
      const int c = threadIdx.x + j * kThreads;
      const int row = c / kChunks, ch = c % kChunks;
      ptx::CpAsync16(dst + SwizzledChunk<D>(row, ch), src + c * 16, row < tokens ? 16u : 0u);
    }
  }
}

// One warp's online-softmax state. Columns are the heads 2t, 2t+1 of lane (g, t).
template <int D>
struct Bf16WarpState {
  float o[D / 16][4];  // Oᵀ accumulators: (dim 16mb+g | +8, heads 2t | 2t+1)
  float m[2], l[2];    // running max (log2 units) and Σp (this thread's rows only)

  __device__ __forceinline__ void Clear() {
#pragma unroll
    for (int col = 0; col < 2; ++col) m[col] = -INFINITY, l[col] = 0.0f;
#pragma unroll
    for (int mb = 0; mb < D / 16; ++mb) o[mb][0] = o[mb][1] = o[mb][2] = o[mb][3] = 0.0f;
  }
};

// B fragments of Q for lane (g, t): (dims 16s+2t, +1 | 16s+2t+8, +9 ; head g), straight from
// its bf16 pairs; zeros for g >= G.
template <int D>
__device__ __forceinline__ void QueryFragments(const SplitDecodeCudaParams& p, int b, int h, int G,
                                               int lane, uint32_t (&bq)[D / 16][2]) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t* q = reinterpret_cast<const uint32_t*>(
      p.q + (int64_t{b} * p.num_q_heads + h * G + min(g, G - 1)) * D);
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {
    bq[step][0] = g < G ? q[8 * step + t] : 0u;
    bq[step][1] = g < G ? q[8 * step + 4 + t] : 0u;
  }
}

// The end of a range: the warps' states combined into the partial (o, lse) of workspace row
// row0. `smem` (at least kWarps x kMaxGroup x D floats) is free once every warp is done with
// it: this synchronises the CTA first.
template <int D>
__device__ __forceinline__ void WritePartial(Bf16WarpState<D>& st, uint8_t* smem, int G,
                                             int64_t row0, const Workspace& ws) {
  __shared__ float s_m[kWarps][kMaxGroup], s_l[kWarps][kMaxGroup];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
#pragma unroll
    for (int x = 4; x <= 16; x <<= 1) st.l[col] += __shfl_xor_sync(0xffffffffu, st.l[col], x);
  }
  __syncthreads();  // every warp is done with the stages
  float(*s_o)[kMaxGroup][D] = reinterpret_cast<float(*)[kMaxGroup][D]>(smem);
#pragma unroll
  for (int mb = 0; mb < D / 16; ++mb) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s_o[warp][2 * t + (e & 1)][16 * mb + g + 8 * (e >> 1)] = st.o[mb][e];
  }
  if (g == 0) {
#pragma unroll
    for (int col = 0; col < 2; ++col) {
      s_m[warp][2 * t + col] = st.m[col];
      s_l[warp][2 * t + col] = st.l[col];
    }
  }
  __syncthreads();
  CombineWarps<D>(s_o, s_m, s_l, G, row0, ws);
}

// The warp's 16 tokens of one staged page. bq: Q's B fragments (unscaled bf16), qscale the
// softmax scale in log2 units, tokens the page's valid tokens.
//
// row_scale (a codec page, split_decode_codec.cuh): per token the factor its staged K row and V
// row were divided by ([0][token] and [1][token], shared memory): the scores are multiplied by
// the K factor, the probabilities by the V factor as they enter the V product (the softmax sums
// keep them unscaled). Null for BF16 pages. Fp16: the stage's rows and bq are fp16 (and so are
// the probabilities on the V product) instead of bf16.
template <int D, bool Fp16 = false>
__device__ __forceinline__ void Bf16PageTokens(Bf16WarpState<D>& st, const uint8_t* stage,
                                               int warp, int lane, int tokens,
                                               const uint32_t (&bq)[D / 16][2], float qscale,
                                               const float (*row_scale)[kPageTokens] = nullptr) {
  const int g = lane >> 2;
  const uint8_t* kb = stage;
  const uint8_t* vb = stage + kPageTokens * 2 * D;
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  {
    // A of K: matrices (tokens 0-7 | 8-15) x (dims 0-7 | 8-15) of each 16-dim step.
    const int row = 16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int hi = (lane >> 4) & 1;
#pragma unroll
    for (int step = 0; step < D / 16; ++step) {
      uint32_t a[4];
      ptx::LdMatrixX4(a, kb + SwizzledChunk<D>(row, 2 * step + hi));
      if constexpr (Fp16) {
        ptx::MmaF16(s, a[0], a[1], a[2], a[3], bq[step][0], bq[step][1]);
      } else {
        ptx::MmaBf16(s, a, bq[step][0], bq[step][1]);
      }
    }
  }
  // s[e]: token 16·warp + g + 8·(e / 2) of the page, head 2t + e % 2.
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int tok = 16 * warp + g + 8 * (e >> 1);
    const float f = row_scale ? qscale * row_scale[0][tok] : qscale;
    s[e] = tok < tokens ? s[e] * f : -INFINITY;
  }
  float alpha[2], mu[2];
  bool moved = false;
#pragma unroll
  for (int col = 0; col < 2; ++col) {
    float mx = fmaxf(s[col], s[col + 2]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(st.m[col], mx);
    moved |= m_new != st.m[col];
    // A warp whose tokens are all past the page's end sees only -inf: weights 0, no rescale.
    mu[col] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[col] = ptx::Exp2(st.m[col] - mu[col]);  // 0 on the first page (m = -inf)
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
  float pr[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    pr[e] = ptx::Exp2(s[e] - mu[e & 1]);
    st.l[e & 1] += pr[e];
  }
  if (row_scale) {  // the V rows' factors enter with the probabilities
    const float v0 = row_scale[1][16 * warp + g], v1 = row_scale[1][16 * warp + g + 8];
    pr[0] *= v0, pr[1] *= v0, pr[2] *= v1, pr[3] *= v1;
  }
  // Pᵀ as the B operand: (tokens 2t, 2t+1 | 2t+8, 2t+9 ; head g).
  const uint32_t b0 = ptx::Transpose8x8(Fp16 ? ptx::PackHalf2(pr[0], pr[1])
                                              : ptx::PackBf162(pr[0], pr[1]));
  const uint32_t b1 = ptx::Transpose8x8(Fp16 ? ptx::PackHalf2(pr[2], pr[3])
                                              : ptx::PackBf162(pr[2], pr[3]));
  {
    // A of Vᵀ: matrices (dims 0-7 | 8-15) x (tokens 0-7 | 8-15), read transposed from V rows.
    const int row = 16 * warp + (lane & 7) + ((lane >> 4) & 1) * 8;
    const int hi = (lane >> 3) & 1;
#pragma unroll
    for (int mb = 0; mb < D / 16; ++mb) {
      uint32_t a[4];
      ptx::LdMatrixX4Trans(a, vb + SwizzledChunk<D>(row, 2 * mb + hi));
      if constexpr (Fp16) {
        ptx::MmaF16(st.o[mb], a[0], a[1], a[2], a[3], b0, b1);
      } else {
        ptx::MmaBf16(st.o[mb], a, b0, b1);
      }
    }
  }
}

// The whole CTA: pages page_at(0), ..., page_at(n - 1) of sequence b, KV head h, written as
// the partial (o, lse) of workspace row row0. `smem` holds Stages staged pages (with one page
// only the first stage is touched; with one stage each page is asked for once the one before
// is done) and, after the loop, the warps' outputs.
template <int D, int Stages, typename PageAt>
__device__ __forceinline__ void Bf16Pages(const SplitDecodeCudaParams& p, int b, int h, int n,
                                          PageAt page_at, uint8_t* smem, int64_t row0,
                                          const Workspace& ws) {
  static_assert(Stages >= 1, "at least one stage");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = p.num_q_heads / p.geometry.num_kv_heads;

  for (int i = 0; i < (Stages > 1 ? Stages - 1 : 1); ++i) {
    if (i < n) StageBf16Page<D>(p, page_at(i), b, h, smem + i * kBf16StageBytes<D>);
    ptx::CpAsyncCommit();
  }
  // The first pages are on their way; the queries (and the workspace) are the kernel before's
  // (a no-op unless launched early, SplitDecodeVariant::early_launch).
  ptx::GridDependencyWait();
  uint32_t bq[D / 16][2];
  QueryFragments<D>(p, b, h, G, lane, bq);
  const float qscale = p.sm_scale * kLog2e;
  Bf16WarpState<D> st;
  st.Clear();

  for (int i = 0; i < n; ++i) {
    if constexpr (Stages == 1) {
      if (i > 0) {
        __syncthreads();  // every warp is done with page i - 1
        StageBf16Page<D>(p, page_at(i), b, h, smem);
        ptx::CpAsyncCommit();
      }
      ptx::CpAsyncWait<0>();  // page i has landed (this thread's part of it)
      __syncthreads();        // ... every thread's
    } else {
      ptx::CpAsyncWait<Stages - 2>();  // page i has landed (this thread's part of it)
      __syncthreads();                 // ... every thread's, and page i - 1 is done with
      const int next = i + Stages - 1;
      if (next < n) {
        StageBf16Page<D>(p, page_at(next), b, h, smem + (next % Stages) * kBf16StageBytes<D>);
      }
      ptx::CpAsyncCommit();
    }
    Bf16PageTokens<D>(st, smem + (i % Stages) * kBf16StageBytes<D>, warp, lane,
                      PageTokens(page_at(i), b), bq, qscale);
  }
  ptx::CpAsyncWait<0>();
  ptx::LaunchDependents();  // the merge may launch (it waits for this kernel's end)
  WritePartial<D>(st, smem, G, row0, ws);
}

// Pages [begin, end) of `seg` (clipped to the sequence's pages), as Bf16Pages.
template <int D, int Stages>
__device__ __forceinline__ void Bf16PageRange(const SplitDecodeCudaParams& p,
                                              const PagedSegmentView& seg, int b, int h, int begin,
                                              int end, uint8_t* smem, int64_t row0,
                                              const Workspace& ws) {
  const int n = max(0, min(end, seg.num_pages(b)) - begin);
  Bf16Pages<D, Stages>(
      p, b, h, n,
      [&](int i) {
        return PageRef{&seg, begin + i};
      },
      smem, row0, ws);
}

// Window slot i of sequence b: its window pages (the sink's, then the recent window's)
// [i·w, (i + 1)·w) with w = ws.window_pages_per_slot, as one partial; a slot past the
// sequence's window pages is written empty. `smem` holds Stages staged pages (Bf16Pages).
template <int D, int Stages>
__device__ __forceinline__ void Bf16WindowSlot(const SplitDecodeCudaParams& p, const Workspace& ws,
                                               int i, int h, int b, uint8_t* smem) {
  // Launched early (SplitDecodeVariant::early_launch): the window's pages and the workspace
  // wait for the kernel before.
  ptx::GridDependencyWait();
  const int G = p.num_q_heads / p.geometry.num_kv_heads;
  const int n0 = p.segments[0].num_pages(b), n2 = p.segments[2].num_pages(b);
  const int64_t row0 = PartialRow(ws, b, p.geometry.num_kv_heads, h, i);
  const int first = i * ws.window_pages_per_slot;
  const int n = min(ws.window_pages_per_slot, n0 + n2 - first);
  if (n <= 0) {
    for (int e = threadIdx.x; e < G * D; e += kThreads) {
      ws.part_o[(row0 + e / D) * D + e % D] = 0.0f;
      if (e % D == 0) ws.part_lse[row0 + e / D] = -INFINITY;
    }
    return;
  }
  Bf16Pages<D, Stages>(
      p, b, h, n,
      [&](int k) {
        const int j = first + k;
        return j < n0 ? PageRef{&p.segments[0], j} : PageRef{&p.segments[2], j - n0};
      },
      smem, row0, ws);
}

}  // namespace kvstrata::kernels::split
