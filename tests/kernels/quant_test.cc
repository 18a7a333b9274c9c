#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/int2_key_bytes.h"

namespace kvstrata::kernels {
namespace {

TEST(Layout, CodeBitsAreABijectionOntoTheCodeArea) {
  for (int d : {64, 128}) {
    std::vector<bool> k_seen(2 * d, false), v_seen(64 * 2 * d, false);
    for (int c = 0; c < d; ++c) {
      const int bit = KCodeBit(c, d);
      ASSERT_EQ(bit % 2, 0);
      ASSERT_LT(bit, 2 * d);
      ASSERT_FALSE(k_seen[bit]) << "K channel " << c;
      k_seen[bit] = true;
    }
    for (int t = 0; t < 64; ++t) {
      for (int c = 0; c < d; ++c) {
        const int bit = VCodeBit(t, c, d);
        ASSERT_EQ(bit % 2, 0);
        ASSERT_LT(bit, 64 * 2 * d);
        ASSERT_FALSE(v_seen[bit]) << "V token " << t << " channel " << c;
        v_seen[bit] = true;
      }
    }
  }
}

// The integer keys' byte order (kernels/int2_key_bytes.h): byte j, bit pair qq of lane t's word
// wi is the channel whose KCodeBit is there, and the positions cover every channel once.
TEST(Layout, KeyBytesInvertKCodeBit) {
  for (int d : {64, 128}) {
    std::vector<bool> seen(d, false);
    for (int t = 0; t < 4; ++t) {
      for (int wi = 0; wi < d / 64; ++wi) {
        for (int qq = 0; qq < 4; ++qq) {
          for (int j = 0; j < 4; ++j) {
            const int c = KCodeByteChannel(wi, qq, j, t);
            ASSERT_GE(c, 0);
            ASSERT_LT(c, d);
            EXPECT_EQ(KCodeBit(c, d), 32 * (t * (d / 64) + wi) + 8 * j + 2 * qq)
                << "head_dim " << d << " lane " << t << " word " << wi << " pair " << qq << " byte "
                << j;
            EXPECT_FALSE(seen[c]) << "channel " << c;
            seen[c] = true;
          }
        }
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), true), d);
  }
}

TEST(Layout, HandComputedPositions) {
  // K (head_dim 128): pair p of word w holds its codes at bits 2p and 16 + 2p.
  EXPECT_EQ(KCodeBit(0, 128), 0);    // s=0 t=0 pair 0, low element
  EXPECT_EQ(KCodeBit(1, 128), 16);   // high element of the same pair
  EXPECT_EQ(KCodeBit(8, 128), 2);    // the "+8" half: pair 1
  EXPECT_EQ(KCodeBit(16, 128), 4);   // next k-step: pair 2
  EXPECT_EQ(KCodeBit(2, 128), 64);   // thread t=1: its words start at word 2
  EXPECT_EQ(KCodeBit(64, 128), 32);  // k-step 4 goes to the thread's second word
  EXPECT_EQ(KCodeBit(2, 64), 32);    // head_dim 64: one word per thread
  // V (head_dim 128): tokens pair up inside a word; lanes interleave 16-byte chunks.
  EXPECT_EQ(VCodeBit(0, 0, 128), 0);
  EXPECT_EQ(VCodeBit(1, 0, 128), 16);     // token 1: high element
  EXPECT_EQ(VCodeBit(0, 8, 128), 2);      // channel 8: the thread's next channel, pair 1
  EXPECT_EQ(VCodeBit(2, 0, 128), 128);    // tokens 2-3 belong to lane 1: word 4
  EXPECT_EQ(VCodeBit(0, 1, 128), 512);    // channel 1 belongs to lane 4: word 16
  EXPECT_EQ(VCodeBit(8, 0, 128), 64);     // tokens 8-9: slot 2 of lane 0
  EXPECT_EQ(VCodeBit(16, 0, 128), 4096);  // second k-step: chunk 1 (word 128)
  EXPECT_EQ(VCodeBit(0, 64, 128), 32);    // channels 64..127: the thread's second word
}

TEST(Pack, RoundTripsEveryCodeInEveryPosition) {
  std::mt19937 rng(1);
  for (int d : {64, 128}) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<uint8_t> codes(d), packed(d / 4, 0xFF), back(d);
      for (auto& c : codes) c = rng() & 3;
      PackKRow(codes.data(), d, packed.data());
      UnpackKRow(packed.data(), d, back.data());
      ASSERT_EQ(codes, back);
      std::vector<uint8_t> vcodes(64 * d), vpacked(64 * d / 4, 0xFF), vback(64 * d);
      for (auto& c : vcodes) c = rng() & 3;
      PackVBlock(vcodes.data(), d, vpacked.data());
      UnpackVBlock(vpacked.data(), d, vback.data());
      ASSERT_EQ(vcodes, vback);
    }
  }
}

TEST(Clip, ThresholdIsTheOrderStatistic) {
  std::vector<float> x(128);
  for (int i = 0; i < 128; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i + 1);
  std::shuffle(x.begin(), x.end(), std::mt19937(3));
  // |x| sorted ascending is 1..128; index floor(0.96 * 128) = 122 holds 123.
  EXPECT_EQ(ClipThreshold(x.data(), 128, 0.96f), 123.0f);
  EXPECT_EQ(ClipThreshold(x.data(), 128, 0.92f), 118.0f);  // index 117
  EXPECT_EQ(ClipThreshold(x.data(), 128, 1.0f), 128.0f);   // no clipping
}

float Fp16Slack(float v) { return std::fabs(v) * (1.0f / 1024.0f) + 1e-7f; }

TEST(UniformInt2, ErrorWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int n : {16, 32, 64, 128}) {
    for (float ratio : {1.0f, 0.96f, 0.9f}) {
      for (int trial = 0; trial < 300; ++trial) {
        std::vector<float> x(n);
        for (auto& v : x) v = normal(rng) + (trial % 7 == 0 ? 40.0f : 0.0f);
        std::vector<uint8_t> codes(n);
        uint16_t s16, m16;
        QuantizeGroupInt2(x.data(), n, ratio, PageEncoding::kInt2Uniform, codes.data(), &s16, &m16);
        const float s = Fp16ToFloat(s16), m = Fp16ToFloat(m16);
        const float tau = ClipThreshold(x.data(), n, ratio);
        float lo = 1e30f, hi = -1e30f;
        for (float v : x)
          lo = std::min(lo, std::clamp(v, -tau, tau)), hi = std::max(hi, std::clamp(v, -tau, tau));
        // Analytic bound: half a step, plus the fp16 rounding of the offset and of 3 steps.
        const float bound = 0.5f * s + Fp16Slack(lo) + 3.0f * Fp16Slack((hi - lo) / 3.0f) + 1e-5f;
        for (int i = 0; i < n; ++i) {
          ASSERT_LE(codes[i], 3);
          const float xc = std::clamp(x[i], -tau, tau);
          const float xhat = m + s * codes[i];
          ASSERT_LE(std::fabs(xhat - xc), bound) << "n=" << n << " ratio=" << ratio;
        }
      }
    }
  }
}

TEST(UniformInt2, ConstantGroupIsExact) {
  std::vector<float> x(64, 2.5f);
  std::vector<uint8_t> codes(64);
  uint16_t s16, m16;
  QuantizeGroupInt2(x.data(), 64, 1.0f, PageEncoding::kInt2Uniform, codes.data(), &s16, &m16);
  EXPECT_EQ(Fp16ToFloat(s16), 0.0f);
  EXPECT_EQ(Fp16ToFloat(m16), 2.5f);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
}

TEST(UniformInt2, FourLevelsAreReproducedExactly) {
  // Values already on a representable grid come back exactly.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = -1.0f + 0.5f * (i % 4);
  std::vector<uint8_t> codes(32);
  uint16_t s16, m16;
  QuantizeGroupInt2(x.data(), 32, 1.0f, PageEncoding::kInt2Uniform, codes.data(), &s16, &m16);
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(codes[i], i % 4);
    EXPECT_EQ(Fp16ToFloat(m16) + Fp16ToFloat(s16) * codes[i], x[i]);
  }
}

TEST(LloydMaxInt2, MseMatchesGaussianTheory) {
  // The 4-level Lloyd-Max quantiser of a unit Gaussian has MSE 0.1175; a uniform min-max grid
  // over 128 Gaussian samples does clearly worse (about 0.19 here).
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(1.0f, 2.0f);
  double lm_err = 0, uni_err = 0, var = 0;
  const int n = 128;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<float> x(n), lm(n), uni(n);
    for (auto& v : x) v = normal(rng);
    std::vector<uint8_t> codes(n);
    uint16_t params[2];
    QuantizeRowInt2(x.data(), n, n, 1.0f, PageEncoding::kInt2LloydMax, codes.data(), params);
    DequantizeRowInt2(codes.data(), params, n, n, PageEncoding::kInt2LloydMax, lm.data());
    QuantizeRowInt2(x.data(), n, n, 1.0f, PageEncoding::kInt2Uniform, codes.data(), params);
    DequantizeRowInt2(codes.data(), params, n, n, PageEncoding::kInt2Uniform, uni.data());
    for (int i = 0; i < n; ++i) {
      lm_err += (x[i] - lm[i]) * (x[i] - lm[i]);
      uni_err += (x[i] - uni[i]) * (x[i] - uni[i]);
      var += (x[i] - 1.0) * (x[i] - 1.0);
    }
  }
  EXPECT_NEAR(lm_err / var, 0.1175, 0.01);
  EXPECT_GT(uni_err / var, lm_err / var * 1.3);
}

TEST(Blocks, Int2BlocksRoundTripThroughTheLayout) {
  KvGeometry g{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 128, .group_size = 64, .page_tokens = 64};
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  for (int kind : {0, 1}) {
    for (int tokens : {64, 37}) {
      std::vector<float> rows(64 * 128), back(64 * 128), row_back(128);
      for (auto& v : rows) v = normal(rng);
      std::vector<uint8_t> block(BlockBytes(g, PageEncoding::kInt2Uniform), 0xAB);
      EncodeInt2Block(rows.data(), tokens, g, 0.96f, PageEncoding::kInt2Uniform, kind,
                      block.data());
      DecodeInt2Block(block.data(), tokens, g, PageEncoding::kInt2Uniform, kind, back.data());
      for (int t = 0; t < tokens; ++t) {
        std::vector<uint8_t> codes(128);
        uint16_t params[4];
        QuantizeRowInt2(rows.data() + t * 128, 128, 64, 0.96f, PageEncoding::kInt2Uniform,
                        codes.data(), params);
        DequantizeRowInt2(codes.data(), params, 128, 64, PageEncoding::kInt2Uniform,
                          row_back.data());
        for (int i = 0; i < 128; ++i) ASSERT_EQ(back[t * 128 + i], row_back[i]) << kind;
        // params of token t follow all codes, {scale, offset} per group
        ASSERT_EQ(std::memcmp(block.data() + 64 * 32 + t * 8, params, 8), 0);
      }
    }
  }
}

TEST(Blocks, Bf16BlockRoundTrip) {
  KvGeometry g{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 64, .group_size = 64, .page_tokens = 64};
  std::vector<float> rows(10 * 64), back(10 * 64);
  for (int i = 0; i < 640; ++i) rows[i] = 0.37f * i - 11.0f;
  std::vector<uint8_t> block(BlockBytes(g, PageEncoding::kBf16));
  EncodeBf16Block(rows.data(), 10, g, block.data());
  DecodeBf16Block(block.data(), 10, g, back.data());
  for (int i = 0; i < 640; ++i) EXPECT_EQ(back[i], RoundToBf16(rows[i]));
}

}  // namespace
}  // namespace kvstrata::kernels
