// GPU test: the chunk (prefill) attention kernel against the engine's CPU ChunkAttention, which
// is its specification, on the same pages: a host KvCache is filled as a forward pass would
// leave it mid-pass (BF16 pages, INT2 history for the pages demoted so far, both copies of the
// pages this chunk demotes), its pools are copied to the GPU, and both compute the chunk's
// attention. Sweeps formats, head_dim 64/128, GQA 1/3/8, and chunks that start at 0, cross page
// and window boundaries, or hold one query. Skips itself without a CUDA device.

#include "kernels/cuda/chunk_attention.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/attention.h"
#include "engine/kv_cache.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "kernels/history_codec.h"
#include "kernels/quant.h"
#include "tests/kernels/gpu_test_util.h"

namespace kvstrata::kernels {
namespace {

using engine::KvCache;
using engine::KvCacheFormat;
using engine::SequenceKv;

struct Case {
  int64_t pos0;
  int n;
};

// Random BF16 rows for tokens [from, to) of every layer and head, then the INT2 history of the
// pages an append to `to` demotes, from their BF16 values as the backends do.
void Fill(KvCache& cache, SequenceKv& seq, int64_t from, int64_t to, std::mt19937& rng) {
  const KvGeometry& g = cache.geometry();
  std::normal_distribution<float> normal;
  std::vector<float> row(g.head_dim);
  for (int64_t t = from; t < to; ++t) {
    for (int layer = 0; layer < g.num_layers; ++layer) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int h = 0; h < g.num_kv_heads; ++h) {
          for (float& x : row) x = normal(rng) * (kind == 0 ? 2.0f : 1.0f);
          uint8_t* block = cache.Bf16Block(seq, t / g.page_tokens, layer, kind, h);
          EncodeBf16Block(row.data(), 1, g, block + (t % g.page_tokens) * g.head_dim * 2);
        }
      }
    }
  }
  if (!cache.split()) return;
  const int64_t sink_pages = cache.options().layout.sink_tokens / g.page_tokens;
  std::vector<float> rows(static_cast<size_t>(g.page_tokens) * g.head_dim);
  for (int64_t p = std::max(sink_pages, cache.DemotedPagesEnd(from)); p < cache.DemotedPagesEnd(to);
       ++p) {
    for (int layer = 0; layer < g.num_layers; ++layer) {
      for (int kind = 0; kind < 2; ++kind) {
        for (int h = 0; h < g.num_kv_heads; ++h) {
          DecodeBf16Block(cache.Bf16Block(seq, p, layer, kind, h), g.page_tokens, g, rows.data());
          cache.EncodeHistory(seq, p, layer, kind, h, rows.data(), 0.95f);
        }
      }
    }
  }
}

template <typename T>
T* Copy(const T* host, size_t n) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host, n * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

// `group_size`: INT2 channels per scale and offset (0: the head, what the engine stores; the
// kernel stages such pages through per-token tables, smaller groups one element at a time).
// `codec`: the codec format's recipes (codec blocks, or codec fragment blocks when they code
// uniform levels).
void RunCase(KvCacheFormat format, int d, int group, Case c, int group_size = 0,
             std::shared_ptr<const HistoryCodec> codec = nullptr) {
  SCOPED_TRACE(absl::StrCat(engine::KvCacheFormatName(format), " d=", d, " group=", group,
                            " pos0=", c.pos0, " n=", c.n, " group_size=", group_size));
  const KvGeometry g{.num_layers = 2, .num_kv_heads = 2, .head_dim = d,
                     .group_size = group_size > 0 ? group_size : d, .page_tokens = 64};
  engine::KvCacheOptions o;
  o.format = format;
  o.capacity_bytes = int64_t{96} << 20;
  o.max_sequences = 2;
  o.max_chunk_tokens = 1024;
  o.codec = codec;
  absl::StatusOr<std::unique_ptr<KvCache>> made = KvCache::Create(g, o);
  ASSERT_TRUE(made.ok()) << made.status();
  KvCache& cache = **made;
  SequenceKv seq;
  const int64_t end = c.pos0 + c.n;
  ASSERT_TRUE(cache.Reserve(seq, end).ok());
  seq.tokens.assign(end, 5);
  std::mt19937 rng(static_cast<uint32_t>(d * 131 + group * 7 + c.pos0 + c.n));
  if (c.pos0 > 0) {
    ASSERT_TRUE(cache.BeginAppend(seq, c.pos0).ok());
    Fill(cache, seq, 0, c.pos0, rng);
    ASSERT_TRUE(cache.EndAppend(seq, c.pos0).ok());
  }
  ASSERT_TRUE(cache.BeginAppend(seq, end).ok());
  Fill(cache, seq, c.pos0, end, rng);

  const int heads = g.num_kv_heads * group, layer = 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(c.n) * heads * d);
  for (float& x : q) x = normal(rng);
  std::vector<float> ref(q.size());
  engine::ChunkAttention(cache, seq, layer, q.data(), c.n, c.pos0, heads, scale, ref.data());

  // The same pools on the GPU.
  const engine::PagePool& bf16 = cache.bf16_pool();
  uint8_t* d_bf16 = Copy(bf16.base(), bf16.num_slots() * bf16.slot_bytes());
  uint8_t* d_int2 = nullptr;
  if (cache.split()) {
    d_int2 = Copy(cache.int2_pool()->base(),
                  cache.int2_pool()->num_slots() * cache.int2_pool()->slot_bytes());
  }
  const int64_t pages = (end + 63) / 64;
  std::vector<int32_t> bslot(pages, -1), islot(pages, -1);
  for (int64_t p = 0; p < pages; ++p) {
    if (p < static_cast<int64_t>(seq.bf16_slot.size())) bslot[p] = seq.bf16_slot[p];
    if (p < static_cast<int64_t>(seq.int2_slot.size())) islot[p] = seq.int2_slot[p];
  }
  const std::vector<int32_t> q_offset = {0}, len = {c.n}, pos0 = {static_cast<int32_t>(c.pos0)},
                             indptr = {0, static_cast<int32_t>(pages)};
  ChunkAttentionParams p;
  p.q = ToDevice(q);
  ASSERT_EQ(cudaMalloc(&p.out, q.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(p.out, 0xff, q.size() * 4), cudaSuccess);  // NaN: every row is written
  p.num_q_heads = heads;
  p.layer = layer;
  p.sm_scale = scale;
  p.geometry = cache.geometry();
  p.num_items = 1;
  p.max_len = c.n;
  p.q_offset = ToDevice(q_offset);
  p.len = ToDevice(len);
  p.pos0 = ToDevice(pos0);
  p.page_indptr = ToDevice(indptr);
  p.bf16_slot = ToDevice(bslot);
  p.int2_slot = ToDevice(islot);
  p.bf16_pool = d_bf16;
  p.bf16_stride = bf16.slot_bytes();
  p.int2_pool = d_int2;
  p.int2_stride = cache.split() ? cache.int2_pool()->slot_bytes() : 0;
  p.int2_encoding = cache.int2_encoding();
  if (codec != nullptr) {
    const SideRecipe &kr = codec->Side(layer, 0), &vr = codec->Side(layer, 1);
    const int64_t k0 = cache.HistoryBlockOffset(layer, 0, 0);
    const int64_t v0 = cache.HistoryBlockOffset(layer, 1, 0);
    if (p.int2_encoding == PageEncoding::kCodecFragment) {
      p.codec = CodecFragmentLayerLayoutFor(kr, vr, k0, v0);
      CodecFragmentLevelTable(p.fragment_levels);
    } else {
      p.codec = CodecLayerLayoutFor(kr, vr, 64, k0, v0);
    }
  }
  p.split = cache.split();
  p.sink_pages = o.layout.sink_tokens / 64;
  p.recent_tokens = o.layout.recent_tokens;
  ASSERT_EQ(LaunchChunkAttention(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(q.size());
  ASSERT_EQ(cudaMemcpy(got.data(), p.out, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  // fp16 operands: per row, the error against the row's largest value.
  double worst = 0;
  for (int64_t r = 0; r < int64_t{c.n} * heads; ++r) {
    float row_max = 0;
    for (int i = 0; i < d; ++i) row_max = std::max(row_max, std::fabs(ref[r * d + i]));
    for (int i = 0; i < d; ++i) {
      const double e = std::fabs(got[r * d + i] - ref[r * d + i]) / std::max(row_max, 1e-3f);
      ASSERT_FALSE(std::isnan(got[r * d + i])) << "row " << r << " channel " << i;
      worst = std::max(worst, e);
    }
  }
  EXPECT_LT(worst, 0.01) << "largest error relative to the row's largest value";
  for (const void* ptr : {static_cast<const void*>(p.q), static_cast<const void*>(p.out),
                          static_cast<const void*>(p.q_offset), static_cast<const void*>(p.len),
                          static_cast<const void*>(p.pos0),
                          static_cast<const void*>(p.page_indptr),
                          static_cast<const void*>(p.bf16_slot),
                          static_cast<const void*>(p.int2_slot), static_cast<const void*>(d_bf16),
                          static_cast<const void*>(d_int2)}) {
    cudaFree(const_cast<void*>(ptr));
  }
}

TEST(ChunkAttentionGpu, MatchesTheCpuSplitSemantics) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Case cases[] = {{0, 37},  {0, 700},  {300, 97}, {380, 10},
                        {700, 1}, {1000, 200}, {63, 66}, {1535, 1}};
  for (KvCacheFormat f : {KvCacheFormat::kBf16, KvCacheFormat::kInt2, KvCacheFormat::kInt2LloydMax}) {
    for (int d : {64, 128}) {
      for (int group : {1, 3, 8}) {
        for (const Case& c : cases) RunCase(f, d, group, c);
      }
      // Two scales per token: the element-wise staging.
      if (f != KvCacheFormat::kBf16) {
        for (const Case& c : {cases[1], cases[5]}) RunCase(f, d, 3, c, d / 2);
      }
    }
  }
}

// The codec format's history, in codec blocks (Lloyd-Max levels) and in codec fragment blocks
// (the same recipes on uniform levels): the kernel stages their values as the CPU decodes them.
TEST(ChunkAttentionGpu, MatchesTheCpuWithCodecHistories) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  const Case cases[] = {{0, 700}, {300, 97}, {700, 1}, {1000, 200}};
  for (const bool uniform : {false, true}) {
    for (int d : {64, 128}) {
      const std::string u = uniform ? ":u" : "";
      const std::string spec =
          d == 64 ? "4x16+3x16+2x32:s8:pr" + u + "|3x16+2x16+1x32:s8:pr" + u
                  : "4x32+3x32+2x64:s8:pr" + u + "|3x32+2x32+1x64:s8:pr" + u +
                        ";1=3x32+2x64+1x32:s8:pr" + u + "|4x16+2x48+0x64:s8:pr" + u;
      auto codec = std::make_shared<HistoryCodec>();
      std::string error;
      ASSERT_TRUE(ParseHistoryCodec(spec, d, codec.get(), &error)) << error;
      for (int group : {1, 4}) {
        for (const Case& c : cases) RunCase(KvCacheFormat::kCodec, d, group, c, 0, codec);
      }
    }
  }
}

}  // namespace
}  // namespace kvstrata::kernels
