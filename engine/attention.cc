#include "engine/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/scratch.h"
#include "kernels/history_codec.h"

namespace kvstrata::engine {

namespace {

using kernels::cpu::AttentionState;
using kernels::cpu::BlockFormat;
using kernels::cpu::KvBlockPair;

// How the cache's history pages are stored, for the kernels.
BlockFormat HistoryFormat(KvCacheFormat format) {
  switch (format) {
    case KvCacheFormat::kInt2:
      return BlockFormat::kInt2Uniform;
    case KvCacheFormat::kInt2LloydMax:
      return BlockFormat::kInt2LloydMax;
    case KvCacheFormat::kBf16:   // no history pages
    case KvCacheFormat::kCodec:  // decoded page by page into fp32 rows (RunTask)
    case KvCacheFormat::kEvalFp8:
    case KvCacheFormat::kEvalInt4:
    case KvCacheFormat::kEvalKivi2:
    case KvCacheFormat::kEvalTurbo3:
    case KvCacheFormat::kEvalCodec:
      return BlockFormat::kF32;  // the evaluation formats keep fp32 reconstructions
  }
  return BlockFormat::kF32;
}

// Query positions per task: about 32 query rows, so a task's state stays in L2.
int PositionsPerTask(int group) { return std::max(1, 32 / group); }

}  // namespace

LayerAttention::LayerAttention(kernels::cpu::CpuIsa isa, int num_heads)
    : isa_(isa), num_heads_(num_heads) {}

void LayerAttention::Run(KvCache& cache, int layer, std::span<const AttentionChunk> chunks,
                         float sm_scale, ThreadPool* pool) {
  const kernels::KvGeometry& g = cache.geometry();
  const int d = g.head_dim, P = g.page_tokens, group = num_heads_ / g.num_kv_heads;
  const int qb = PositionsPerTask(group);
  tasks_.clear();
  int64_t floats = 0;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const AttentionChunk& c = chunks[ci];
    for (int h = 0; h < g.num_kv_heads; ++h) {
      for (int t0 = 0; t0 < c.n; t0 += qb) {
        const int t1 = std::min(c.n, t0 + qb);
        const int64_t last_page = (c.pos0 + t1 - 1) / P;  // the last the block's queries see
        for (int64_t p0 = 0; p0 <= last_page; p0 += kPagesPerRange) {
          tasks_.push_back(Task{static_cast<int>(ci), h, t0, t1, p0,
                                std::min(last_page + 1, p0 + kPagesPerRange), floats});
          floats += int64_t{t1 - t0} * group * (d + 2);
        }
      }
    }
  }
  if (static_cast<int64_t>(partials_.size()) < floats) partials_.resize(floats);
  // An evaluation codec's key-error logit term (kernels/history_codec.h, "jb"): the features of
  // every query row, once per call rather than once per page range.
  biased_keys_ = nullptr;
  if (cache.options().format == KvCacheFormat::kEvalCodec) {
    const kernels::SideRecipe& keys = cache.options().codec->Side(layer, 0);
    if (keys.logit_bias != 0.0f) biased_keys_ = &keys;
  }
  if (biased_keys_ != nullptr) {
    feature_offsets_.clear();
    int64_t rows = 0;
    for (const AttentionChunk& c : chunks) {
      feature_offsets_.push_back(rows);
      rows += int64_t{c.n} * num_heads_;
    }
    if (static_cast<int64_t>(features_.size()) < rows * kernels::kCodecBiasTerms) {
      features_.resize(rows * kernels::kCodecBiasTerms);
    }
    const auto features = [&](int ci, int) {
      const AttentionChunk& c = chunks[ci];
      kernels::CodecBiasFeatures(
          *biased_keys_, d, c.q, c.n * num_heads_, sm_scale,
          features_.data() + feature_offsets_[ci] * kernels::kCodecBiasTerms);
    };
    if (pool != nullptr && chunks.size() > 1) {
      pool->ParallelFor(static_cast<int>(chunks.size()), features);
    } else {
      for (size_t ci = 0; ci < chunks.size(); ++ci) features(static_cast<int>(ci), 0);
    }
  }
  DecodeCodecPages(cache, layer, chunks, pool);
  const auto run = [&](int task, int) { RunTask(cache, layer, chunks, sm_scale, tasks_[task]); };
  if (pool != nullptr) {
    pool->ParallelFor(static_cast<int>(tasks_.size()), run);
  } else {
    for (size_t i = 0; i < tasks_.size(); ++i) run(static_cast<int>(i), 0);
  }

  // Merge each query block's partials in range order (tasks of one block are consecutive).
  std::vector<int>& firsts = merge_groups_;
  firsts.clear();
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const Task& t = tasks_[i];
    if (i == 0 || t.chunk != tasks_[i - 1].chunk || t.head != tasks_[i - 1].head ||
        t.t_begin != tasks_[i - 1].t_begin) {
      firsts.push_back(static_cast<int>(i));
    }
  }
  firsts.push_back(static_cast<int>(tasks_.size()));
  const auto merge = [&](int gi, int) {
    const int first = firsts[gi], last = firsts[gi + 1];
    const Task& t = tasks_[first];
    const AttentionChunk& c = chunks[t.chunk];
    const int rows = (t.t_end - t.t_begin) * group;
    for (int r = 0; r < rows; ++r) {
      float mx = -std::numeric_limits<float>::infinity();
      for (int k = first; k < last; ++k) {
        mx = std::max(mx, partials_[tasks_[k].partial + int64_t{r} * (d + 2)]);
      }
      float* out =
          c.out + (int64_t{t.t_begin + r / group} * num_heads_ + t.head * group + r % group) * d;
      float l = 0.0f;
      for (int k = first; k < last; ++k) {
        const float* part = partials_.data() + tasks_[k].partial + int64_t{r} * (d + 2);
        const float w = std::exp(part[0] - mx);  // 0 for a range the row does not see
        l += w * part[1];
        for (int i = 0; i < d; ++i) out[i] = (k == first ? 0.0f : out[i]) + w * part[2 + i];
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      for (int i = 0; i < d; ++i) out[i] *= inv;
    }
  };
  const int groups = static_cast<int>(firsts.size()) - 1;
  // A decode step's merges are a few hundred flops: not worth a parallel loop.
  if (pool != nullptr && groups > 2 * pool->threads()) {
    pool->ParallelFor(groups, merge);
  } else {
    for (int i = 0; i < groups; ++i) merge(i, 0);
  }
}

void LayerAttention::DecodeCodecPages(KvCache& cache, int layer,
                                      std::span<const AttentionChunk> chunks, ThreadPool* pool) {
  decoded_offsets_.assign(chunks.size(), -1);
  decoded_pages_.assign(chunks.size(), 0);
  if (cache.options().format != KvCacheFormat::kCodec) return;
  const kernels::KvGeometry& g = cache.geometry();
  const int64_t P = g.page_tokens, block = P * g.head_dim;
  const int group = num_heads_ / g.num_kv_heads;
  // At most 256 MiB of decoded pages per call; past that, chunks decode per task.
  constexpr int64_t kMaxFloats = int64_t{64} << 20;
  int64_t floats = 0;
  struct Item {
    int chunk, head;
    int64_t page;
  };
  std::vector<Item> items;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const AttentionChunk& c = chunks[ci];
    if (c.n <= PositionsPerTask(group)) continue;  // one query block: each page is read once
    const int64_t pages = (c.pos0 + c.n - 1) / P + 1;
    const int64_t need = pages * g.num_kv_heads * 2 * block;
    if (floats + need > kMaxFloats) continue;
    decoded_offsets_[ci] = floats;
    decoded_pages_[ci] = pages;
    floats += need;
    for (int64_t p = 0; p < pages; ++p) {
      // a page some query of the chunk sees as history
      if (cache.FirstInt2Query(p) >= c.pos0 + c.n) continue;
      for (int h = 0; h < g.num_kv_heads; ++h) items.push_back({static_cast<int>(ci), h, p});
    }
  }
  if (items.empty()) return;
  if (static_cast<int64_t>(decoded_.size()) < floats) decoded_.resize(floats);
  const auto decode = [&](int i, int) {
    const Item& it = items[i];
    const AttentionChunk& c = chunks[it.chunk];
    float* k = decoded_.data() + decoded_offsets_[it.chunk] +
               ((int64_t{it.head} * decoded_pages_[it.chunk] + it.page) * 2) * block;
    const int ntok = static_cast<int>(std::min<int64_t>(P, c.pos0 + c.n - it.page * P));
    cache.DecodeHistory(*c.seq, it.page, layer, 0, it.head, ntok, k);
    cache.DecodeHistory(*c.seq, it.page, layer, 1, it.head, ntok, k + block);
  };
  if (pool != nullptr) {
    pool->ParallelFor(static_cast<int>(items.size()), decode);
  } else {
    for (size_t i = 0; i < items.size(); ++i) decode(static_cast<int>(i), 0);
  }
}

void LayerAttention::RunTask(KvCache& cache, int layer, std::span<const AttentionChunk> chunks,
                             float sm_scale, const Task& task) {
  const kernels::KvGeometry& g = cache.geometry();
  const int d = g.head_dim, P = g.page_tokens, group = num_heads_ / g.num_kv_heads;
  const AttentionChunk& c = chunks[task.chunk];
  const int rows = (task.t_end - task.t_begin) * group;
  const int64_t lane_floats = AttentionState::LaneFloats(d);
  // Scratch: lanes (64-byte aligned, first), query rows, acc, m, l, visible counts, flags.
  // A codec's history block is decoded into K and V rows [P][d] each, after the state.
  const bool decode_history = cache.options().format == KvCacheFormat::kCodec;
  const int64_t state_floats = rows * (lane_floats + 2 * d + 4 + kernels::kCodecBiasTerms) + 16;
  const int64_t need = (state_floats + 15) / 16 * 16 + (decode_history ? 2 * int64_t{P} * d : 0);
  float* scratch = kernels::cpu::ThreadScratch(need, /*which=*/3);
  float* decoded_k = scratch + (state_floats + 15) / 16 * 16;
  float* decoded_v = decoded_k + int64_t{P} * d;
  AttentionState st;
  st.head_dim = d;
  st.lanes = scratch;
  float* qrows = st.lanes + rows * lane_floats;
  st.acc = qrows + int64_t{rows} * d;
  st.m = st.acc + int64_t{rows} * d;
  st.l = st.m + rows;
  int* visible = reinterpret_cast<int*>(st.l + rows);
  st.lanes_used = visible + rows;
  // The rows' features of the keys' logit term, when the codec has one (Run computed them).
  float* bias_features = reinterpret_cast<float*>(st.lanes_used + rows);
  if (biased_keys_ != nullptr) {
    constexpr int T = kernels::kCodecBiasTerms;
    for (int t = task.t_begin; t < task.t_end; ++t) {
      std::memcpy(
          bias_features + int64_t{t - task.t_begin} * group * T,
          features_.data() +
              (feature_offsets_[task.chunk] + int64_t{t} * num_heads_ + task.head * group) * T,
          sizeof(float) * group * T);
    }
  }
  for (int t = task.t_begin; t < task.t_end; ++t) {
    std::memcpy(qrows + int64_t{t - task.t_begin} * group * d,
                c.q + (int64_t{t} * num_heads_ + task.head * group) * d, sizeof(float) * group * d);
  }
  kernels::cpu::InitAttentionState(rows, st);
  const BlockFormat history = HistoryFormat(cache.options().format);
  const int64_t end = c.pos0 + c.n;
  for (int64_t p = task.page_begin; p < task.page_end; ++p) {
    const int64_t tok0 = p * P;
    const int ntok = static_cast<int>(std::min<int64_t>(P, end - tok0));
    const int64_t first_int2 = cache.FirstInt2Query(p);
    // Positions (ascending) that see the page: in BF16 before first_int2, as history from it.
    const int64_t seen_from = std::max<int64_t>(tok0, c.pos0 + task.t_begin);
    const int64_t ranges[2][2] = {{seen_from, std::min(c.pos0 + task.t_end, first_int2)},
                                  {std::max(seen_from, first_int2), c.pos0 + task.t_end}};
    for (int version = 0; version < 2; ++version) {
      const int64_t a = ranges[version][0], b = ranges[version][1];
      if (a >= b) continue;
      const int row0 = static_cast<int>(a - c.pos0 - task.t_begin) * group;
      const int nrows = static_cast<int>(b - a) * group;
      for (int r = 0; r < nrows; ++r) {
        const int64_t pos = a + r / group;
        visible[row0 + r] = static_cast<int>(std::min<int64_t>(ntok, pos - tok0 + 1));
      }
      KvBlockPair block;
      if (version == 0) {
        block = KvBlockPair{BlockFormat::kBf16, cache.Bf16Block(*c.seq, p, layer, 0, task.head),
                            cache.Bf16Block(*c.seq, p, layer, 1, task.head), ntok};
      } else if (decode_history) {
        const float* k = decoded_k;
        const float* v = decoded_v;
        if (decoded_offsets_[task.chunk] >= 0) {  // decoded once for the call
          k = decoded_.data() + decoded_offsets_[task.chunk] +
              ((int64_t{task.head} * decoded_pages_[task.chunk] + p) * 2) * P * d;
          v = k + int64_t{P} * d;
        } else {
          cache.DecodeHistory(*c.seq, p, layer, 0, task.head, ntok, decoded_k);
          cache.DecodeHistory(*c.seq, p, layer, 1, task.head, ntok, decoded_v);
        }
        block = KvBlockPair{BlockFormat::kF32, reinterpret_cast<const uint8_t*>(k),
                            reinterpret_cast<const uint8_t*>(v), ntok};
      } else {
        block = KvBlockPair{history, cache.HistoryBlock(*c.seq, p, layer, 0, task.head),
                            cache.HistoryBlock(*c.seq, p, layer, 1, task.head), ntok};
        if (biased_keys_ != nullptr) {
          block.score_bias = reinterpret_cast<const float*>(block.k) + int64_t{P} * d;
          block.bias_terms = kernels::kCodecBiasTerms;
        }
      }
      kernels::cpu::QueryRows query{qrows + int64_t{row0} * d, nrows, visible + row0, sm_scale};
      if (block.score_bias != nullptr) {
        query.bias_features = bias_features + int64_t{row0} * kernels::kCodecBiasTerms;
      }
      kernels::cpu::AttendBlock(isa_, g, block, query, st.Rows(row0));
    }
  }
  kernels::cpu::FinishAttentionState(isa_, g, rows, st);
  for (int r = 0; r < rows; ++r) {
    float* part = partials_.data() + task.partial + int64_t{r} * (d + 2);
    part[0] = st.m[r];
    part[1] = st.l[r];
    std::memcpy(part + 2, st.acc + int64_t{r} * d, sizeof(float) * d);
  }
}

void ChunkAttention(KvCache& cache, const SequenceKv& seq, int layer, const float* q, int n,
                    int64_t pos0, int num_heads, float sm_scale, float* out) {
  LayerAttention attention(kernels::cpu::DetectCpuIsa(), num_heads);
  const AttentionChunk chunk{&seq, q, n, pos0, out};
  attention.Run(cache, layer, std::span<const AttentionChunk>(&chunk, 1), sm_scale,
                /*pool=*/nullptr);
}

}  // namespace kvstrata::engine
