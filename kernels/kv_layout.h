#pragma once

// The byte layout of a KV page and the page *view* shared by the CPU reference and the CUDA
// kernels. docs/kv-format.md is the normative description; this header is its code form.
//
// A page holds `page_tokens` consecutive tokens of one sequence for every layer and KV head,
// keys and values. It is a 64-byte header followed by blocks, one per (layer, K|V, kv head):
//
//   block index b = (layer * 2 + kind) * num_kv_heads + kv_head      kind: 0 = K, 1 = V
//   BF16 block  : bf16   [page_tokens][head_dim]
//   INT2 block  : uint8  codes  [page_tokens][head_dim / 4]
//                 fp16   params [page_tokens][head_dim / group_size][2]   {scale, offset}
//
// All multi-byte fields are little-endian. Block sizes are multiples of 128 bytes for the
// supported shapes, so every block starts 64-byte aligned when the page does.

#include <cstddef>
#include <cstdint>

#include "kernels/numeric.h"

namespace kvstrata::kernels {

inline constexpr int kPageHeaderBytes = 64;
inline constexpr uint32_t kPageMagic = 0x4750564bu;  // "KVPG" read as a little-endian u32
inline constexpr uint16_t kPageFormatVersion = 1;

// How the blocks of a page are encoded. Values are part of the on-wire format.
enum class PageEncoding : uint8_t {
  kBf16 = 1,          // sink and recent-window pages
  kInt2Uniform = 2,   // history: asymmetric min-max INT2, levels {0, 1, 2, 3}
  kInt2LloydMax = 3,  // history: mean/std INT2 with Gaussian Lloyd-Max levels
  // history: a history codec's packed regions (kernels/codec_page.h). Its blocks' sizes come
  // from the codec (per layer and K|V), which the rotation file carries and the namespace pins:
  // BlockBytes, BlockOffset and PageBytes below do not apply (engine/kv_cache.h lays it out).
  kCodec = 4,
  // history: a history codec with uniform levels, its codes laid out for the tensor cores'
  // fragments (kernels/codec_fragment.h). Sized by its codec as kCodec is. The CPU engine
  // writes and reads it, the CUDA split decode reads it; the CUDA engine does not serve it yet.
  kCodecFragment = 5,
};

// Shape of the KV cache of one model. Fixed per engine; every page of a namespace shares it.
struct KvGeometry {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // 64 or 128
  int group_size = 0;  // channels per (scale, offset) pair; divides head_dim, multiple of 16
  int page_tokens = 64;
};

KV_HOST_DEVICE bool IsInt2(PageEncoding e) {
  return e == PageEncoding::kInt2Uniform || e == PageEncoding::kInt2LloydMax;
}

// A history codec's page (kCodec or kCodecFragment): its blocks' sizes come from its codec.
KV_HOST_DEVICE bool IsCodec(PageEncoding e) {
  return e == PageEncoding::kCodec || e == PageEncoding::kCodecFragment;
}

KV_HOST_DEVICE int64_t Int2CodeBytesPerToken(const KvGeometry& g) { return g.head_dim / 4; }
KV_HOST_DEVICE int64_t Int2GroupsPerToken(const KvGeometry& g) { return g.head_dim / g.group_size; }

KV_HOST_DEVICE int64_t BlockBytes(const KvGeometry& g, PageEncoding e) {
  if (IsInt2(e)) {
    return int64_t{g.page_tokens} * (Int2CodeBytesPerToken(g) + Int2GroupsPerToken(g) * 4);
  }
  return int64_t{g.page_tokens} * g.head_dim * 2;
}

KV_HOST_DEVICE int64_t NumBlocks(const KvGeometry& g) {
  return int64_t{g.num_layers} * 2 * g.num_kv_heads;
}

KV_HOST_DEVICE int64_t PageBytes(const KvGeometry& g, PageEncoding e) {
  return kPageHeaderBytes + NumBlocks(g) * BlockBytes(g, e);
}

KV_HOST_DEVICE int64_t BlockOffset(const KvGeometry& g, PageEncoding e, int layer, int kind,
                                   int kv_head) {
  const int64_t b = (int64_t{layer} * 2 + kind) * g.num_kv_heads + kv_head;
  return kPageHeaderBytes + b * BlockBytes(g, e);
}

// The fixed 64-byte page header. Plain bytes so it can be memcpy'd from the wire.
struct PageHeader {
  uint32_t magic;     // kPageMagic
  uint16_t version;   // kPageFormatVersion
  uint8_t encoding;   // PageEncoding
  uint8_t reserved0;  // 0
  uint16_t page_tokens;
  uint16_t num_layers;
  uint16_t num_kv_heads;
  uint16_t head_dim;
  uint16_t group_size;     // 0 for BF16 pages
  uint16_t reserved1;      // 0
  uint32_t page_index;     // position of the page in its sequence (first token = index * tokens)
  uint64_t body_bytes;     // bytes after the header
  uint8_t key[16];         // radix hash of this page (docs/hashing.md)
  uint8_t parent_key[16];  // radix hash of the previous page, or the namespace key for page 0
};
static_assert(sizeof(PageHeader) == kPageHeaderBytes, "page header must be 64 bytes");
static_assert(offsetof(PageHeader, body_bytes) == 24, "page header layout");
static_assert(offsetof(PageHeader, key) == 32, "page header layout");

// Where each 2-bit code sits (docs/kv-format.md §4, "Code layout"). The layouts follow the
// register fragments of the tensor-core mma.m16n8k16 instruction, so the decode kernel turns
// a loaded 32-bit word into fp16 pairs with one logic op each and no shuffles:
//  * within a word, pair p (0..7) holds its two codes at bits 2p and 16 + 2p;
//  * K rows: channel c of a token lives in that token's row of head_dim/4 bytes;
//  * V blocks: codes are arranged per 64-token block so that one thread's words hold the codes
//    of consecutive token pairs (the mma reduces over tokens when it multiplies by V).
// Both functions return a bit index: byte = bit / 8 (little-endian words), shift = bit % 8.

// Bit of channel c (0 <= c < head_dim) within a K token row.
KV_HOST_DEVICE int KCodeBit(int c, int head_dim) {
  const int s = c / 16, r = c % 16;
  const int t = (r % 8) / 2, hi = r / 8, elem = r % 2;
  const int word = t * (head_dim / 64) + s / 4;
  const int pair = 2 * (s % 4) + hi;
  return word * 32 + 16 * elem + 2 * pair;
}

// Bit of (token, channel) within the code area of a V block of 64 tokens.
KV_HOST_DEVICE int VCodeBit(int token, int c, int head_dim) {
  const int ks = token / 16, rt = token % 16;
  const int t = (rt % 8) / 2, token_half = rt / 8, elem = rt % 2;
  const int mb = c / 16, rc = c % 16;
  const int g = rc % 8, row_half = rc / 8;
  const int u = 2 * mb + row_half;  // the thread's u-th channel, 0 .. head_dim/8 - 1
  const int slot = (ks * 2 + token_half) * (head_dim / 64) + u / 8;
  const int lane = 4 * g + t;
  const int word = ((slot / 4) * 32 + lane) * 4 + slot % 4;
  return word * 32 + 16 * elem + 2 * (u % 8);
}

// The codec blocks (PageEncoding::kCodec, kernels/codec_page.h) of one layer of a history page,
// as the CUDA kernels read and write them: plain data, filled on the host by CodecLayerLayoutFor.
// Regions are channel ranges of `channels` codes of `bits` bits (0: dropped), in order.
inline constexpr int kMaxCodecRegions = 16;
struct CodecSideLayout {
  int64_t block0 = 0;       // byte offset in the page of KV head 0's block (heads follow)
  int32_t block_bytes = 0;  // one KV head's block, padding included
  int32_t row_scales = 0;   // offset in a block of the page_tokens row-scale codes
  int32_t ratios = 0;       // offset in a block of the region-ratio codes
  int32_t num_regions = 0;
  int32_t codes[kMaxCodecRegions] = {};     // offset in a block of each region's codes
  uint8_t bits[kMaxCodecRegions] = {};      // 0..4
  uint8_t channels[kMaxCodecRegions] = {};  // <= head_dim (128)
};
struct CodecLayerLayout {
  CodecSideLayout side[2];  // K, V
};

// Reconstruction levels of the INT2 codes: x = offset + scale * levels[code].
struct Int2Levels {
  float v[4];
};
inline constexpr Int2Levels kUniformLevels = {{0.0f, 1.0f, 2.0f, 3.0f}};
// Centroids of the 4-level Lloyd-Max quantiser of a unit Gaussian.
inline constexpr Int2Levels kGaussianLloydMaxLevels = {{-1.5104f, -0.4528f, 0.4528f, 1.5104f}};

// Spelled out rather than returning the constants above so device code can call it.
KV_HOST_DEVICE Int2Levels LevelsFor(PageEncoding e) {
  if (e == PageEncoding::kInt2LloydMax) return Int2Levels{{-1.5104f, -0.4528f, 0.4528f, 1.5104f}};
  return Int2Levels{{0.0f, 1.0f, 2.0f, 3.0f}};
}

// One segment (sink, history or recent) of the KV cache of a batch of sequences, as pages in a
// pool. Sequence b owns pages indices[indptr[b] .. indptr[b+1]); all are full except the last,
// which holds last_page_len[b] tokens (1..page_tokens). A sequence with no pages in this segment
// has indptr[b] == indptr[b+1]. Pages of one segment share one encoding and one pool.
struct PagedSegmentView {
  const uint8_t* pool = nullptr;           // slot s starts at pool + s * slot_stride
  int64_t slot_stride = 0;                 // bytes; >= PageBytes(geometry, encoding)
  const int32_t* indptr = nullptr;         // [batch + 1]
  const int32_t* indices = nullptr;        // [indptr[batch]] pool slot ids
  const int32_t* last_page_len = nullptr;  // [batch]
  PageEncoding encoding = PageEncoding::kBf16;

  KV_HOST_DEVICE int num_pages(int b) const { return indptr[b + 1] - indptr[b]; }
  KV_HOST_DEVICE int num_tokens(int b, int page_tokens) const {
    const int n = num_pages(b);
    return n == 0 ? 0 : (n - 1) * page_tokens + last_page_len[b];
  }
  KV_HOST_DEVICE const uint8_t* block(const KvGeometry& g, int b, int page, int layer, int kind,
                                      int kv_head) const {
    const int64_t slot = indices[indptr[b] + page];
    return pool + slot * slot_stride + BlockOffset(g, encoding, layer, kind, kv_head);
  }
};

}  // namespace kvstrata::kernels
