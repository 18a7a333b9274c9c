#pragma once

// Codec history pages (PageEncoding::kCodec, kernels/codec_page.h) for split decode (included by
// split_decode.cu only): a CTA of 4 warps attends a range of codec pages of one (sequence, KV
// head). Each page's K and V blocks (the launch's layer, SplitDecodeCudaParams::codec) are
// streamed into shared memory by cp.async, kCodecStages pages in flight; the CTA then decodes
// the page's codes into fp16 rows in the BF16 kernel's swizzled stage (every region of every row
// at its own bits and levels), and the warps run the BF16 page's tensor-core products on it
// (split_decode_bf16.cuh).
//
// Decoding by page tables (SplitDecodeVariant::codec_page_tables, the default): a value is
// s_t · ρ_k · L[code], s_t the row's scale and ρ_k the region's page ratio. Per page the CTA
// first writes, for every region, the fp16 pairs (ρ_k · L[c0], ρ_k · L[c1]) of every pair of
// codes (4^bits entries of 32 bits: two channels per lookup, no packing) into a table, and the
// 64 row scales of each side; a staged row is then the table's values alone, and s_t multiplies
// the token's score (K) and its probability as it enters the V product. Without the row scale
// the values are within fp16's range (|ρ · L| < 2^12 · 2.74), so the products run in fp16, whose
// 11-bit significand keeps them closer to the CPU's fp32 than bf16 would. Each thread always
// decodes the same eight channels of a row, so its region, code offset and table are fixed for
// the launch, as are the table entries it writes (CodecThreadPlan, CodecTablePlan: planned once
// per CTA, so a page costs no walk over the regions); a dropped region reads a zero pair.

#include "kernels/cuda/codec_block.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/cuda/split_decode.h"
#include "kernels/cuda/split_decode_bf16.cuh"
#include "kernels/cuda/split_decode_common.cuh"

namespace kvstrata::kernels::split {

constexpr int kCodecStages = 3;  // raw codec pages in flight per CTA

// Room for one side's block in shared memory: codes of at most 4 bits, each region's codes
// padded to 16 bytes, the row scales, the ratios and the block's padding.
template <int D>
constexpr int kCodecSideBytes = kPageTokens * D / 2 + 16 * kMaxCodecRegions + kPageTokens + 32;
template <int D>
constexpr int kCodecRawBytes = 2 * kCodecSideBytes<D>;

// The decoded stage (BF16 rows), then the raw stages; at least what a fused window CTA stages.
template <int D>
constexpr int kCodecHistorySmemBytes =
    kBf16StageBytes<D> + kCodecStages * kCodecRawBytes<D> > 2 * kBf16StageBytes<D>
        ? kBf16StageBytes<D> + kCodecStages * kCodecRawBytes<D>
        : 2 * kBf16StageBytes<D>;

// A side's page tables: a region of b bits takes 4^b pairs, and its table starts at a multiple
// of that after the tables of the regions before it (codec::CodecTablePairs); a side's tables
// at most this many pairs (codec::GpuLayoutOk's budget: a 4-bit region beside 3-bit and
// narrower ones, as in every P2 recipe). With the side's tables aligned to their whole size, an
// entry's address is its table's ORed with its index. Dropped regions read one zero pair.
constexpr int kCodecTablePairs = 512;

// f(k, bits, first) for each coded region k of a side, in order; `first` is the index of its
// table's first pair.
template <typename F>
__device__ __forceinline__ void ForEachCodecTable(const CodecSideLayout& s, F&& f) {
  int first = 0;
  for (int k = 0; k < s.num_regions; ++k) {
    const int bits = s.bits[k];
    if (bits == 0) continue;
    first = codec::AlignedTableFirst(first, bits);
    f(k, bits, first);
    first += 1 << (2 * bits);
  }
}

// All threads of the CTA: cp.async of the K and V blocks of page `page` of `seg` (sequence b,
// KV head h) into `raw`. The caller commits the group.
template <int D>
__device__ __forceinline__ void StageCodecPage(const SplitDecodeCudaParams& p,
                                               const PagedSegmentView& seg, int b, int page,
                                               int h, uint8_t* raw) {
  const int64_t slot = seg.indices[seg.indptr[b] + page];
  const uint8_t* base = seg.pool + slot * seg.slot_stride;
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
    const CodecSideLayout& s = p.codec.side[kind];
    const uint8_t* src = base + s.block0 + int64_t{h} * s.block_bytes;
    uint8_t* dst = raw + kind * kCodecSideBytes<D>;
    for (int c = threadIdx.x; c < s.block_bytes / 16; c += kThreads) {
      ptx::CpAsync16(dst + 16 * c, src + 16 * c, 16u);
    }
  }
}

// All threads of the CTA: the staged page's K and V rows as fp16 into the swizzled `stage`
// (kBf16StageBytes), every value scaled in fp32 as decoded (and saturated to fp16's range);
// rows at or past `tokens` zero.
template <int D>
__device__ __forceinline__ void DecodeCodecPageScaled(const SplitDecodeCudaParams& p,
                                                      const uint8_t* raw, uint8_t* stage,
                                                      int tokens, const float (*levels)[16],
                                                      const float* scales) {
  constexpr int kChunks = D / 8;  // 16-byte chunks (eight channels) per row
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
    const CodecSideLayout& side = p.codec.side[kind];
    const uint8_t* block = raw + kind * kCodecSideBytes<D>;
    uint8_t* rows = stage + kind * (kPageTokens * 2 * D);
#pragma unroll 2
    for (int i = threadIdx.x; i < kPageTokens * kChunks; i += kThreads) {
      const int row = i / kChunks, ch = i % kChunks;
      uint4 packed = make_uint4(0u, 0u, 0u, 0u);
      if (row < tokens) {
        float v[8];
        codec::DecodeEight(block, side, row, 8 * ch, levels, scales, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = fminf(fmaxf(v[j], -65504.0f), 65504.0f);
        packed = make_uint4(ptx::PackHalf2(v[0], v[1]), ptx::PackHalf2(v[2], v[3]),
                            ptx::PackHalf2(v[4], v[5]), ptx::PackHalf2(v[6], v[7]));
      }
      *reinterpret_cast<uint4*>(rows + SwizzledChunk<D>(row, ch)) = packed;
    }
  }
}

// What one thread decodes on every page, fixed for the launch: chunk ch = threadIdx.x % (D / 8)
// (channels 8ch..8ch+7) of rows threadIdx.x / (D / 8) + 128 / (D / 8) · j, for each side.
struct CodecThreadPlan {
  int code_offset[2];  // byte offset, in the side's staged block, of the chunk's codes in row 0
  int row_bytes[2];    // of the chunk's region
  int bits[2];         // of the chunk's region (0: dropped, zeros)
  uint32_t table[2];   // shared address of the region's pair table (dropped: the zero pair)
};

// The table entries one thread writes on every page: entry threadIdx.x + kThreads · j of each
// side's tables (each region's table where ForEachCodecTable places it), fixed for the launch.
constexpr int kCodecTableSlots = kCodecTablePairs / kThreads;
struct CodecTablePlan {
  // Offset in the staged page of the entry's region ratio | the index of L[c0] in the flat
  // levels [5][16] << 14 | that of L[c1] << 21; -1: no entry (a table's alignment gap, or past
  // the tables).
  int entry[2][kCodecTableSlots];
  int row_scale;  // offset in the staged page of the row scale this thread reads
};

// `tables`: the CTA's [2][kCodecTablePairs] pair tables; `zero_pair`: a zero word.
template <int D>
__device__ __forceinline__ CodecThreadPlan PlanCodecThread(const CodecLayerLayout& layout,
                                                           const uint32_t (*tables)[kCodecTablePairs],
                                                           const uint32_t* zero_pair) {
  constexpr int kChunks = D / 8;
  CodecThreadPlan t;
  const int c0 = 8 * (threadIdx.x % kChunks);
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
    const CodecSideLayout& s = layout.side[kind];
    int start = 0, region = -1;
    t.bits[kind] = 0;
    t.code_offset[kind] = t.row_bytes[kind] = 0;
    t.table[kind] = static_cast<uint32_t>(__cvta_generic_to_shared(zero_pair));
    for (int k = 0; k < s.num_regions; ++k) {
      const int bits = s.bits[k];
      if (c0 >= start && c0 < start + s.channels[k] && bits > 0) {
        region = k;
        t.bits[kind] = bits;
        t.row_bytes[kind] = s.channels[k] * bits / 8;
        t.code_offset[kind] = s.codes[k] + (c0 - start) / 8 * bits;
      }
      start += s.channels[k];
    }
    ForEachCodecTable(s, [&](int k, int, int first) {
      if (k == region) {
        t.table[kind] = static_cast<uint32_t>(__cvta_generic_to_shared(tables[kind] + first));
      }
    });
  }
  return t;
}

template <int D>
__device__ __forceinline__ CodecTablePlan PlanCodecTables(const CodecLayerLayout& layout) {
  static_assert(kThreads == 2 * kPageTokens, "a thread reads one row scale of one side");
  CodecTablePlan t;
  const int side = threadIdx.x / kPageTokens;
  t.row_scale = side * kCodecSideBytes<D> + layout.side[side].row_scales + threadIdx.x % kPageTokens;
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
    const CodecSideLayout& s = layout.side[kind];
#pragma unroll
    for (int j = 0; j < kCodecTableSlots; ++j) t.entry[kind][j] = -1;
    ForEachCodecTable(s, [&](int k, int bits, int first) {
#pragma unroll
      for (int j = 0; j < kCodecTableSlots; ++j) {
        const int e = static_cast<int>(threadIdx.x) + kThreads * j - first;
        if (e >= 0 && e < 1 << (2 * bits)) {
          t.entry[kind][j] = (kind * kCodecSideBytes<D> + s.ratios + k) |
                             (16 * bits + (e & ((1 << bits) - 1))) << 14 |
                             (16 * bits + (e >> bits)) << 21;
        }
      }
    });
  }
  return t;
}

// All threads of the CTA, once a page has landed in `raw`: each side's tables (for every coded
// region and every pair of codes (c0, c1), the fp16 pair ρ_k · L[c0] | ρ_k · L[c1] << 16 at
// c0 + 2^bits · c1 in the region's table) and its 64 row scales s_t (as LogScaleValue
// gives them).
template <int D>
__device__ __forceinline__ void BuildCodecTables(const CodecTablePlan& t, const uint8_t* raw,
                                                 const float (*levels)[16], const float* scales,
                                                 uint32_t (*tables)[kCodecTablePairs],
                                                 float (*row_scale)[kPageTokens]) {
  static_assert(2 * kCodecSideBytes<D> < 1 << 14, "a ratio's offset in 14 bits");
  (&row_scale[0][0])[threadIdx.x] = scales[raw[t.row_scale]];
  const float* l = &levels[0][0];
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
#pragma unroll
    for (int j = 0; j < kCodecTableSlots; ++j) {
      const int e = t.entry[kind][j];
      if (e < 0) continue;
      const float ratio = scales[raw[e & 0x3fff]];
      tables[kind][threadIdx.x + kThreads * j] =
          ptx::PackHalf2(ratio * l[(e >> 14) & 0x7f], ratio * l[e >> 21]);
    }
  }
}

// All threads of the CTA: the staged page's rows as fp16 from the page tables (rows past
// `tokens` are decoded all the same: their codes are a full page's, and their scores masked).
// A thread's rows step by a multiple of 8, so their swizzle is the first row's; a lookup is a
// shift, an AND-OR with the table's address and a load.
template <int D>
__device__ __forceinline__ void DecodeCodecPageFromTables(const CodecThreadPlan& t,
                                                          const uint8_t* raw, uint8_t* stage) {
  constexpr int kChunks = D / 8;
  constexpr int kRowStep = kThreads / kChunks;
  static_assert(kRowStep % 8 == 0 && kPageTokens % kRowStep == 0, "rows of one swizzle");
  const int row0 = threadIdx.x / kChunks, ch = threadIdx.x % kChunks;
#pragma unroll
  for (int kind = 0; kind < 2; ++kind) {
    const uint32_t* words = reinterpret_cast<const uint32_t*>(raw + kind * kCodecSideBytes<D>);
    const uint32_t table = t.table[kind];
    const int pair_bits = 2 * t.bits[kind];
    const uint32_t mask = ((1u << pair_bits) - 1) << 2;  // a pair of codes, in bytes; 0: dropped
    const int shift = max(pair_bits - 2, 0);
    uint8_t* rows = stage + kind * (kPageTokens * 2 * D) + SwizzledChunk<D>(row0, ch);
    const int step = kRowStep * t.row_bytes[kind];
    int at = t.code_offset[kind] + row0 * t.row_bytes[kind];
#pragma unroll
    for (int j = 0; j < kPageTokens / kRowStep; ++j, at += step) {
      // The chunk's `bits` bytes from the aligned words around them (a block's codes are
      // followed by its scales, so the second word is inside the stage).
      const uint32_t w = __funnelshift_r(words[at >> 2], words[(at >> 2) + 1], 8 * (at & 3));
      *reinterpret_cast<uint4*>(rows + j * kRowStep * 2 * D) =
          make_uint4(ptx::LdShared32(((w << 2) & mask) | table),
                     ptx::LdShared32(((w >> shift) & mask) | table),
                     ptx::LdShared32(((w >> (shift + pair_bits)) & mask) | table),
                     ptx::LdShared32(((w >> (shift + 2 * pair_bits)) & mask) | table));
    }
  }
}

// The whole CTA: codec pages [begin, end) of `seg` for (sequence b, KV head h), written as the
// partial (o, lse) of workspace row row0. `smem` holds kCodecHistorySmemBytes<D>; page_tables
// is SplitDecodeVariant::codec_page_tables.
template <int D>
__device__ __forceinline__ void CodecPageRange(const SplitDecodeCudaParams& p,
                                               const PagedSegmentView& seg, int b, int h,
                                               int begin, int end, uint8_t* smem, int64_t row0,
                                               const Workspace& ws, bool page_tables) {
  static_assert(kThreads % (D / 8) == 0, "a thread decodes the same chunk of every row");
  __shared__ float s_levels[5][16];
  __shared__ float s_scales[256];
  __shared__ __align__(4 * kCodecTablePairs) uint32_t s_tables[2][kCodecTablePairs];
  __shared__ uint32_t s_zero_pair;
  __shared__ float s_row_scale[2][kPageTokens];
  uint8_t* stage = smem;
  uint8_t* raw = smem + kBf16StageBytes<D>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int G = p.num_q_heads / p.geometry.num_kv_heads;
  const int npages = seg.num_pages(b);
  const int n = max(0, min(end, npages) - begin);
  for (int i = 0; i < kCodecStages - 1; ++i) {
    if (i < n) StageCodecPage<D>(p, seg, b, begin + i, h, raw + i * kCodecRawBytes<D>);
    ptx::CpAsyncCommit();
  }
  codec::LoadTables(s_levels, s_scales);
  if (threadIdx.x == 0) s_zero_pair = 0u;
  const CodecThreadPlan plan = PlanCodecThread<D>(p.codec, s_tables, &s_zero_pair);
  CodecTablePlan table_plan;
  if (page_tables) table_plan = PlanCodecTables<D>(p.codec);
  // The first pages are on their way; the queries (and the workspace) are the kernel before's.
  ptx::GridDependencyWait();
  uint32_t bq[D / 16][2], hq[D / 16][2];
  QueryFragments<D>(p, b, h, G, lane, bq);
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {  // the same in fp16, for the codec's rows
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t x = bq[step][j];
      hq[step][j] = ptx::PackHalf2(fminf(fmaxf(Bf16ToFloat(x & 0xffffu), -65504.0f), 65504.0f),
                                   fminf(fmaxf(Bf16ToFloat(x >> 16), -65504.0f), 65504.0f));
    }
  }
  const float qscale = p.sm_scale * kLog2e;
  Bf16WarpState<D> st;
  st.Clear();
  for (int i = 0; i < n; ++i) {
    ptx::CpAsyncWait<kCodecStages - 2>();  // page i has landed (this thread's part of it)
    __syncthreads();  // ... every thread's; page i - 1's rows, tables and raw stage are done with
    const int next = i + kCodecStages - 1;
    if (next < n) {
      StageCodecPage<D>(p, seg, b, begin + next, h, raw + (next % kCodecStages) * kCodecRawBytes<D>);
    }
    ptx::CpAsyncCommit();
    const int page = begin + i;
    const int tokens = page + 1 == npages ? seg.last_page_len[b] : kPageTokens;
    const uint8_t* page_raw = raw + (i % kCodecStages) * kCodecRawBytes<D>;
    if (page_tables) {
      BuildCodecTables<D>(table_plan, page_raw, s_levels, s_scales, s_tables, s_row_scale);
      __syncthreads();  // the tables
      DecodeCodecPageFromTables<D>(plan, page_raw, stage);
      __syncthreads();  // the rows
      Bf16PageTokens<D, true>(st, stage, warp, lane, tokens, hq, qscale, s_row_scale);
    } else {
      DecodeCodecPageScaled<D>(p, page_raw, stage, tokens, s_levels, s_scales);
      __syncthreads();  // the rows
      Bf16PageTokens<D, true>(st, stage, warp, lane, tokens, hq, qscale);
    }
  }
  ptx::CpAsyncWait<0>();
  ptx::LaunchDependents();  // the merge may launch (it waits for this kernel's end)
  WritePartial<D>(st, smem, G, row0, ws);
}

}  // namespace kvstrata::kernels::split
