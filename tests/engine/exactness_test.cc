// The exactness principle (docs/kv-format.md §1): a sequence's KV pages depend on its tokens
// alone, however the prompt was chunked. Prefilling in one chunk, in many chunks and token by
// token, on any number of threads, gives the same pages bit for bit: the CPU kernels compute
// each token's products and attention the same way whatever else is in the batch.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "engine/attention.h"
#include "engine/cpu_backend.h"
#include "engine/kv_cache.h"
#include "engine/rotations.h"
#include "kernels/attention_ref.h"
#include "kernels/codec_fragment.h"
#include "kernels/codec_page.h"
#include "tests/engine/random_model.h"

namespace kvstrata::engine {
namespace {

struct PrefillRun {
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Backend> backend;
  SequenceKv seq;
  std::vector<float> last_logits;
};

kernels::KvGeometry GeometryOf(const model::LoadedModel& m) {
  return {m.config.num_layers, m.config.num_kv_heads, m.config.head_dim, m.config.head_dim, 64};
}

void Prefill(PrefillRun& run, const model::LoadedModel& m, const RotationSet& rot,
             KvCacheFormat format, const std::vector<int32_t>& prompt, int chunk, int threads,
             std::shared_ptr<const kernels::HistoryCodec> codec = testing::TestCodec()) {
  KvCacheOptions o;
  o.format = format;
  o.capacity_bytes = 64 << 20;
  o.max_sequences = 1;
  o.max_chunk_tokens = 1024;
  if (format == KvCacheFormat::kCodec || format == KvCacheFormat::kEvalCodec) o.codec = codec;
  run.cache = *KvCache::Create(GeometryOf(m), o);
  run.backend = CreateCpuBackend(m, rot, run.cache.get(), threads);
  ASSERT_TRUE(run.cache->Reserve(run.seq, static_cast<int64_t>(prompt.size())).ok());
  run.seq.tokens = prompt;
  for (size_t pos = 0; pos < prompt.size(); pos += chunk) {
    const int n = static_cast<int>(std::min<size_t>(chunk, prompt.size() - pos));
    ASSERT_TRUE(
        run.backend->Forward({{&run.seq, static_cast<int64_t>(pos), n, false}}, &run.last_logits)
            .ok());
  }
  ASSERT_EQ(run.seq.num_tokens, static_cast<int64_t>(prompt.size()));
}

struct PageDiff {
  int64_t bytes = 0, differing = 0;
};

PageDiff ComparePages(const PrefillRun& a, const PrefillRun& b) {
  PageDiff diff;
  const int64_t pages = static_cast<int64_t>(a.seq.bf16_slot.size());
  EXPECT_EQ(pages, static_cast<int64_t>(b.seq.bf16_slot.size()));
  for (int64_t p = 0; p < pages; ++p) {
    EXPECT_EQ(a.seq.int2_slot[p] >= 0, b.seq.int2_slot[p] >= 0) << "page " << p;
    EXPECT_EQ(a.seq.bf16_slot[p] >= 0, b.seq.bf16_slot[p] >= 0) << "page " << p;
    if (a.seq.int2_slot[p] >= 0 && b.seq.int2_slot[p] >= 0) {
      const int64_t n = a.cache->int2_pool()->slot_bytes();
      const uint8_t* x = a.cache->int2_pool()->slot(a.seq.int2_slot[p]);
      const uint8_t* y = b.cache->int2_pool()->slot(b.seq.int2_slot[p]);
      EXPECT_EQ(std::memcmp(x, y, kernels::kPageHeaderBytes), 0) << "INT2 header of page " << p;
      for (int64_t i = kernels::kPageHeaderBytes; i < n; ++i) diff.differing += x[i] != y[i];
      diff.bytes += n;
    }
    if (a.seq.bf16_slot[p] >= 0 && b.seq.bf16_slot[p] >= 0) {
      const uint8_t* x = a.cache->bf16_pool().slot(a.seq.bf16_slot[p]);
      const uint8_t* y = b.cache->bf16_pool().slot(b.seq.bf16_slot[p]);
      // only the rows holding tokens
      const int64_t tokens = std::min<int64_t>(64, a.seq.num_tokens - p * 64);
      const kernels::KvGeometry& g = a.cache->geometry();
      for (int l = 0; l < g.num_layers; ++l)
        for (int kind = 0; kind < 2; ++kind)
          for (int h = 0; h < g.num_kv_heads; ++h) {
            const int64_t off = kernels::BlockOffset(g, kernels::PageEncoding::kBf16, l, kind, h);
            for (int64_t i = 0; i < tokens * g.head_dim * 2; ++i)
              diff.differing += x[off + i] != y[off + i];
            diff.bytes += tokens * g.head_dim * 2;
          }
    }
  }
  return diff;
}

class Exactness : public ::testing::TestWithParam<KvCacheFormat> {};

TEST_P(Exactness, ChunkingDoesNotChangeThePages) {
  const model::LoadedModel m = testing::RandomModel({});
  const RotationSet rot =
      IdentityRotations(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim);
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(700);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % m.config.vocab_size);
  PrefillRun whole, chunked, stepwise;
  Prefill(whole, m, rot, GetParam(), prompt, 700, /*threads=*/1);
  Prefill(chunked, m, rot, GetParam(), prompt, 97, /*threads=*/3);
  Prefill(stepwise, m, rot, GetParam(), prompt, 1, /*threads=*/2);
  // 700 tokens: pages 1..5 are INT2 history, page 0 is the sink, pages 6..10 the recent window.
  if (GetParam() != KvCacheFormat::kBf16) {
    EXPECT_EQ(whole.cache->DemotedPagesEnd(700), 6);
    for (int p = 1; p < 6; ++p) EXPECT_GE(whole.seq.int2_slot[p], 0);
    for (int p = 1; p < 6; ++p) EXPECT_LT(whole.seq.bf16_slot[p], 0);
  }
  for (const PrefillRun* other : {&chunked, &stepwise}) {
    const PageDiff d = ComparePages(whole, *other);
    ASSERT_GT(d.bytes, 0);
    std::printf("%s: %lld of %lld page bytes differ\n", KvCacheFormatName(GetParam()),
                static_cast<long long>(d.differing), static_cast<long long>(d.bytes));
    EXPECT_EQ(d.differing, 0) << d.differing << " of " << d.bytes << " bytes differ";
    EXPECT_EQ(whole.last_logits, other->last_logits);
  }
}

// The same with rotations, which the backend applies to q, k and v (and the output) per head:
// orthogonal Walsh-Hadamard matrices with random signs, different per (layer, KV head).
RotationSet RandomRotations(const model::LoadedModel& m, std::mt19937& rng) {
  const int L = m.config.num_layers, H = m.config.num_kv_heads, d = m.config.head_dim;
  RotationSet rot = IdentityRotations(L, H, d);
  rot.identity = false;
  for (std::vector<float>* r : {&rot.k_rotation, &rot.v_rotation}) {
    r->assign(static_cast<size_t>(L) * H * d * d, 0.0f);
    for (int lh = 0; lh < L * H; ++lh) {
      float* m_lh = r->data() + static_cast<int64_t>(lh) * d * d;
      std::vector<float> sign(d);
      for (float& s : sign) s = rng() % 2 ? 1.0f : -1.0f;
      for (int i = 0; i < d; ++i) {
        for (int j = 0; j < d; ++j) {
          const float h = __builtin_popcount(i & j) % 2 ? -1.0f : 1.0f;  // Sylvester
          m_lh[i * d + j] = sign[i] * h / std::sqrt(static_cast<float>(d));
        }
      }
    }
  }
  rot.k_clip.assign(static_cast<size_t>(L) * H, 0.9f);
  rot.v_clip.assign(static_cast<size_t>(L) * H, 0.95f);
  return rot;
}

TEST(ExactnessWithRotations, ChunkingDoesNotChangeThePages) {
  const model::LoadedModel m = testing::RandomModel({});
  std::mt19937 rng(21);
  const RotationSet rot = RandomRotations(m, rng);
  std::vector<int32_t> prompt(700);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % m.config.vocab_size);
  PrefillRun whole, stepwise;
  Prefill(whole, m, rot, KvCacheFormat::kInt2, prompt, 700, /*threads=*/2);
  Prefill(stepwise, m, rot, KvCacheFormat::kInt2, prompt, 1, /*threads=*/1);
  const PageDiff d_pages = ComparePages(whole, stepwise);
  ASSERT_GT(d_pages.bytes, 0);
  EXPECT_EQ(d_pages.differing, 0) << d_pages.differing << " of " << d_pages.bytes;
  EXPECT_EQ(whole.last_logits, stepwise.last_logits);
}

INSTANTIATE_TEST_SUITE_P(Formats, Exactness,
                         ::testing::Values(KvCacheFormat::kBf16, KvCacheFormat::kInt2,
                                           KvCacheFormat::kInt2LloydMax, KvCacheFormat::kCodec),
                         [](const auto& info) {
                           std::string s = KvCacheFormatName(info.param);
                           std::erase(s, '-');
                           return s;
                         });

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// The served codec format (packed pages, the codec's eigenbasis folded into the rotations)
// computes what the evaluation codec computes on the rotation's rows (fake quantisation in the
// eigenbasis), up to the BF16 rounding of the rows, which the served format stores in the
// codec's basis: a code next to a midpoint may flip under it (here ~8 % of the codec's own
// error, against BF16). Coding the unfolded rows instead is as far off as the codec's own error:
// the basis matters. The same for both block layouts: codec blocks (Lloyd-Max levels) and codec
// fragment blocks (uniform levels).
TEST(CodecFormat, ServedPagesMatchTheEvaluationCodec) {
  const model::LoadedModel m = testing::RandomModel({});
  for (const bool uniform_levels : {false, true}) {
    SCOPED_TRACE(uniform_levels ? "codec fragment blocks" : "codec blocks");
    const std::shared_ptr<const kernels::HistoryCodec> codec = testing::TestCodec(uniform_levels);
    std::mt19937 rng(33);
    const RotationSet rot = RandomRotations(m, rng);
    RotationSet folded = rot;
    ASSERT_TRUE(FoldCodecBasis(*codec, &folded).ok());
    std::vector<int32_t> prompt(700);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % m.config.vocab_size);
    PrefillRun served, evaluated, unfolded, bf16;
    Prefill(served, m, folded, KvCacheFormat::kCodec, prompt, 700, /*threads=*/1, codec);
    Prefill(evaluated, m, rot, KvCacheFormat::kEvalCodec, prompt, 700, /*threads=*/1, codec);
    Prefill(unfolded, m, rot, KvCacheFormat::kCodec, prompt, 700, /*threads=*/1, codec);
    Prefill(bf16, m, rot, KvCacheFormat::kBf16, prompt, 700, /*threads=*/1, codec);
    EXPECT_EQ(served.cache->int2_encoding(), uniform_levels ? kernels::PageEncoding::kCodecFragment
                                                            : kernels::PageEncoding::kCodec);
    const float same = MaxAbsDiff(served.last_logits, evaluated.last_logits);
    const float codec_error = MaxAbsDiff(served.last_logits, bf16.last_logits);
    EXPECT_GT(codec_error, 0.0f);
    EXPECT_LT(same, 0.25f * codec_error) << same << " vs " << codec_error;
    EXPECT_GT(MaxAbsDiff(unfolded.last_logits, evaluated.last_logits), 2.5f * same);
    // 5 history pages of 2 layers: bytes per page are the codec's (40 % of BF16 here), not
    // INT2's.
    int64_t blocks = 0;
    for (int layer = 0; layer < 2; ++layer) {
      for (int kind = 0; kind < 2; ++kind) {
        const kernels::SideRecipe& r = codec->Side(layer, kind);
        blocks += uniform_levels ? kernels::CodecFragmentBlockLayoutFor(r).bytes
                                 : kernels::CodecBlockLayoutFor(r, 64).bytes;
      }
    }
    EXPECT_EQ(served.cache->history_page_bytes(),
              kernels::kPageHeaderBytes + m.config.num_kv_heads * blocks);
  }
}

// ChunkAttention over the engine's pages equals the kernels' split-attention reference, which
// reads the same slots through PagedSegmentView: the engine lays pages out as documented.
TEST(ChunkAttention, MatchesSplitDecodeReference) {
  const model::LoadedModel m = testing::RandomModel({.kv_heads = 2, .head_dim = 64});
  const RotationSet rot =
      IdentityRotations(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim);
  std::mt19937 rng(9);
  std::vector<int32_t> prompt(700);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % m.config.vocab_size);
  PrefillRun run;
  Prefill(run, m, rot, KvCacheFormat::kInt2, prompt, 700, /*threads=*/1);
  // Queries at positions 639..699 all see pages 1..5 in INT2 (the last demotion happened when
  // the sequence reached 640 tokens), so the final cache serves all of them.
  const int64_t pos0 = 639;
  const int n = 61, heads = m.config.num_heads, d = m.config.head_dim;
  std::normal_distribution<float> normal;
  std::vector<float> q(static_cast<size_t>(n) * heads * d), out(q.size());
  for (auto& v : q) v = normal(rng);
  const float scale = 1.0f / 8.0f;
  for (int layer = 0; layer < m.config.num_layers; ++layer) {
    ChunkAttention(*run.cache, run.seq, layer, q.data(), n, pos0, heads, scale, out.data());
    for (int t = 0; t < n; ++t) {
      const int64_t visible = pos0 + t + 1;
      const kernels::SplitSegments s = kernels::SegmentsAt(kernels::SplitLayout{}, visible);
      std::vector<int32_t> sink_pages, hist_pages, recent_pages;
      for (int64_t p = 0; p < s.sink / 64; ++p) sink_pages.push_back(run.seq.bf16_slot[p]);
      for (int64_t p = s.sink / 64; p < (s.sink + s.history) / 64; ++p)
        hist_pages.push_back(run.seq.int2_slot[p]);
      for (int64_t p = (s.sink + s.history) / 64; p * 64 < visible; ++p)
        recent_pages.push_back(run.seq.bf16_slot[p]);
      int32_t ip_sink[2] = {0, static_cast<int32_t>(sink_pages.size())};
      int32_t ip_hist[2] = {0, static_cast<int32_t>(hist_pages.size())};
      int32_t ip_recent[2] = {0, static_cast<int32_t>(recent_pages.size())};
      int32_t last_sink = 64, last_hist = 64;
      int32_t last_recent = static_cast<int32_t>(visible - ((visible - 1) / 64) * 64);
      kernels::SplitDecodeParams p;
      p.q = q.data() + static_cast<int64_t>(t) * heads * d;
      p.batch = 1;
      p.num_q_heads = heads;
      p.layer = layer;
      p.sm_scale = scale;
      p.geometry = run.cache->geometry();
      p.segments[0] = {run.cache->bf16_pool().base(),
                       run.cache->bf16_pool().slot_bytes(),
                       ip_sink,
                       sink_pages.data(),
                       &last_sink,
                       kernels::PageEncoding::kBf16};
      p.segments[1] = {run.cache->int2_pool()->base(),
                       run.cache->int2_pool()->slot_bytes(),
                       ip_hist,
                       hist_pages.data(),
                       &last_hist,
                       kernels::PageEncoding::kInt2Uniform};
      p.segments[2] = {run.cache->bf16_pool().base(),
                       run.cache->bf16_pool().slot_bytes(),
                       ip_recent,
                       recent_pages.data(),
                       &last_recent,
                       kernels::PageEncoding::kBf16};
      std::vector<float> expect(static_cast<size_t>(heads) * d), lse(heads);
      p.out = expect.data();
      p.lse = lse.data();
      ASSERT_EQ(kernels::ValidateSplitDecode(p), nullptr);
      kernels::SplitDecodeAttentionRef(p);
      for (int i = 0; i < heads * d; ++i) {
        ASSERT_NEAR(out[static_cast<int64_t>(t) * heads * d + i], expect[i], 2e-4)
            << "layer " << layer << " query " << pos0 + t << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kvstrata::engine
