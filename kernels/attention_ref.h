#pragma once

// Split decode attention, CPU reference: the specification the CUDA kernels are tested
// against. Each query attends to three segments of its sequence's KV cache —
//   sink    : the first tokens, BF16 pages
//   history : INT2 pages
//   recent  : the last >= recent_tokens tokens, BF16 pages (the last page may be partial)
// — producing one partial (o, lse) per segment, merged exactly by log-sum-exp. All segments
// hold keys rotated by R_K and values rotated by R_V, so one rotated query serves all three
// and the output is in rotated value space (the caller multiplies by R_Vᵀ).

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

enum SplitSegment : int { kSinkSegment = 0, kHistorySegment = 1, kRecentSegment = 2 };
inline constexpr int kNumSplitSegments = 3;

struct SplitDecodeParams {
  const float* q = nullptr;  // [batch][num_q_heads][head_dim], rotated by R_K
  int batch = 0;
  int num_q_heads = 0;  // a multiple of geometry.num_kv_heads (GQA)
  int layer = 0;
  float sm_scale = 0.0f;  // usually 1/sqrt(head_dim)
  KvGeometry geometry;
  PagedSegmentView segments[kNumSplitSegments];
  float* out = nullptr;  // [batch][num_q_heads][head_dim]
  float* lse = nullptr;  // [batch][num_q_heads], natural log; -inf when nothing is visible
  // Optional: per-segment partial results, [3][batch][num_q_heads][head_dim] and [3][batch][heads].
  float* partial_out = nullptr;
  float* partial_lse = nullptr;
};

// nullptr when the parameters are supported, else a message naming the offending field
// (e.g. "unsupported head_dim=96").
const char* ValidateSplitDecode(const SplitDecodeParams& p);

// Runs the reference. Precondition: ValidateSplitDecode(p) == nullptr.
void SplitDecodeAttentionRef(const SplitDecodeParams& p);

// Attention of one query row q [head_dim] over the tokens of one segment of sequence b, for
// kv head `kv_head`: o = softmax(q·Kᵀ·sm_scale)·V and lse = log Σ exp(q·k·sm_scale).
// An empty segment gives o = 0 and lse = -inf.
void PartialAttentionRef(const float* q, const KvGeometry& g, const PagedSegmentView& segment,
                         int b, int layer, int kv_head, float sm_scale, float* o, float* lse);

// Exact merge of two partial attentions over disjoint token sets.
void MergeAttentionStates(const float* o_a, float lse_a, const float* o_b, float lse_b, int d,
                          float* o, float* lse);

}  // namespace kvstrata::kernels
