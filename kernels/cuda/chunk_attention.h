#pragma once

// Prefill attention over the split cache on the GPU: chunks of query positions of several
// sequences, each query seeing its sequence's KV with the split semantics of docs/kv-format.md
// (the sink in BF16, the pages its recent window has left in INT2 — or in the codec format's
// history codec — the rest in BF16; causal).
// Inside a chunk a page can be BF16 for the early queries and INT2 for the later ones: the
// kernel runs the page twice, once per copy, each with the complementary range of queries, and
// one online softmax merges everything. CPU reference: engine ChunkAttention (attention.h),
// which this kernel follows to rounding (fp16 operands on tensor cores, fp32 accumulation).
//
// Also the BF16 format's attention for decode tokens (an item of one query).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

struct ChunkAttentionParams {
  const float* q = nullptr;  // [tokens][num_q_heads][head_dim], rotated by R_K
  float* out = nullptr;      // [tokens][num_q_heads][head_dim], rotated value space
  int num_q_heads = 0;       // num_kv_heads * G
  int layer = 0;
  float sm_scale = 0.0f;
  KvGeometry geometry;  // page_tokens 64; INT2 pages: group_size divides head_dim

  // Items: item i's queries are rows [q_offset[i], q_offset[i] + len[i]) of q and out, at
  // positions pos0[i] .. pos0[i] + len[i] - 1 of its sequence, whose KV (that chunk included)
  // is in the pages slots [page_indptr[i], page_indptr[i + 1]) of bf16_slot and int2_slot
  // (page order; -1 where the page has no such copy). All device arrays of num_items.
  int num_items = 0;
  int max_len = 0;  // the largest len[i] (sizes the grid)
  const int32_t* q_offset = nullptr;
  const int32_t* len = nullptr;
  const int32_t* pos0 = nullptr;
  const int32_t* page_indptr = nullptr;
  const int32_t* bf16_slot = nullptr;
  const int32_t* int2_slot = nullptr;

  const uint8_t* bf16_pool = nullptr;
  int64_t bf16_stride = 0;
  const uint8_t* int2_pool = nullptr;  // null for the BF16 format
  int64_t int2_stride = 0;
  // or kCodec / kCodecFragment: the codec format's blocks
  PageEncoding int2_encoding = PageEncoding::kInt2Uniform;
  // kCodec: this layer's blocks (CodecLayerLayoutFor); kCodecFragment: CodecFragmentLayerLayoutFor
  CodecLayerLayout codec;
  // kCodecFragment: the uniform levels [bits][code] (CodecFragmentLevelTable)
  float fragment_levels[5][16] = {};

  // The split layout: sink pages are never INT2; page p (past the sink) is INT2 for queries at
  // positions >= (p + 1) * 64 + recent_tokens - 1. split = false: every page is BF16.
  bool split = true;
  int sink_pages = 1;
  int recent_tokens = 256;
};

// cudaErrorInvalidValue for head_dim other than 64/128, page_tokens other than 64, or a GQA
// group the head count does not divide.
cudaError_t LaunchChunkAttention(const ChunkAttentionParams& params, cudaStream_t stream);

}  // namespace kvstrata::kernels
