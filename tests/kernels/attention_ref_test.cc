#include "kernels/attention_ref.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/quant.h"

namespace kvstrata::kernels {
namespace {

// A pool of pages of one encoding, filled from float K/V rows, and the CSR view over it.
struct SegmentPool {
  PageEncoding encoding;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> indptr{0}, indices, last_len;
  int64_t stride = 0;
};

struct Case {
  int batch, q_heads, kv_heads, head_dim, group, layers;
  std::vector<int> sink, history, recent;  // tokens per sequence in each segment
};

// Dense float64 attention of q over rows K, V (already dequantised), the independent check.
void DenseAttention(const float* q, const std::vector<float>& k, const std::vector<float>& v, int d,
                    double scale, std::vector<double>* o) {
  const int n = static_cast<int>(k.size()) / d;
  o->assign(d, 0.0);
  if (n == 0) return;
  std::vector<double> s(n);
  double m = -std::numeric_limits<double>::infinity();
  for (int t = 0; t < n; ++t) {
    double dot = 0;
    for (int i = 0; i < d; ++i) dot += double{q[i]} * k[t * d + i];
    s[t] = dot * scale;
    m = std::max(m, s[t]);
  }
  double z = 0;
  for (int t = 0; t < n; ++t) z += std::exp(s[t] - m);
  for (int t = 0; t < n; ++t) {
    const double w = std::exp(s[t] - m) / z;
    for (int i = 0; i < d; ++i) (*o)[i] += w * v[t * d + i];
  }
}

void RunCase(const Case& c, uint32_t seed) {
  SCOPED_TRACE("batch=" + std::to_string(c.batch) + " heads=" + std::to_string(c.q_heads) + "/" +
               std::to_string(c.kv_heads) + " d=" + std::to_string(c.head_dim) +
               " g=" + std::to_string(c.group));
  KvGeometry g{.num_layers = c.layers,
               .num_kv_heads = c.kv_heads,
               .head_dim = c.head_dim,
               .group_size = c.group,
               .page_tokens = 64};
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int d = c.head_dim;
  const int layer = c.layers - 1;
  // dense[b][kv_head] holds the dequantised K and V of every visible token, in segment order
  std::vector<std::vector<std::vector<float>>> dense_k(c.batch), dense_v(c.batch);
  for (int b = 0; b < c.batch; ++b) dense_k[b].resize(c.kv_heads), dense_v[b].resize(c.kv_heads);

  SegmentPool pools[3] = {
      {PageEncoding::kBf16}, {PageEncoding::kInt2Uniform}, {PageEncoding::kBf16}};
  if (seed % 2) pools[1].encoding = PageEncoding::kInt2LloydMax;
  const std::vector<int>* tokens[3] = {&c.sink, &c.history, &c.recent};
  for (int s = 0; s < 3; ++s) {
    SegmentPool& pool = pools[s];
    pool.stride = PageBytes(g, pool.encoding) + 64;  // slack between slots must be harmless
    int slot = 0;
    std::vector<std::vector<uint8_t>> pages;
    for (int b = 0; b < c.batch; ++b) {
      const int n = (*tokens[s])[b];
      const int num_pages = (n + 63) / 64;
      for (int p = 0; p < num_pages; ++p) {
        const int len = std::min(64, n - p * 64);
        std::vector<uint8_t> page(pool.stride, 0xCD);
        for (int l = 0; l < c.layers; ++l) {
          for (int kind = 0; kind < 2; ++kind) {
            for (int h = 0; h < c.kv_heads; ++h) {
              std::vector<float> rows(len * d), deq(len * d);
              for (auto& v : rows) v = normal(rng) * (kind == 0 ? 2.0f : 1.0f);
              uint8_t* block = page.data() + BlockOffset(g, pool.encoding, l, kind, h);
              if (IsInt2(pool.encoding)) {
                EncodeInt2Block(rows.data(), len, g, 0.96f, pool.encoding, kind, block);
                DecodeInt2Block(block, len, g, pool.encoding, kind, deq.data());
              } else {
                EncodeBf16Block(rows.data(), len, g, block);
                DecodeBf16Block(block, len, g, deq.data());
              }
              if (l == layer) {
                auto& dst = kind == 0 ? dense_k[b][h] : dense_v[b][h];
                dst.insert(dst.end(), deq.begin(), deq.end());
              }
            }
          }
        }
        pages.push_back(std::move(page));
        pool.indices.push_back(slot++);
      }
      pool.indptr.push_back(static_cast<int32_t>(pool.indices.size()));
      pool.last_len.push_back(n == 0 ? 0 : n - (num_pages - 1) * 64);
    }
    // Store the slots in reverse order so slot ids and page order differ.
    std::reverse(pages.begin(), pages.end());
    for (auto& idx : pool.indices) idx = slot - 1 - idx;
    for (auto& page : pages) pool.bytes.insert(pool.bytes.end(), page.begin(), page.end());
  }

  SplitDecodeParams p;
  std::vector<float> q(c.batch * c.q_heads * d), out(q.size()), lse(c.batch * c.q_heads);
  for (auto& v : q) v = normal(rng) * 0.5f;
  p.q = q.data();
  p.batch = c.batch;
  p.num_q_heads = c.q_heads;
  p.layer = layer;
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.geometry = g;
  for (int s = 0; s < 3; ++s) {
    p.segments[s] =
        PagedSegmentView{pools[s].bytes.data(),   pools[s].stride,          pools[s].indptr.data(),
                         pools[s].indices.data(), pools[s].last_len.data(), pools[s].encoding};
  }
  p.out = out.data();
  p.lse = lse.data();
  ASSERT_EQ(ValidateSplitDecode(p), nullptr);
  SplitDecodeAttentionRef(p);

  const int ratio = c.q_heads / c.kv_heads;
  for (int b = 0; b < c.batch; ++b) {
    for (int h = 0; h < c.q_heads; ++h) {
      std::vector<double> expect;
      const float* qh = q.data() + (b * c.q_heads + h) * d;
      DenseAttention(qh, dense_k[b][h / ratio], dense_v[b][h / ratio], d, p.sm_scale, &expect);
      double norm = 1e-12;
      for (double v : expect) norm = std::max(norm, std::fabs(v));
      for (int i = 0; i < d; ++i) {
        ASSERT_NEAR(out[(b * c.q_heads + h) * d + i], expect[i], 1e-5 * norm + 1e-7)
            << "b=" << b << " h=" << h << " i=" << i;
      }
      const int total = c.sink[b] + c.history[b] + c.recent[b];
      if (total == 0) {
        EXPECT_EQ(lse[b * c.q_heads + h], -std::numeric_limits<float>::infinity());
      } else {
        EXPECT_TRUE(std::isfinite(lse[b * c.q_heads + h]));
      }
    }
  }
}

TEST(SplitDecode, MatchesDenseAttentionAcrossShapes) {
  std::mt19937 rng(123);
  int cases = 0;
  for (int head_dim : {64, 128}) {
    for (int ratio : {1, 2, 3, 4, 8}) {
      for (int group : {32, 64, 128}) {
        if (group > head_dim) continue;
        Case c;
        c.batch = 1 + rng() % 3;
        c.kv_heads = 1 + rng() % 2;
        c.q_heads = c.kv_heads * ratio;
        c.head_dim = head_dim;
        c.group = group;
        c.layers = 2;
        for (int b = 0; b < c.batch; ++b) {
          // odd lengths, and now and then an empty segment
          c.sink.push_back(rng() % 5 == 0 ? 0 : 1 + rng() % 64);
          c.history.push_back(rng() % 4 == 0 ? 0 : 64 * (1 + rng() % 3));
          c.recent.push_back(rng() % 5 == 0 ? 0 : 1 + rng() % 200);
        }
        RunCase(c, static_cast<uint32_t>(cases++));
      }
    }
  }
  EXPECT_EQ(cases, 25);
}

TEST(SplitDecode, AllSegmentsEmptyGivesZeroAndNegativeInfinity) {
  Case c{.batch = 2,
         .q_heads = 4,
         .kv_heads = 2,
         .head_dim = 64,
         .group = 64,
         .layers = 1,
         .sink = {0, 0},
         .history = {0, 0},
         .recent = {0, 3}};
  RunCase(c, 7);
}

TEST(SplitDecode, RejectsUnsupportedShapes) {
  SplitDecodeParams p;
  float dummy = 0;
  int32_t zero[2] = {0, 0};
  p.q = p.out = p.lse = &dummy;
  p.batch = 1;
  p.num_q_heads = 4;
  p.geometry = {
      .num_layers = 1, .num_kv_heads = 2, .head_dim = 96, .group_size = 32, .page_tokens = 64};
  for (auto& s : p.segments) s.indptr = zero, s.slot_stride = 1 << 20;
  ASSERT_NE(ValidateSplitDecode(p), nullptr);
  EXPECT_NE(std::string(ValidateSplitDecode(p)).find("head_dim"), std::string::npos);
  p.geometry.head_dim = 128;
  EXPECT_EQ(ValidateSplitDecode(p), nullptr);
  p.num_q_heads = 3;
  EXPECT_NE(std::string(ValidateSplitDecode(p)).find("num_q_heads"), std::string::npos);
  p.num_q_heads = 4;
  p.segments[1].encoding = PageEncoding::kInt2Uniform;
  p.geometry.group_size = 24;
  EXPECT_NE(std::string(ValidateSplitDecode(p)).find("group_size"), std::string::npos);
}

TEST(Merge, IsExactAndHandlesEmptySides) {
  const float oa[2] = {1.0f, 2.0f}, ob[2] = {3.0f, -1.0f};
  float o[2], lse;
  MergeAttentionStates(oa, std::log(1.0f), ob, std::log(3.0f), 2, o, &lse);
  EXPECT_NEAR(o[0], (1 * 1.0 + 3 * 3.0) / 4, 1e-6);
  EXPECT_NEAR(o[1], (1 * 2.0 - 3 * 1.0) / 4, 1e-6);
  EXPECT_NEAR(lse, std::log(4.0), 1e-6);
  const float inf = std::numeric_limits<float>::infinity();
  MergeAttentionStates(oa, -inf, ob, 0.5f, 2, o, &lse);
  EXPECT_EQ(o[0], 3.0f);
  EXPECT_EQ(lse, 0.5f);
}

}  // namespace
}  // namespace kvstrata::kernels
