#pragma once

// Attention of chunks of query positions over their sequences' cached KV, on the CPU, with the
// split-cache semantics of docs/kv-format.md: the query at position t sees the sink in BF16,
// every page the recent window has left (as of t) as history (INT2, or what an evaluation
// format stores: kv_cache.h), and the rest in BF16. This is the same rule in prefill and in
// decode, so a sequence's KV is a function of its tokens.
//
// The work is split attention: each (chunk, KV head, block of query positions, range of
// kPagesPerRange pages) is a task computing a partial softmax (kernels/cpu/attention.h), and
// the partials of a query are merged by log-sum-exp in range order. The ranges are fixed page
// intervals and the kernels' arithmetic per query row does not depend on the rows beside it,
// so a position's attention output is the same, bit for bit, whether it is computed in a
// prefill chunk of any size or as a decode token.

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/thread_pool.h"
#include "kernels/cpu/isa.h"

namespace kvstrata::engine {

// Pages per partial of split attention (256 tokens).
inline constexpr int kPagesPerRange = 4;

// One chunk: positions pos0 .. pos0+n-1 of a sequence whose cache holds tokens [0, pos0 + n)
// for the layer, with history blocks present for every page some query in the chunk sees as
// history.
struct AttentionChunk {
  const SequenceKv* seq = nullptr;
  const float* q = nullptr;  // [n][num_heads][head_dim]: rotated by R_K
  int n = 0;
  int64_t pos0 = 0;
  float* out = nullptr;  // [n][num_heads][head_dim]: outputs in rotated value space
};

// Runs the attention of one layer for a batch of chunks. Keeps its plan and scratch between
// calls (nothing is allocated once warm). Thread-compatible: one engine thread calls Run, which
// uses the pool's threads.
class LayerAttention {
 public:
  LayerAttention(kernels::cpu::CpuIsa isa, int num_heads);

  void Run(KvCache& cache, int layer, std::span<const AttentionChunk> chunks, float sm_scale,
           ThreadPool* pool);

 private:
  struct Task {
    int chunk;
    int head;     // KV head
    int t_begin;  // query positions [t_begin, t_end) of the chunk (offsets from pos0)
    int t_end;
    int64_t page_begin;
    int64_t page_end;
    int64_t partial;  // offset of its partials in partials_
  };
  void RunTask(KvCache& cache, int layer, std::span<const AttentionChunk> chunks, float sm_scale,
               const Task& task);

  kernels::cpu::CpuIsa isa_;
  int num_heads_;
  std::vector<Task> tasks_;
  std::vector<float> partials_;    // per task: rows × {m, l, acc[head_dim]}
  std::vector<int> merge_groups_;  // first task of each query block, then tasks_.size()
  // kEvalCodec with the keys' logit term: its recipe for the layer, and the features of every
  // query row [Σ n·num_heads][kernels::kCodecBiasTerms], chunk by chunk from feature_offsets_.
  const kernels::SideRecipe* biased_keys_ = nullptr;
  std::vector<float> features_;
  std::vector<int64_t> feature_offsets_;
  // kCodec: the history pages of a chunk with more than one query block, decoded once per call
  // rather than once per task: per chunk the offset of its pages [kv_heads][pages][K, V][P][d]
  // in decoded_ (-1: decoded per task), and how many pages it spans.
  void DecodeCodecPages(KvCache& cache, int layer, std::span<const AttentionChunk> chunks,
                        ThreadPool* pool);
  std::vector<float> decoded_;
  std::vector<int64_t> decoded_offsets_;
  std::vector<int64_t> decoded_pages_;
};

// One chunk on the calling thread with the best kernels this CPU has (tests, tools).
void ChunkAttention(KvCache& cache, const SequenceKv& seq, int layer, const float* q, int n,
                    int64_t pos0, int num_heads, float sm_scale, float* out);

}  // namespace kvstrata::engine
