#include "kernels/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace kvstrata::kernels {
namespace {

TEST(Pack, RoundTripsEveryCodeInEveryPosition) {
  std::mt19937 rng(1);
  for (int n : {16, 32, 64, 128}) {
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> codes(n), packed(n / 4), back(n);
      for (auto& c : codes) c = rng() & 3;
      PackGroupCodes(codes.data(), n, packed.data());
      UnpackGroupCodes(packed.data(), n, back.data());
      ASSERT_EQ(codes, back);
    }
  }
}

TEST(Pack, QuarterLayoutIsAsDocumented) {
  // Channel j + k*n/4 sits at bits 2k of byte j.
  const int n = 128;
  std::vector<uint8_t> codes(n, 0), packed(n / 4);
  codes[5] = 1;        // byte 5, bits 0-1
  codes[5 + 32] = 2;   // byte 5, bits 2-3
  codes[5 + 64] = 3;   // byte 5, bits 4-5
  codes[31 + 96] = 3;  // byte 31, bits 6-7
  PackGroupCodes(codes.data(), n, packed.data());
  EXPECT_EQ(packed[5], 0b00111001);
  EXPECT_EQ(packed[31], 0b11000000);
  for (int j = 0; j < n / 4; ++j) {
    if (j != 5 && j != 31) {
      EXPECT_EQ(packed[j], 0) << j;
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
    std::vector<uint8_t> packed(n / 4);
    uint16_t params[2];
    QuantizeRowInt2(x.data(), n, n, 1.0f, PageEncoding::kInt2LloydMax, packed.data(), params);
    DequantizeRowInt2(packed.data(), params, n, n, PageEncoding::kInt2LloydMax, lm.data());
    QuantizeRowInt2(x.data(), n, n, 1.0f, PageEncoding::kInt2Uniform, packed.data(), params);
    DequantizeRowInt2(packed.data(), params, n, n, PageEncoding::kInt2Uniform, uni.data());
    for (int i = 0; i < n; ++i) {
      lm_err += (x[i] - lm[i]) * (x[i] - lm[i]);
      uni_err += (x[i] - uni[i]) * (x[i] - uni[i]);
      var += (x[i] - 1.0) * (x[i] - 1.0);
    }
  }
  EXPECT_NEAR(lm_err / var, 0.1175, 0.01);
  EXPECT_GT(uni_err / var, lm_err / var * 1.3);
}

TEST(Blocks, Int2BlockRoundTripMatchesRows) {
  KvGeometry g{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 128, .group_size = 64, .page_tokens = 64};
  std::mt19937 rng(2);
  std::normal_distribution<float> normal;
  std::vector<float> rows(64 * 128), back(64 * 128), row_back(128);
  for (auto& v : rows) v = normal(rng);
  std::vector<uint8_t> block(BlockBytes(g, PageEncoding::kInt2Uniform), 0xAB);
  EncodeInt2Block(rows.data(), 64, g, 0.96f, PageEncoding::kInt2Uniform, block.data());
  DecodeInt2Block(block.data(), 64, g, PageEncoding::kInt2Uniform, back.data());
  for (int t = 0; t < 64; ++t) {
    std::vector<uint8_t> packed(32);
    uint16_t params[4];
    QuantizeRowInt2(rows.data() + t * 128, 128, 64, 0.96f, PageEncoding::kInt2Uniform,
                    packed.data(), params);
    DequantizeRowInt2(packed.data(), params, 128, 64, PageEncoding::kInt2Uniform, row_back.data());
    for (int i = 0; i < 128; ++i) ASSERT_EQ(back[t * 128 + i], row_back[i]);
    // codes of token t start at t * head_dim/4, params after all codes
    ASSERT_TRUE(std::equal(packed.begin(), packed.end(), block.begin() + t * 32));
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
