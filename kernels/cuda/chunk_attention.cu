// Prefill (chunk) attention over the split cache, on tensor cores (FlashAttention-2 style).
//
// One CTA of 8 warps per (128-query tile, query head, item); each warp owns 16 query rows. The
// CTA walks the pages its last query can see, page by page. A page is staged in shared memory
// as fp16 K [64 tokens][d] and Vᵀ [d][64 tokens], from its BF16 copy or dequantised from its
// INT2 copy, and each version is applied only to the queries that see it in that form (the
// sink and the recent window in BF16, history in INT2, decided per query position exactly as
// KvCache::FirstInt2Query), with the causal mask. Both products are mma.m16n8k16 (fp16 in,
// fp32 accumulate); the softmax is online, in the log2 domain, per row.

#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/chunk_attention.h"
#include "kernels/cuda/codec_block.cuh"
#include "kernels/numeric.h"

namespace kvstrata::kernels {

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileQ = 16 * kWarps;
constexpr int kPage = 64;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ float Level(const Int2Levels& levels, int code) {
  return code == 0 ? levels.v[0] : code == 1 ? levels.v[1] : code == 2 ? levels.v[2] : levels.v[3];
}

template <int D>
struct Tile {
  __half k[kPage][D + 8];   // padded rows: conflict-free fragment loads
  __half vt[D][kPage + 8];  // V transposed, so the PV product's B fragments are 32-bit loads
};

// BF16 blocks [64][D] -> fp16 tiles; tokens at or past `valid` become zeros (the rest of a
// partial page may hold anything, and 0 · NaN is NaN).
template <int D>
__device__ void StageBf16(Tile<D>& s, const uint8_t* kblock, const uint8_t* vblock, int valid) {
  const uint16_t* k16 = reinterpret_cast<const uint16_t*>(kblock);
  const uint16_t* v16 = reinterpret_cast<const uint16_t*>(vblock);
  for (int i = threadIdx.x; i < kPage * D / 8; i += kThreads) {
    const int tok = i / (D / 8), c0 = (i % (D / 8)) * 8;
    uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
    if (tok < valid) {
      kw = *reinterpret_cast<const uint4*>(k16 + tok * D + c0);
      vw = *reinterpret_cast<const uint4*>(v16 + tok * D + c0);
    }
    const uint16_t* kh = reinterpret_cast<const uint16_t*>(&kw);
    const uint16_t* vh = reinterpret_cast<const uint16_t*>(&vw);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s.k[tok][c0 + j] = __float2half_rn(Bf16ToFloat(kh[j]));
      s.vt[c0 + j][tok] = __float2half_rn(Bf16ToFloat(vh[j]));
    }
  }
}

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// The codes of a 32-bit code word (pair p at bits 2p and 16 + 2p, kv_layout.h) regrouped so that
// pair q of half h sits at bits 2q and 8 + 2q of word h: byte 0 and byte 2 of the code word
// (pairs 0-3), then byte 1 and byte 3 (pairs 4-7).
__device__ __forceinline__ void SplitPairs(uint32_t w, uint32_t (&v)[2]) {
  v[0] = Prmt(w, 0, 0x4420);
  v[1] = Prmt(w, 0, 0x4431);
}

// The PRMT selector that picks, from a token's table {h0 | h1 << 16, h2 | h3 << 16}, half c0 into
// the low 16 bits and half c1 into the high 16 bits, for the codes c0, c1 of pair q: each result
// byte names a table byte (2c, 2c + 1), i.e. the selector byte 0x10 + 0x22 · c.
__device__ __forceinline__ uint32_t HalfSelector(const uint32_t (&v)[2], int p) {
  return ((v[p / 4] >> (2 * (p % 4))) & 0x0303u) * 0x22u + 0x1010u;
}

// INT2 blocks of one scale and offset per token (group_size == D, what the engine stores) ->
// fp16 tiles. A token's codes stand for four values, offset + scale · level[j] in fp32 rounded
// to fp16 exactly as DecodeInt2Block and the per-channel path below compute them: they are made
// once per token (a table of four halves), and each pair of codes then becomes its half2 with one
// byte permute, and one store. Tokens at or past `valid` get a table of zeros.
template <int D>
__device__ void StageInt2PerToken(Tile<D>& s, uint2 (*table)[kPage], const uint8_t* kblock,
                                  const uint8_t* vblock, int valid, const Int2Levels& levels) {
  static_assert(kThreads >= 2 * kPage, "one thread per (block, token) makes the tables");
  if (threadIdx.x < 2 * kPage) {
    const int kind = threadIdx.x / kPage, tok = threadIdx.x % kPage;
    uint2 t = make_uint2(0, 0);
    if (tok < valid) {
      const uint32_t params = *reinterpret_cast<const uint32_t*>(
          (kind == 0 ? kblock : vblock) + kPage * (D / 4) + tok * 4);
      const float scale = Fp16ToFloat(static_cast<uint16_t>(params & 0xffffu));
      const float offset = Fp16ToFloat(static_cast<uint16_t>(params >> 16));
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] = offset + scale * levels.v[j];
      t = make_uint2(PackHalf2(v[0], v[1]), PackHalf2(v[2], v[3]));
    }
    table[kind][tok] = t;
  }
  __syncthreads();
  constexpr int kWords = kPage * D / 16;  // 32-bit code words per block
  const uint32_t* kw = reinterpret_cast<const uint32_t*>(kblock);
  const uint32_t* vw = reinterpret_cast<const uint32_t*>(vblock);
  // K: word wr of token tok's row holds channels 16 s + 8 hi + 2 t (+1) for s = 4 shi + p / 2,
  // hi = p % 2 (KCodeBit): each pair is two adjacent channels of one token.
  for (int wi = threadIdx.x; wi < kWords; wi += kThreads) {
    uint32_t v[2];
    SplitPairs(__ldg(kw + wi), v);
    const int tok = wi / (D / 16), wr = wi % (D / 16);
    const int t = wr / (D / 64), shi = wr % (D / 64);
    const uint2 tb = table[0][tok];
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const int c0 = 16 * (4 * shi + p / 2) + 8 * (p % 2) + 2 * t;
      *reinterpret_cast<uint32_t*>(&s.k[tok][c0]) = Prmt(tb.x, tb.y, HalfSelector(v, p));
    }
  }
  // V: a word holds, for 8 channels, the codes of two adjacent tokens (VCodeBit): each pair is
  // one channel of tokens tok0 and tok0 + 1, two adjacent halves of the transposed tile.
  for (int wi = threadIdx.x; wi < kWords; wi += kThreads) {
    uint32_t v[2];
    SplitPairs(__ldg(vw + wi), v);
    const int lane = (wi / 4) % 32, slot = (wi / 128) * 4 + wi % 4;
    const int g = lane / 4, t = lane % 4;
    const int half_tile = slot / (D / 64);  // 2 ks + token_half
    const int tok0 = (half_tile / 2) * 16 + (half_tile % 2) * 8 + 2 * t;
    const int u0 = 8 * (slot % (D / 64));
    const uint2 t0 = table[1][tok0], t1 = table[1][tok0 + 1];
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      const uint32_t sel = HalfSelector(v, p);
      const uint32_t lo = Prmt(t0.x, t0.y, sel), hi = Prmt(t1.x, t1.y, sel);
      const int u = u0 + p, c = 16 * (u / 2) + 8 * (u % 2) + g;
      *reinterpret_cast<uint32_t*>(&s.vt[c][tok0]) = (lo & 0xffffu) | (hi & 0xffff0000u);
    }
  }
}

// INT2 blocks -> fp16 tiles, value = offset + scale · level[code] in fp32 as DecodeInt2Block,
// one element at a time: for groups smaller than a head (several scales per token).
template <int D>
__device__ void StageInt2(Tile<D>& s, const uint8_t* kblock, const uint8_t* vblock, int valid,
                          int group_size, const Int2Levels& levels) {
  const int groups = D / group_size;
  const uint8_t* kparams = kblock + kPage * (D / 4);
  const uint8_t* vparams = vblock + kPage * (D / 4);
  for (int i = threadIdx.x; i < kPage * D; i += kThreads) {
    const int tok = i / D, c = i % D;
    float kv = 0.0f, vv = 0.0f;
    if (tok < valid) {
      const int kb = tok * (D / 4) * 8 + KCodeBit(c, D);
      const int vb = VCodeBit(tok, c, D);
      const int kc = (kblock[kb / 8] >> (kb % 8)) & 3;
      const int vc = (vblock[vb / 8] >> (vb % 8)) & 3;
      const uint8_t* kp = kparams + (tok * groups + c / group_size) * 4;
      const uint8_t* vp = vparams + (tok * groups + c / group_size) * 4;
      kv = Fp16ToFloat(static_cast<uint16_t>(kp[2] | kp[3] << 8)) +
           Fp16ToFloat(static_cast<uint16_t>(kp[0] | kp[1] << 8)) * Level(levels, kc);
      vv = Fp16ToFloat(static_cast<uint16_t>(vp[2] | vp[3] << 8)) +
           Fp16ToFloat(static_cast<uint16_t>(vp[0] | vp[1] << 8)) * Level(levels, vc);
    }
    s.k[tok][c] = __float2half_rn(kv);
    s.vt[c][tok] = __float2half_rn(vv);
  }
}

// Codec blocks -> fp16 tiles, the values DecodeCodecBlock computes (fp32) rounded once.
template <int D>
__device__ void StageCodec(Tile<D>& s, const uint8_t* kblock, const uint8_t* vblock, int valid,
                           const CodecLayerLayout& layout, const float (*levels)[16],
                           const float* scales) {
  for (int i = threadIdx.x; i < kPage * D / 8; i += kThreads) {
    const int tok = i / (D / 8), c0 = (i % (D / 8)) * 8;
    float k[8] = {}, v[8] = {};
    if (tok < valid) {
      codec::DecodeEight(kblock, layout.side[0], tok, c0, levels, scales, k);
      codec::DecodeEight(vblock, layout.side[1], tok, c0, levels, scales, v);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s.k[tok][c0 + j] = __float2half_rn(k[j]);
      s.vt[c0 + j][tok] = __float2half_rn(v[j]);
    }
  }
}

// One lane's share of one step of a fragment block of side Kind (0 = K, 1 = V) of `Bits` bits
// into the tile: its 8 groups x 2 pairs x 2 elements, each value scale · level as
// DecodeCodecFragmentBlock computes it, rounded once to fp16; tokens at or past `valid` zero.
template <int D, int Kind, int Bits>
__device__ __forceinline__ void StageFragmentLane(Tile<D>& s, const uint8_t* block,
                                                  const CodecSideLayout& side, int region,
                                                  const uint8_t* part, int step, int lane,
                                                  int valid, const float* levels,
                                                  const float* scales) {
  constexpr int kLowWidth = Bits == 3 ? 2 : Bits;  // b = 3: bits 0-1, then bit 2 256 bytes on
  uint32_t lo[4] = {}, hi[4] = {};
  codec::LoadFragmentLane<kLowWidth>(part, lane, lo);
  if constexpr (Bits == 3) codec::LoadFragmentLane<1>(part + 256, lane, hi);
  const float ratio = scales[block[side.ratios + region]];
#pragma unroll
  for (int group = 0; group < 8; ++group) {
#pragma unroll
    for (int second = 0; second < 2; ++second) {
      float v[2];
      int token[2];
#pragma unroll
      for (int elem = 0; elem < 2; ++elem) {
        uint32_t code = CodecFragmentLaneField<kLowWidth>(lo, group, second, elem);
        if constexpr (Bits == 3) code |= CodecFragmentLaneField<1>(hi, group, second, elem) << 2;
        token[elem] = CodecFragmentLaneToken(Kind, lane, group, second, elem);
        v[elem] = token[elem] < valid
                      ? codec::RegionScale(scales[block[side.row_scales + token[elem]]], ratio) *
                            levels[code]
                      : 0.0f;
      }
      // Elements 0 and 1 are neighbours: channels of one token (K), tokens of one channel (V).
      const int channel = CodecFragmentLaneChannel(Kind, lane, group, second, 0);
      const __half2 pair = __floats2half2_rn(v[0], v[1]);
      if constexpr (Kind == 0) {
        *reinterpret_cast<__half2*>(&s.k[token[0]][16 * step + channel]) = pair;
      } else {
        *reinterpret_cast<__half2*>(&s.vt[16 * step + channel][token[0]]) = pair;
      }
    }
  }
}

// The same for a step of any bits; a dropped region's (0) values are zeros.
template <int D, int Kind>
__device__ __forceinline__ void StageFragmentLaneOf(int bits, Tile<D>& s, const uint8_t* block,
                                                    const CodecSideLayout& side, int region,
                                                    const uint8_t* part, int step, int lane,
                                                    int valid, const float* levels,
                                                    const float* scales) {
  switch (bits) {
    case 1:
      return StageFragmentLane<D, Kind, 1>(s, block, side, region, part, step, lane, valid, levels,
                                           scales);
    case 2:
      return StageFragmentLane<D, Kind, 2>(s, block, side, region, part, step, lane, valid, levels,
                                           scales);
    case 3:
      return StageFragmentLane<D, Kind, 3>(s, block, side, region, part, step, lane, valid, levels,
                                           scales);
    case 4:
      return StageFragmentLane<D, Kind, 4>(s, block, side, region, part, step, lane, valid, levels,
                                           scales);
    default:
      for (int group = 0; group < 8; ++group) {
        for (int second = 0; second < 2; ++second) {
          const int token = CodecFragmentLaneToken(Kind, lane, group, second, 0);
          const int channel = 16 * step + CodecFragmentLaneChannel(Kind, lane, group, second, 0);
          __half2* pair =
              reinterpret_cast<__half2*>(Kind == 0 ? &s.k[token][channel] : &s.vt[channel][token]);
          *pair = __floats2half2_rn(0.0f, 0.0f);
        }
      }
  }
}

// Codec fragment blocks -> fp16 tiles, the values DecodeCodecFragmentBlock computes, rounded once.
// A thread takes one lane of one step of one side at a time: a warp reads a part's words as the
// split decode does, each thread decodes its lane's 32 codes from them. Not inlined: inlined, the
// staging took the kernel from 217 to 229 registers for every format; called, the other formats'
// paths keep theirs (214) and only this one saves registers.
template <int D>
__device__ __noinline__ void StageCodecFragment(Tile<D>& s, const uint8_t* kblock,
                                                const uint8_t* vblock, int valid,
                                                const CodecLayerLayout& layout,
                                                const float (*levels)[16], const float* scales) {
  constexpr int kSteps = D / 16;
  for (int u = threadIdx.x; u < 2 * kSteps * 32; u += kThreads) {
    const int kind = u / (kSteps * 32), step = u / 32 % kSteps, lane = u % 32;  // warp-uniform
    const CodecSideLayout& side = layout.side[kind];
    const uint8_t* block = kind == 0 ? kblock : vblock;
    int index = 0;
    const int region = codec::RegionOf(side, 16 * step, &index);
    const int bits = side.bits[region];
    const uint8_t* part = block + side.codes[region] + index / 16 * 128 * bits;
    const float* l = levels[bits];
    if (kind == 0) {
      StageFragmentLaneOf<D, 0>(bits, s, block, side, region, part, step, lane, valid, l, scales);
    } else {
      StageFragmentLaneOf<D, 1>(bits, s, block, side, region, part, step, lane, valid, l, scales);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads) ChunkAttentionKernel(ChunkAttentionParams p) {
  const int item = blockIdx.z, head = blockIdx.y, tile = blockIdx.x;
  const int len = p.len[item];
  if (tile * kTileQ >= len) return;
  const KvGeometry& geo = p.geometry;
  const int pos0 = p.pos0[item];
  const int tq0 = pos0 + tile * kTileQ;
  const int tq1 = min(pos0 + len, tq0 + kTileQ);
  const int seq_end = pos0 + len;  // tokens in the cache for this layer
  const int group = p.num_q_heads / geo.num_kv_heads;
  const int kvh = head / group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t = lane & 3;
  const int row_pos[2] = {tq0 + warp * 16 + g, tq0 + warp * 16 + g + 8};
  const float scale2 = p.sm_scale * kLog2e;

  __shared__ Tile<D> s;
  __shared__ uint2 s_table[2][kPage];  // StageInt2PerToken's values per (K|V, token)
  __shared__ float s_levels[5][16];    // the codec's tables (codec::LoadTables)
  __shared__ float s_scales[256];
  const bool codec_history = p.int2_encoding == PageEncoding::kCodec;
  const bool fragment_history = p.int2_encoding == PageEncoding::kCodecFragment;
  if (codec_history || fragment_history) {  // read after the loop's barrier
    codec::LoadTables(s_levels, s_scales);
    // Fragment blocks code uniform levels: each thread rewrites the entries it loaded.
    for (int i = threadIdx.x; i < 5 * 16 && fragment_history; i += blockDim.x) {
      s_levels[i / 16][i % 16] = p.fragment_levels[i / 16][i % 16];
    }
  }

  // Q fragments (A operand, 16 rows x D), scaled so scores come out in the log2 domain.
  uint32_t qa[D / 16][4];
  {
    const float* qrow[2];
    for (int r = 0; r < 2; ++r) {
      qrow[r] =
          row_pos[r] < tq1
              ? p.q + (int64_t{p.q_offset[item] + row_pos[r] - pos0} * p.num_q_heads + head) * D
              : nullptr;
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      float2 v[2][2];
      for (int r = 0; r < 2; ++r) {
        for (int hi = 0; hi < 2; ++hi) {
          v[r][hi] = qrow[r] ? *reinterpret_cast<const float2*>(qrow[r] + ks * 16 + hi * 8 + 2 * t)
                             : make_float2(0.0f, 0.0f);
        }
      }
      qa[ks][0] = PackHalf2(v[0][0].x * scale2, v[0][0].y * scale2);
      qa[ks][1] = PackHalf2(v[1][0].x * scale2, v[1][0].y * scale2);
      qa[ks][2] = PackHalf2(v[0][1].x * scale2, v[0][1].y * scale2);
      qa[ks][3] = PackHalf2(v[1][1].x * scale2, v[1][1].y * scale2);
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  const Int2Levels levels = LevelsFor(p.int2_encoding);
  const int pbase = p.page_indptr[item];
  const int last_page = (tq1 - 1) / kPage;
  for (int page = 0; page <= last_page; ++page) {
    const int ptok0 = page * kPage;
    const int64_t first_int2 = p.split && page >= p.sink_pages
                                   ? int64_t{page + 1} * kPage + p.recent_tokens - 1
                                   : INT64_MAX;
    for (int version = 0; version < 2; ++version) {
      // The queries of this tile that see the page in this version: [lo, hi).
      int64_t lo = max(tq0, ptok0), hi = tq1;
      if (version == 0) {
        if (first_int2 < hi) hi = first_int2;
      } else {
        if (first_int2 > lo) lo = first_int2;
      }
      if (lo >= hi) continue;
      const int32_t slot = version == 0 ? p.bf16_slot[pbase + page] : p.int2_slot[pbase + page];
      if (slot < 0) continue;  // the host provides every copy a query needs
      const int valid = min(kPage, seq_end - ptok0);
      __syncthreads();
      if (version == 0) {
        const uint8_t* base = p.bf16_pool + int64_t{slot} * p.bf16_stride;
        StageBf16<D>(s, base + BlockOffset(geo, PageEncoding::kBf16, p.layer, 0, kvh),
                     base + BlockOffset(geo, PageEncoding::kBf16, p.layer, 1, kvh), valid);
      } else {
        const uint8_t* base = p.int2_pool + int64_t{slot} * p.int2_stride;
        const uint8_t* kblock = base + BlockOffset(geo, p.int2_encoding, p.layer, 0, kvh);
        const uint8_t* vblock = base + BlockOffset(geo, p.int2_encoding, p.layer, 1, kvh);
        if (fragment_history) {
          StageCodecFragment<D>(
              s, base + p.codec.side[0].block0 + int64_t{kvh} * p.codec.side[0].block_bytes,
              base + p.codec.side[1].block0 + int64_t{kvh} * p.codec.side[1].block_bytes, valid,
              p.codec, s_levels, s_scales);
        } else if (codec_history) {
          StageCodec<D>(s,
                        base + p.codec.side[0].block0 + int64_t{kvh} * p.codec.side[0].block_bytes,
                        base + p.codec.side[1].block0 + int64_t{kvh} * p.codec.side[1].block_bytes,
                        valid, p.codec, s_levels, s_scales);
        } else if (geo.group_size == D) {
          StageInt2PerToken<D>(s, s_table, kblock, vblock, valid, levels);
        } else {
          StageInt2<D>(s, kblock, vblock, valid, geo.group_size, levels);
        }
      }
      __syncthreads();
      const int w0 = tq0 + warp * 16;
      if (w0 + 16 <= lo || w0 >= hi) continue;  // none of this warp's rows

      // S = Q Kᵀ, 16 rows x 64 tokens.
      float sc[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&s.k[8 * j + g][16 * ks + 2 * t]);
          const uint32_t b1 =
              *reinterpret_cast<const uint32_t*>(&s.k[8 * j + g][16 * ks + 8 + 2 * t]);
          Mma(sc[j], qa[ks], b0, b1);
        }
      }
      // Mask: the row must use this version, and see the token (causal).
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_pos[e / 2];
          const int tok = ptok0 + 8 * j + 2 * t + (e & 1);
          if (row < lo || row >= hi || tok > row) sc[j][e] = -INFINITY;
        }
      }
      // Online softmax per row (the quad of 4 threads shares a row).
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * r], sc[j][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[r], mx);
        const float corr = m_new == -INFINITY ? 1.0f : exp2f(m[r] - m_new);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const float pv = m_new == -INFINITY ? 0.0f : exp2f(sc[j][e] - m_new);
            sc[j][e] = pv;
            sum += pv;
          }
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        l[r] = l[r] * corr + sum;
        m[r] = m_new;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          o[dt][2 * r] *= corr;
          o[dt][2 * r + 1] *= corr;
        }
      }
      // O += P V: P from the score fragments (C layout -> A layout), V from Vᵀ.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const uint32_t a[4] = {PackHalf2(sc[2 * kk][0], sc[2 * kk][1]),
                               PackHalf2(sc[2 * kk][2], sc[2 * kk][3]),
                               PackHalf2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               PackHalf2(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const uint32_t b0 =
              *reinterpret_cast<const uint32_t*>(&s.vt[8 * dt + g][16 * kk + 2 * t]);
          const uint32_t b1 =
              *reinterpret_cast<const uint32_t*>(&s.vt[8 * dt + g][16 * kk + 8 + 2 * t]);
          Mma(o[dt], a, b0, b1);
        }
      }
    }
  }
  for (int r = 0; r < 2; ++r) {
    if (row_pos[r] >= tq1) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    float* dst = p.out + (int64_t{p.q_offset[item] + row_pos[r] - pos0} * p.num_q_heads + head) * D;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      *reinterpret_cast<float2*>(dst + 8 * dt + 2 * t) =
          make_float2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
  }
}

}  // namespace

cudaError_t LaunchChunkAttention(const ChunkAttentionParams& p, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  if (p.num_items <= 0 || p.max_len <= 0) return cudaSuccess;
  if (g.page_tokens != kPage || g.num_kv_heads <= 0 || p.num_q_heads % g.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const bool codec_history = IsCodec(p.int2_encoding);
  if (p.split && (p.int2_pool == nullptr ||
                  (codec_history ? !codec::GpuLayoutOk(p.codec, g.head_dim, 1 << 20)
                                 : g.group_size <= 0 || g.head_dim % g.group_size != 0))) {
    return cudaErrorInvalidValue;
  }
  if (p.split && p.int2_encoding == PageEncoding::kCodecFragment &&
      !CodecFragmentLayoutOk(p.codec)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>((p.max_len + kTileQ - 1) / kTileQ),
                  static_cast<unsigned>(p.num_q_heads), static_cast<unsigned>(p.num_items));
  switch (g.head_dim) {
    case 64:
      ChunkAttentionKernel<64><<<grid, kThreads, 0, stream>>>(p);
      break;
    case 128:
      ChunkAttentionKernel<128><<<grid, kThreads, 0, stream>>>(p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace kvstrata::kernels
