// The CPU attention kernels on every instruction set this machine runs: sequences of BF16,
// INT2 (both level sets, every group size) and fp32 blocks against the double reference,
// which decodes blocks with the page format's own decoders; and the property the engine's
// exactness rests on, that a row's result does not depend on the rows beside it or on tokens
// of the block past the ones it sees.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/quant.h"

namespace kvstrata::kernels::cpu {
namespace {

std::vector<CpuIsa> Isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

const char* FormatName(BlockFormat f) {
  switch (f) {
    case BlockFormat::kBf16:
      return "bf16";
    case BlockFormat::kInt2Uniform:
      return "int2";
    case BlockFormat::kInt2LloydMax:
      return "int2-lloyd-max";
    case BlockFormat::kF32:
      return "f32";
  }
  return "?";
}

// A block pair of `format` holding `tokens` random rows (K with a few outlier channels, as
// real keys have), in its own storage. The view is made on demand, so a copy never points into
// the block it was copied from.
struct OwnedBlock {
  std::vector<uint8_t> k, v;
  BlockFormat format = BlockFormat::kBf16;
  int tokens = 0;
  KvBlockPair pair() const { return KvBlockPair{format, k.data(), v.data(), tokens}; }
};

OwnedBlock MakeBlock(const KvGeometry& g, BlockFormat format, int tokens, std::mt19937& rng) {
  const int d = g.head_dim;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  OwnedBlock b;
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> rows(static_cast<size_t>(64) * d, 0.0f);
    for (int t = 0; t < tokens; ++t) {
      for (int c = 0; c < d; ++c)
        rows[t * d + c] = normal(rng) * (kind == 0 && c % 17 == 3 ? 4.0f : 1.0f);
    }
    std::vector<uint8_t>& out = kind == 0 ? b.k : b.v;
    switch (format) {
      case BlockFormat::kBf16:
        out.assign(BlockBytes(g, PageEncoding::kBf16), 0xff);  // unfilled rows: NaN patterns
        EncodeBf16Block(rows.data(), tokens, g, out.data());
        break;
      case BlockFormat::kInt2Uniform:
      case BlockFormat::kInt2LloydMax: {
        const PageEncoding e = format == BlockFormat::kInt2Uniform ? PageEncoding::kInt2Uniform
                                                                   : PageEncoding::kInt2LloydMax;
        out.assign(BlockBytes(g, e), 0);
        EncodeInt2Block(rows.data(), tokens, g, /*clip_ratio=*/0.95f, e, kind, out.data());
        break;
      }
      case BlockFormat::kF32:
        out.assign(rows.size() * sizeof(float), 0);
        std::memcpy(out.data(), rows.data(), out.size());
        break;
    }
  }
  b.format = format;
  b.tokens = tokens;
  return b;
}

struct State {
  explicit State(int rows, int d)
      : m(rows),
        l(rows),
        acc(static_cast<size_t>(rows) * d),
        lanes(static_cast<size_t>(rows) * AttentionState::LaneFloats(d) + 16),
        used(rows) {
    // 64-byte aligned lanes
    float* base = lanes.data();
    while (reinterpret_cast<uintptr_t>(base) % 64 != 0) ++base;
    view = AttentionState{m.data(), l.data(), acc.data(), base, used.data(), d};
    InitAttentionState(rows, view);
  }
  std::vector<float> m, l, acc, lanes;
  std::vector<int> used;
  AttentionState view;
};

// Runs rows over the blocks (row r sees visible[r][b] tokens of block b) and returns acc / l.
std::vector<float> RunBlocks(CpuIsa isa, const KvGeometry& g, const std::vector<OwnedBlock>& blocks,
                       const std::vector<float>& q, int rows, const std::vector<int>& visible,
                       float scale) {
  const int d = g.head_dim;
  State st(rows, d);
  const int nb = static_cast<int>(blocks.size());
  for (int b = 0; b < nb; ++b) {
    std::vector<int> vis(rows);
    for (int r = 0; r < rows; ++r) vis[r] = visible[r * nb + b];
    AttendBlock(isa, g, blocks[b].pair(), QueryRows{q.data(), rows, vis.data(), scale}, st.view);
  }
  FinishAttentionState(isa, g, rows, st.view);
  std::vector<float> out(static_cast<size_t>(rows) * d);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < d; ++c) out[r * d + c] = st.acc[r * d + c] / st.l[r];
  }
  return out;
}

struct Case {
  int head_dim;
  int group_size;
  BlockFormat history;  // the format of the middle blocks
};

class CpuAttentionTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAttentionTest, MatchesTheDoubleReferenceOnEveryPath) {
  const Case c = GetParam();
  const KvGeometry g{/*num_layers=*/1, /*num_kv_heads=*/1, c.head_dim, c.group_size, 64};
  const int d = c.head_dim;
  std::mt19937 rng(3 + d + c.group_size);
  // A BF16 sink, two history blocks, a partly filled BF16 block (the end of a window).
  std::vector<OwnedBlock> blocks;
  blocks.push_back(MakeBlock(g, BlockFormat::kBf16, 64, rng));
  blocks.push_back(MakeBlock(g, c.history, 64, rng));
  blocks.push_back(MakeBlock(g, c.history, 64, rng));
  blocks.push_back(MakeBlock(g, BlockFormat::kBf16, 37, rng));
  const int nb = static_cast<int>(blocks.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const int rows : {1, 3, 9, 16, 19}) {
    std::vector<float> q(static_cast<size_t>(rows) * d);
    for (float& x : q) x = 0.7f * normal(rng);
    std::vector<int> visible(static_cast<size_t>(rows) * nb);
    for (int r = 0; r < rows; ++r) {
      for (int b = 0; b < nb; ++b) visible[r * nb + b] = blocks[b].tokens;
      visible[r * nb + nb - 1] = 1 + (r * 7) % 37;   // causal: rows stop at different tokens
      if (r % 4 == 1) visible[r * nb + nb - 1] = 0;  // and some do not reach the last block
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<KvBlockPair> pairs;
    for (const OwnedBlock& b : blocks) pairs.push_back(b.pair());
    std::vector<float> want(static_cast<size_t>(rows) * d);
    AttendBlocksRef(g, pairs.data(), nb, q.data(), rows, visible.data(), scale, want.data());
    for (const CpuIsa isa : Isas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " d=" + std::to_string(d) +
                   " G=" + std::to_string(c.group_size) + " " + FormatName(c.history) +
                   " rows=" + std::to_string(rows));
      const std::vector<float> got = RunBlocks(isa, g, blocks, q, rows, visible, scale);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 2e-5f + 2e-5f * std::fabs(want[i])) << "element " << i;
      }
    }
  }
}

TEST_P(CpuAttentionTest, ARowsResultDependsOnItsOwnTokensOnly) {
  const Case c = GetParam();
  const KvGeometry g{1, 1, c.head_dim, c.group_size, 64};
  const int d = c.head_dim;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Full blocks, and the same last block once with 20 tokens and once with 64 (the first 20
  // identical): a decode step sees the former, a prefill chunk the latter.
  std::vector<OwnedBlock> blocks = {MakeBlock(g, BlockFormat::kBf16, 64, rng),
                                    MakeBlock(g, c.history, 64, rng)};
  OwnedBlock last_full = MakeBlock(g, BlockFormat::kBf16, 64, rng);
  OwnedBlock last_short = last_full;
  last_short.tokens = 20;
  const int rows = 11, target = 6;
  std::vector<float> q(static_cast<size_t>(rows) * d);
  for (float& x : q) x = normal(rng);
  for (const CpuIsa isa : Isas()) {
    SCOPED_TRACE(std::string(CpuIsaName(isa)) + " d=" + std::to_string(d) +
                 " G=" + std::to_string(c.group_size) + " " + FormatName(c.history));
    // All rows together, the last block full; the target row alone, the last block short.
    std::vector<OwnedBlock> together = blocks, alone = blocks;
    together.push_back(last_full);
    alone.push_back(last_short);
    std::vector<int> vis_together(rows * 3), vis_alone = {64, 64, 20};
    for (int r = 0; r < rows; ++r) {
      vis_together[r * 3] = 64;
      vis_together[r * 3 + 1] = 64;
      vis_together[r * 3 + 2] = r == target ? 20 : 1 + 5 * r;
    }
    const std::vector<float> all = RunBlocks(isa, g, together, q, rows, vis_together, 0.125f);
    const std::vector<float> q_one(q.begin() + target * d, q.begin() + (target + 1) * d);
    const std::vector<float> one = RunBlocks(isa, g, alone, q_one, 1, vis_alone, 0.125f);
    ASSERT_EQ(0, std::memcmp(one.data(), all.data() + target * d, d * sizeof(float)));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CpuAttentionTest,
    ::testing::Values(
        Case{64, 64, BlockFormat::kInt2Uniform}, Case{64, 32, BlockFormat::kInt2Uniform},
        Case{64, 16, BlockFormat::kInt2LloydMax}, Case{64, 64, BlockFormat::kInt2LloydMax},
        Case{64, 64, BlockFormat::kF32}, Case{64, 64, BlockFormat::kBf16},
        Case{128, 128, BlockFormat::kInt2Uniform}, Case{128, 64, BlockFormat::kInt2LloydMax},
        Case{128, 32, BlockFormat::kInt2Uniform}, Case{128, 16, BlockFormat::kInt2Uniform},
        Case{128, 128, BlockFormat::kBf16}, Case{128, 128, BlockFormat::kF32}),
    [](const auto& info) {
      std::string s = std::string(FormatName(info.param.history)) + "_d" +
                      std::to_string(info.param.head_dim) + "_g" +
                      std::to_string(info.param.group_size);
      for (char& ch : s) {
        if (ch == '-') ch = '_';
      }
      return s;
    });

// An evaluation codec's per-token score bias on fp32 blocks (kernels/history_codec.h, "jb"):
// every path adds Σ_j f[r][j]·c[t][j] to the scaled score, as the reference does, and the bias
// moves the output (a kernel that ignored it would fail both checks).
TEST(CpuAttentionScoreBias, EveryPathAddsTheBiasAsTheReferenceDoes) {
  for (const int d : {64, 128}) {
    const KvGeometry g{1, 1, d, d, 64};
    std::mt19937 rng(41 + d);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> unit(0.0f, 1.0f);
    constexpr int kTerms = 3;
    const std::vector<OwnedBlock> blocks = {MakeBlock(g, BlockFormat::kBf16, 64, rng),
                                            MakeBlock(g, BlockFormat::kF32, 64, rng),
                                            MakeBlock(g, BlockFormat::kF32, 45, rng)};
    std::vector<std::vector<float>> coef(3);
    for (int b = 1; b < 3; ++b) {
      coef[b].resize(64 * kTerms);
      for (float& x : coef[b]) x = 0.4f * unit(rng);
    }
    const int rows = 7, nb = 3;
    std::vector<float> q(static_cast<size_t>(rows) * d), f(rows * kTerms);
    for (float& x : q) x = 0.7f * normal(rng);
    for (float& x : f) x = 2.0f * unit(rng);
    std::vector<int> visible(rows * nb);
    for (int r = 0; r < rows; ++r)
      visible[r * nb] = 64, visible[r * nb + 1] = 64, visible[r * nb + 2] = 1 + 6 * r;
    std::vector<KvBlockPair> pairs;
    for (int b = 0; b < nb; ++b) {
      KvBlockPair p = blocks[b].pair();
      if (b > 0) p.score_bias = coef[b].data(), p.bias_terms = kTerms;
      pairs.push_back(p);
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> want(static_cast<size_t>(rows) * d), unbiased(want.size());
    AttendBlocksRef(g, pairs.data(), nb, q.data(), rows, visible.data(), scale, want.data(),
                    f.data());
    AttendBlocksRef(g, pairs.data(), nb, q.data(), rows, visible.data(), scale, unbiased.data(),
                    /*bias_features=*/nullptr);  // the reference without features: no bias
    double moved = 0.0;
    for (size_t i = 0; i < want.size(); ++i)
      moved = std::max<double>(moved, std::fabs(want[i] - unbiased[i]));
    EXPECT_GT(moved, 1e-2);
    for (const CpuIsa isa : Isas()) {
      SCOPED_TRACE(std::string(CpuIsaName(isa)) + " d=" + std::to_string(d));
      State st(rows, d);
      for (int b = 0; b < nb; ++b) {
        std::vector<int> vis(rows);
        for (int r = 0; r < rows; ++r) vis[r] = visible[r * nb + b];
        QueryRows qr{q.data(), rows, vis.data(), scale};
        if (b > 0) qr.bias_features = f.data();
        AttendBlock(isa, g, pairs[b], qr, st.view);
      }
      FinishAttentionState(isa, g, rows, st.view);
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < d; ++c) {
          const float got = st.acc[r * d + c] / st.l[r];
          ASSERT_NEAR(got, want[r * d + c], 2e-5f + 2e-5f * std::fabs(want[r * d + c]))
              << "row " << r << " channel " << c;
        }
      }
    }
  }
}

TEST(CpuExpTest, WithinThreeUlpsOfTheLibraryAndZeroBelowTheRange) {
  std::vector<float> xs;
  for (float x = -100.0f; x <= 88.0f; x += 0.0137f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-8f, -1e-8f, 88.0f, -87.3f, -87.34f}) xs.push_back(x);
  xs.push_back(-std::numeric_limits<float>::infinity());
  for (const CpuIsa isa : Isas()) {
    SCOPED_TRACE(CpuIsaName(isa));
    std::vector<float> got = xs;
    ExpInPlace(isa, got.data(), static_cast<int>(got.size()));
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      if (x < -87.3366f) {
        ASSERT_EQ(got[i], 0.0f) << "exp(" << x << ")";
        continue;
      }
      const double want = std::exp(double{x});
      ASSERT_LE(std::fabs(got[i] - want), 3.0 * std::ldexp(1.0, std::ilogb(want) - 23) + 1e-45)
          << "exp(" << x << ")";
    }
    EXPECT_EQ(got[xs.size() - 8 + 0], 1.0f);  // exp(0) is exactly 1: equal maxima rescale by 1
  }
}

}  // namespace
}  // namespace kvstrata::kernels::cpu
