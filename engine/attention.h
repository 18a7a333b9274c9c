#pragma once

// Attention of a chunk of query positions of one sequence over its cached KV, on the CPU,
// with the split-cache semantics of docs/kv-format.md: the query at position t sees the sink
// in BF16, every page the recent window has left (as of t) as history (INT2, or what an
// evaluation format stores: kv_cache.h), and the rest in BF16. This is the same rule in
// prefill and in decode, so a sequence's KV is a function of its tokens.

#include <cstdint>

#include "engine/kv_cache.h"

namespace kvstrata::engine {

// q   [n][num_heads][head_dim]: queries of positions pos0 .. pos0+n-1, rotated by R_K
// out [n][num_heads][head_dim]: attention outputs in rotated value space
// The cache must hold tokens [0, pos0 + n) of the sequence for `layer`, with history blocks
// present for every page some query in the chunk sees as history.
void ChunkAttention(KvCache& cache, const SequenceKv& seq, int layer, const float* q, int n,
                    int64_t pos0, int num_heads, float sm_scale, float* out);

}  // namespace kvstrata::engine
