#include <cuda_bf16.h>

#include <cmath>

#include "kernels/codec_fragment.h"
#include "kernels/cuda/append.h"
#include "kernels/cuda/codec_block.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ptx.cuh"
#include "kernels/dispatch.h"

namespace kvstrata::kernels {

namespace {

// One CTA per (layer, KV head, K|V), one thread per output channel: the rotation matrix is
// read once per launch and applied to every new token of the batch.
constexpr int kAppendTokenTile = 8;

template <int D>
__global__ void AppendKernel(AppendParams p) {
  ptx::GridDependencyWait();  // launched early (overlap_previous): the rows are the kernel before's
  ptx::LaunchDependents();
  const int layer = blockIdx.x, h = blockIdx.y, kind = blockIdx.z;
  const KvGeometry& g = p.geometry;
  const int heads = g.num_kv_heads;
  const int j = threadIdx.x;
  const uint16_t* src = kind == 0 ? p.k : p.v;
  const float* R = kind == 0 ? p.k_rotation : p.v_rotation;
  if (R) R += (int64_t{layer} * heads + h) * D * D;
  __shared__ float x[kAppendTokenTile][D];
  for (int t0 = 0; t0 < p.num_tokens; t0 += kAppendTokenTile) {
    const int n = min(kAppendTokenTile, p.num_tokens - t0);
    __syncthreads();
    const float* src32 = kind == 0 ? p.k_f32 : p.v_f32;
    for (int t = 0; t < n; ++t) {
      const int64_t i = ((int64_t{layer} * p.num_tokens + t0 + t) * heads + h) * D + j;
      x[t][j] = src32 ? src32[i] : Bf16ToFloat(src[i]);
    }
    __syncthreads();
    float y[kAppendTokenTile];
#pragma unroll
    for (int t = 0; t < kAppendTokenTile; ++t) y[t] = 0.0f;
    if (R) {
      for (int k = 0; k < D; ++k) {
        const float r = __ldg(R + int64_t{k} * D + j);
#pragma unroll
        for (int t = 0; t < kAppendTokenTile; ++t) y[t] = fmaf(x[t][k], r, y[t]);
      }
    } else {
#pragma unroll
      for (int t = 0; t < kAppendTokenTile; ++t) y[t] = x[t][j];
    }
#pragma unroll
    for (int t = 0; t < kAppendTokenTile; ++t) {
      if (t >= n) break;
      uint8_t* block = p.bf16_pool + int64_t{p.slot[t0 + t]} * p.slot_stride +
                       BlockOffset(g, PageEncoding::kBf16, layer, kind, h);
      reinterpret_cast<uint16_t*>(block)[p.row[t0 + t] * D + j] = FloatToBf16(y[t]);
    }
  }
}

// One CTA per (page, block): 64 threads, one token row each, as EncodeInt2Block.
template <int D>
__global__ void DemoteKernel(DemoteParams p) {
  ptx::GridDependencyWait();  // launched early (overlap_previous): the pages are written before
  ptx::LaunchDependents();
  const KvGeometry& g = p.geometry;
  const int64_t blocks = NumBlocks(g);
  const int page = static_cast<int>(blockIdx.x / blocks);
  if (p.num_pages_device != nullptr && page >= *p.num_pages_device) return;
  const int64_t blk = blockIdx.x % blocks;
  const int layer = static_cast<int>(blk / (2 * g.num_kv_heads));
  const int kind = static_cast<int>((blk / g.num_kv_heads) % 2);
  const int head = static_cast<int>(blk % g.num_kv_heads);
  const uint8_t* src = p.bf16_pool + int64_t{p.src_slot[page]} * p.bf16_stride + kPageHeaderBytes +
                       blk * BlockBytes(g, PageEncoding::kBf16);
  uint8_t* dst = p.int2_pool + int64_t{p.dst_slot[page]} * p.int2_stride + kPageHeaderBytes +
                 blk * BlockBytes(g, PageEncoding::kInt2Uniform);
  __shared__ float x[64][D + 1];
  __shared__ uint32_t packed[64 * D / 16];
  const int t = threadIdx.x;
  for (int i = t; i < 64 * D / 16; i += 64) packed[i] = 0;
  for (int i = 0; i < D; ++i)
    x[t][i] = Bf16ToFloat(reinterpret_cast<const uint16_t*>(src)[t * D + i]);
  __syncthreads();
  const float ratio = p.clip ? p.clip[(layer * 2 + kind) * g.num_kv_heads + head] : 1.0f;
  // Order statistic: the element of |x| at index k in ascending order. Clip ratios sit near 1,
  // so drop the D-1-k largest one at a time (or, below the middle, the k smallest).
  const int k = min(D - 1, static_cast<int>(floor(static_cast<double>(ratio) * D)));
  __shared__ uint32_t dropped[64][D / 32];
  for (int w = 0; w < D / 32; ++w) dropped[t][w] = 0;
  auto is_dropped = [&](int i) { return (dropped[t][i / 32] >> (i % 32)) & 1u; };
  const bool from_top = k >= D / 2;
  const int drops = from_top ? D - 1 - k : k;
  for (int r = 0; r < drops; ++r) {
    int best = -1;
    float best_a = 0.0f;
    for (int i = 0; i < D; ++i) {
      if (is_dropped(i)) continue;
      const float a = fabsf(x[t][i]);
      if (best < 0 || (from_top ? a > best_a : a < best_a)) best = i, best_a = a;
    }
    dropped[t][best / 32] |= 1u << (best % 32);
  }
  float tau = from_top ? 0.0f : INFINITY;
  for (int i = 0; i < D; ++i) {
    if (is_dropped(i)) continue;
    tau = from_top ? fmaxf(tau, fabsf(x[t][i])) : fminf(tau, fabsf(x[t][i]));
  }
  float lo = tau, hi = -tau;
  for (int i = 0; i < D; ++i) {
    const float c = fminf(fmaxf(x[t][i], -tau), tau);
    lo = fminf(lo, c);
    hi = fmaxf(hi, c);
  }
  const uint16_t m16 = FloatToFp16Saturate(lo);
  const uint16_t s16 = FloatToFp16Saturate((hi - lo) / 3.0f);
  const float m = Fp16ToFloat(m16), s = Fp16ToFloat(s16);
  for (int i = 0; i < D; ++i) {
    const float c = fminf(fmaxf(x[t][i], -tau), tau);
    int q = 0;
    if (s > 0.0f) q = static_cast<int>(floorf(__fdiv_rn(c - m, s) + 0.5f));
    q = min(max(q, 0), 3);
    const int bit = kind == 0 ? t * (D / 4) * 8 + KCodeBit(i, D) : VCodeBit(t, i, D);
    atomicOr(&packed[bit / 32], static_cast<uint32_t>(q) << (bit % 32));
  }
  // params: [64][1][2] fp16 {scale, offset} after the codes
  reinterpret_cast<uint32_t*>(dst + 64 * D / 4)[t] =
      static_cast<uint32_t>(s16) | static_cast<uint32_t>(m16) << 16;
  __syncthreads();
  for (int i = t; i < 64 * D / 16; i += 64) reinterpret_cast<uint32_t*>(dst)[i] = packed[i];
}

// The most bytes one codec block takes (codes of at most 4 bits, each region padded to 16, the
// row scales, the ratios and the padding), as kernels/cuda/split_decode_codec.cuh reads them.
template <int D>
constexpr int kCodecBlockMaxBytes = 64 * D / 2 + 16 * kMaxCodecRegions + 64 + 32;

// Token t's codes into a codec fragment block (kernels/codec_fragment.h) in shared memory, as
// EncodeCodecFragmentBlock places them: per step of 16 channels, per part of the code (b = 3:
// the low two bits, then the high bit), one field at CodecFragmentFieldBit. The fields of
// different tokens share words, hence the atomic or.
template <int D>
__device__ void DemoteFragmentCodes(const CodecSideLayout& side, int kind,
                                    const float (*levels)[16], const float* scales,
                                    const float* x, int t, uint8_t* block) {
  uint32_t* words = reinterpret_cast<uint32_t*>(block);
  int c0 = 0, at = 0;  // the step's first channel and byte
  for (int k = 0; k < side.num_regions; ++k) {
    const int bits = side.bits[k];
    const int count = 1 << bits;
    const float s = codec::RegionScale(scales[block[side.row_scales + t]],
                                       scales[block[side.ratios + k]]);
    const float half_s = __fmul_rn(0.5f, s);
    for (int step = 0; step < side.channels[k] / 16; ++step, c0 += 16) {
      if (bits == 0) continue;
      for (int c = 0; c < 16; ++c) {
        const float v = x[c0 + c];
        int code = 0;
        while (code + 1 < count &&
               v > __fmul_rn(half_s, __fadd_rn(levels[bits][code], levels[bits][code + 1]))) {
          ++code;
        }
        // b = 1, 2, 4: one part; b = 3: bits 0-1 (width 2), then bit 2 (width 1) 256 bytes on.
        const int low_width = bits == 3 ? 2 : bits;
        const int64_t low = int64_t{at} * 8 + CodecFragmentFieldBit(kind, low_width, t, c);
        atomicOr(&words[low / 32],
                 static_cast<uint32_t>(code & ((1 << low_width) - 1)) << (low % 32));
        if (bits == 3) {
          const int64_t high = int64_t{at + 256} * 8 + CodecFragmentFieldBit(kind, 1, t, c);
          atomicOr(&words[high / 32], static_cast<uint32_t>(code >> 2) << (high % 32));
        }
      }
      at += 128 * bits;  // a dropped region's steps store nothing
    }
  }
}

// One CTA per (page, K|V, KV head) of one layer; 64 threads, one token row each. Every step in
// EncodeCodecBlock's order and arithmetic: the per-region sums in double, the page's region
// energies summed over rows in row order, codes by counting the level midpoints below a value.
template <int D>
__global__ void DemoteCodecKernel(DemoteCodecParams p) {
  ptx::GridDependencyWait();  // launched early (overlap_previous): the pages are written before
  ptx::LaunchDependents();
  const KvGeometry& g = p.geometry;
  const int heads = g.num_kv_heads;
  const int page = static_cast<int>(blockIdx.x / (2 * heads));
  if (p.num_pages_device != nullptr && page >= *p.num_pages_device) return;
  const int kind = static_cast<int>(blockIdx.x / heads) % 2;
  const int head = static_cast<int>(blockIdx.x % heads);
  const CodecSideLayout& side = p.codec.side[kind];
  const uint8_t* src = p.bf16_pool + int64_t{p.src_slot[page]} * p.bf16_stride + kPageHeaderBytes +
                       (int64_t{kind} * heads + head) * BlockBytes(g, PageEncoding::kBf16);
  uint8_t* dst = p.history_pool + int64_t{p.dst_slot[page]} * p.history_stride + side.block0 +
                 int64_t{head} * side.block_bytes;
  __shared__ float x[64][D + 1];
  __shared__ double energy[64][kMaxCodecRegions];  // per row: the region's Σx² / channels
  __shared__ double row_energy[64];                 // per row: Σx² / D
  __shared__ __align__(16) uint8_t block[kCodecBlockMaxBytes<D>];
  __shared__ float s_levels[5][16];
  __shared__ float s_scales[256];
  codec::LoadTables(s_levels, s_scales);
  __syncthreads();  // the fragment blocks' levels replace the Lloyd-Max ones
  if (p.fragment) {
    for (int i = threadIdx.x; i < 5 * 16; i += blockDim.x) {
      s_levels[i / 16][i % 16] = p.fragment_levels[i / 16][i % 16];
    }
  }
  const int t = threadIdx.x;
  for (int i = t; i < side.block_bytes / 16; i += 64) {
    reinterpret_cast<uint4*>(block)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  for (int i = 0; i < D; ++i) x[t][i] = Bf16ToFloat(reinterpret_cast<const uint16_t*>(src)[t * D + i]);
  double row_sq = 0.0;
  {
    int c0 = 0;
    for (int k = 0; k < side.num_regions; ++k) {
      double sq = 0.0;
      for (int i = 0; i < side.channels[k]; ++i) {
        const double v = x[t][c0 + i];
        sq = __dadd_rn(sq, __dmul_rn(v, v));  // no fused multiply-add: as the CPU computes it
      }
      row_sq += sq;
      energy[t][k] = sq / side.channels[k];
      c0 += side.channels[k];
    }
  }
  row_energy[t] = row_sq / D;
  __syncthreads();  // the zeroed block, the tables and every row's energies
  block[side.row_scales + t] = LogScaleCode(static_cast<float>(sqrt(row_sq / D)));
  if (t < side.num_regions) {
    double total = 0.0, e = 0.0;
    for (int r = 0; r < 64; ++r) {
      total += row_energy[r];
      e += energy[r][t];
    }
    block[side.ratios + t] = total > 0.0 ? LogScaleCode(static_cast<float>(sqrt(e / total))) : 0;
  }
  __syncthreads();  // the scale codes
  if (p.fragment) {
    DemoteFragmentCodes<D>(side, kind, s_levels, s_scales, x[t], t, block);
  }
  int c0 = 0;
  for (int k = 0; k < side.num_regions && !p.fragment; ++k) {
    const int bits = side.bits[k], channels = side.channels[k];
    if (bits > 0) {
      const float* levels = s_levels[bits];
      const int count = 1 << bits;
      const float s = codec::RegionScale(s_scales[block[side.row_scales + t]],
                                         s_scales[block[side.ratios + k]]);
      const float half_s = __fmul_rn(0.5f, s);
      uint8_t* out = block + side.codes[k] + t * (channels * bits / 8);
      for (int i0 = 0; i0 < channels; i0 += 8) {  // eight codes fill `bits` bytes
        uint32_t w = 0;
        for (int j = 0; j < 8; ++j) {
          const float v = x[t][c0 + i0 + j];
          int c = 0;
          while (c + 1 < count && v > __fmul_rn(half_s, __fadd_rn(levels[c], levels[c + 1]))) ++c;
          w |= static_cast<uint32_t>(c) << (j * bits);
        }
        for (int b = 0; b < bits; ++b) out[i0 / 8 * bits + b] = static_cast<uint8_t>(w >> (8 * b));
      }
    }
    c0 += channels;
  }
  __syncthreads();  // the whole block
  for (int i = t; i < side.block_bytes / 16; i += 64) {
    reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(block)[i];
  }
}

}  // namespace

void SetCodecFragmentLevels(DemoteCodecParams* p) {
  p->fragment = true;
  CodecFragmentLevelTable(p->fragment_levels);
}

cudaError_t DemoteCodecPages(const DemoteCodecParams& p, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  if (g.page_tokens != 64 || g.num_kv_heads <= 0 || (g.head_dim != 64 && g.head_dim != 128) ||
      !codec::GpuLayoutOk(p.codec, g.head_dim,
                          g.head_dim == 64 ? kCodecBlockMaxBytes<64> : kCodecBlockMaxBytes<128>)) {
    return cudaErrorInvalidValue;
  }
  if (p.fragment && !CodecFragmentLayoutOk(p.codec)) return cudaErrorInvalidValue;
  if (p.num_pages <= 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(p.num_pages * 2 * g.num_kv_heads);
  return KV_DISPATCH_HEAD_DIM(g.head_dim, D, {
    return LaunchKernel(p.overlap_previous, dim3(grid), dim3(64), 0, stream, DemoteCodecKernel<D>,
                        p);
  });
}

cudaError_t AppendRotatedRows(const AppendParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  const KvGeometry& g = p.geometry;
  return KV_DISPATCH_HEAD_DIM(g.head_dim, D, {
    return LaunchKernel(p.overlap_previous, dim3(g.num_layers, g.num_kv_heads, 2), dim3(D), 0,
                        stream, AppendKernel<D>, p);
  });
}

cudaError_t DemotePages(const DemoteParams& p, cudaStream_t stream) {
  const KvGeometry& g = p.geometry;
  if (g.group_size != g.head_dim || g.page_tokens != 64) return cudaErrorInvalidValue;
  if (p.num_pages <= 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(p.num_pages * NumBlocks(g));
  return KV_DISPATCH_HEAD_DIM(g.head_dim, D, {
    return LaunchKernel(p.overlap_previous, dim3(grid), dim3(64), 0, stream, DemoteKernel<D>, p);
  });
}

}  // namespace kvstrata::kernels
