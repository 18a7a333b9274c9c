#pragma once

// Reading codec blocks (PageEncoding::kCodec; kernels/codec_page.h, docs/kv-format.md) in CUDA
// kernels: the decode side shared by split decode and chunk attention, and what the demotion
// kernel needs to encode them. Values are bit for bit DecodeCodecBlock's (fp32); callers round
// them to their tensor-core operand type. Include from .cu files.

#include <cstdint>

#include "kernels/codec_fragment.h"
#include "kernels/kv_layout.h"

namespace kvstrata::kernels::codec {

// The Gaussian Lloyd-Max centroids of 1..4 bits (kernels/history_codec.cc's), at
// [bits][code]. Kernels copy them to shared memory (LoadTables): codes index them per thread.
static __constant__ float kLevels[5][16] = {
    {},
    {-0.7979f, 0.7979f},
    {-1.5104f, -0.4528f, 0.4528f, 1.5104f},
    {-2.1520f, -1.3439f, -0.7560f, -0.2451f, 0.2451f, 0.7560f, 1.3439f, 2.1520f},
    {-2.7326f, -2.0690f, -1.6181f, -1.2562f, -0.9423f, -0.6568f, -0.3881f, -0.1284f, 0.1284f,
     0.3881f, 0.6568f, 0.9423f, 1.2562f, 1.6181f, 2.0690f, 2.7326f},
};

// LogScaleValue: 2^((code - 160) / 8) rounded from double to float, 0 for code 0.
__device__ __forceinline__ float LogScaleValue(int code) {
  return code == 0 ? 0.0f : static_cast<float>(exp2((code - 160) / 8.0));
}

// Every thread of the CTA: levels [5][16] (kLevels) and scales [256] (LogScaleValue of every
// code) into shared memory; the caller synchronises before reading them.
__device__ __forceinline__ void LoadTables(float (*levels)[16], float* scales) {
  for (int i = threadIdx.x; i < 5 * 16; i += blockDim.x) levels[i / 16][i % 16] = kLevels[i / 16][i % 16];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) scales[i] = LogScaleValue(i);
}

// One warp lane's `W` words of one part of a codec fragment step (kernels/codec_fragment.h):
// one vector load at 4·W·lane bytes into the part; CodecFragmentLaneField takes the codes out.
template <int W>
__device__ __forceinline__ void LoadFragmentLane(const uint8_t* part, int lane, uint32_t (&w)[4]) {
  if constexpr (W == 4) {
    const uint4 x = *reinterpret_cast<const uint4*>(part + 16 * lane);
    w[0] = x.x, w[1] = x.y, w[2] = x.z, w[3] = x.w;
  } else if constexpr (W == 2) {
    const uint2 x = *reinterpret_cast<const uint2*>(part + 8 * lane);
    w[0] = x.x, w[1] = x.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(part + 4 * lane);
  }
}

// CodecRegionScale from the two values.
__device__ __forceinline__ float RegionScale(float row_scale, float ratio) {
  return fmaxf(row_scale * ratio, 1e-30f);
}

// The region holding channel c (regions cover head_dim in order) and c's index inside it.
__device__ __forceinline__ int RegionOf(const CodecSideLayout& s, int c, int* index) {
  int c0 = 0;
  for (int k = 0; k < s.num_regions; ++k) {
    if (c < c0 + s.channels[k]) {
      *index = c - c0;
      return k;
    }
    c0 += s.channels[k];
  }
  *index = 0;
  return 0;
}

// The `bits` bytes of eight consecutive codes of a region row, starting at code `index` (a
// multiple of 8), as one little-endian word.
__device__ __forceinline__ uint32_t EightCodes(const uint8_t* row, int index, int bits) {
  const uint8_t* at = row + index / 8 * bits;
  uint32_t w = 0;
  for (int i = 0; i < bits; ++i) w |= uint32_t{at[i]} << (8 * i);
  return w;
}

// Channels c0 .. c0 + 7 of token t of a block (c0 a multiple of 8, inside one region: the
// regions' channel counts are multiples of 8 on the GPU), as fp32 values; levels and scales are
// LoadTables'.
__device__ __forceinline__ void DecodeEight(const uint8_t* block, const CodecSideLayout& s, int t,
                                            int c0, const float (*levels)[16],
                                            const float* scales, float (&out)[8]) {
  int index = 0;
  const int k = RegionOf(s, c0, &index);
  const int bits = s.bits[k];
  if (bits == 0) {
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = 0.0f;
    return;
  }
  const float scale = RegionScale(scales[block[s.row_scales + t]], scales[block[s.ratios + k]]);
  const uint32_t w = EightCodes(block + s.codes[k] + t * (s.channels[k] * bits / 8), index, bits);
  const uint32_t mask = (1u << bits) - 1;
  const float* l = levels[bits];
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = scale * l[(w >> (j * bits)) & mask];
}

// Where a region's pair table (4^bits pairs) starts in its side's tables, the tables before it
// ending at `end`: at the next multiple of its own size, so that an entry's index within the
// side's tables is the table's first index ORed with the entry's.
__host__ __device__ __forceinline__ int AlignedTableFirst(int end, int bits) {
  const int size = 1 << (2 * bits);
  return (end + size - 1) & -size;
}

// The pairs a side's tables take, in region order, each aligned as AlignedTableFirst places it.
inline int CodecTablePairs(const CodecSideLayout& s) {
  int end = 0;
  for (int k = 0; k < s.num_regions; ++k) {
    if (s.bits[k] > 0) end = AlignedTableFirst(end, s.bits[k]) + (1 << (2 * s.bits[k]));
  }
  return end;
}

// Whether the GPU kernels take a layout: every region's channels a multiple of 8 (a decoded
// chunk of eight channels lies in one region), bits 0..4, the regions covering head_dim, each
// side's block within max_block_bytes, and its regions' pair tables (4^bits entries each, each
// aligned to its size: CodecTablePairs) within max_table_pairs.
inline bool GpuLayoutOk(const CodecLayerLayout& l, int head_dim, int max_block_bytes,
                        int max_table_pairs = 1 << 30) {
  for (const CodecSideLayout& s : l.side) {
    if (s.num_regions < 1 || s.num_regions > kMaxCodecRegions || s.block_bytes <= 0 ||
        s.block_bytes > max_block_bytes || s.block_bytes % 16 != 0 || s.block0 % 16 != 0) {
      return false;
    }
    int channels = 0;
    for (int k = 0; k < s.num_regions; ++k) {
      if (s.channels[k] % 8 != 0 || s.bits[k] > 4) return false;
      channels += s.channels[k];
    }
    if (channels != head_dim || CodecTablePairs(s) > max_table_pairs) return false;
  }
  return true;
}

}  // namespace kvstrata::kernels::codec
