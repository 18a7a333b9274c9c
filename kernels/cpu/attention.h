#pragma once

// Attention of query rows over KV page blocks on the CPU, one block at a time with an online
// softmax (the CPU side of split attention: the engine runs fixed page ranges as separate
// partials and merges them by log-sum-exp).
//
// BF16 blocks are read as bf16; INT2 history blocks are read from their codes: scores are
// q·(scale·L[code] + offset) summed per channel group and values Σ p·(scale·L[code] + offset)
// accumulated per channel, so no page is ever expanded into memory (the AVX-512 path; the
// portable path decodes a block into a small tile with the page format's own decoder).
//
// Every row's arithmetic is the same whichever other rows share the call, so attention
// computed for a prefill chunk and for one decode token give the same bits (the exactness
// principle, docs/engine.md).

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/kv_layout.h"

namespace kvstrata::kernels::cpu {

// How a block's K and V rows are stored.
enum class BlockFormat {
  kBf16,          // BF16 block [page_tokens][head_dim] (kv_layout.h)
  kInt2Uniform,   // INT2 block, levels {0, 1, 2, 3}
  kInt2LloydMax,  // INT2 block, Gaussian Lloyd-Max levels
  kF32,           // fp32 rows [page_tokens][head_dim] (the engine's evaluation formats)
};

// One page's K and V blocks for one (layer, KV head), and how many of its tokens hold data.
struct KvBlockPair {
  BlockFormat format = BlockFormat::kBf16;
  const uint8_t* k = nullptr;
  const uint8_t* v = nullptr;
  int num_tokens = 0;  // 1..page_tokens; tokens past it are never read
  // kF32 only, optional (an evaluation codec's logit correction, kernels/history_codec.h):
  // per token `bias_terms` coefficients [num_tokens][bias_terms]; the scaled score of row r
  // and token t gains Σ_j QueryRows::bias_features[r][j]·score_bias[t][j].
  const float* score_bias = nullptr;
  int bias_terms = 0;
};

// Query rows attending to a block. Row r sees tokens [0, visible[r]) of it (the causal mask
// and the block's fill), 1 <= visible[r] <= num_tokens.
struct QueryRows {
  const float* q = nullptr;  // [rows][head_dim], in the cache's rotated space
  int rows = 0;
  const int* visible = nullptr;          // [rows]
  float scale = 1.0f;                    // softmax scale on q·k
  const float* bias_features = nullptr;  // [rows][bias_terms] when the block has score_bias
};

// Softmax reference points move only when a score passes them by more than this (natural
// log units): a block then rescales nothing, and exp(s - m) stays below e^8.
inline constexpr float kLazyRescale = 8.0f;

// The running state of each row, updated in place: m the softmax reference point (-inf before
// any block; within kLazyRescale of the largest scaled score so far), l = Σ exp(s - m),
// acc = Σ exp(s - m)·v. `lanes` is scratch an implementation may
// keep partial sums in (FinishAttentionState folds it into acc), `lanes_used` says whether it
// did. All are indexed by row, so a state can be handed over in row ranges (Rows).
struct AttentionState {
  float* m = nullptr;         // [rows]
  float* l = nullptr;         // [rows]
  float* acc = nullptr;       // [rows][head_dim]
  float* lanes = nullptr;     // [rows][LaneFloats(head_dim)], 64-byte aligned
  int* lanes_used = nullptr;  // [rows]
  int head_dim = 0;

  AttentionState Rows(int first) const {
    return {m + first,
            l + first,
            acc + int64_t{first} * head_dim,
            lanes + int64_t{first} * LaneFloats(head_dim),
            lanes_used + first,
            head_dim};
  }
  // 16 partial sums per channel and per channel group.
  static constexpr int64_t LaneFloats(int head_dim) { return int64_t{head_dim} * 17; }
};

// Starts `rows` states: m = -inf, l = 0, acc = 0, no lanes in use.
void InitAttentionState(int rows, const AttentionState& state);

// Adds the block's tokens to each row's state. g gives head_dim and group_size (INT2).
void AttendBlock(CpuIsa isa, const KvGeometry& g, const KvBlockPair& block, const QueryRows& q,
                 const AttentionState& state);

// Folds the lanes into acc, after a row's last block and before reading acc.
void FinishAttentionState(CpuIsa isa, const KvGeometry& g, int rows, const AttentionState& state);

// The specification: each row's output Σ softmax(s)·v over all the blocks it sees, in double,
// with blocks decoded by the page format's reference decoders (kernels/quant.h).
// blocks [num_blocks]; visible [rows][num_blocks] (0: the row does not see that block);
// out [rows][head_dim]; bias_features [rows][bias_terms] for blocks with score_bias (null: the
// scores without the bias).
void AttendBlocksRef(const KvGeometry& g, const KvBlockPair* blocks, int num_blocks, const float* q,
                     int rows, const int* visible, float scale, float* out,
                     const float* bias_features = nullptr);

// The score bias of row r and token t of a block with score_bias. Out of line: the
// instruction-set files include this header under different target flags.
float ScoreBias(const KvBlockPair& b, const QueryRows& q, int r, int t);

// x[i] = exp(x[i]) for i < n: |error| <= 2 ulp (x <= 88), 0 below -87.3 and for -inf.
void ExpInPlace(CpuIsa isa, float* x, int n);

}  // namespace kvstrata::kernels::cpu
