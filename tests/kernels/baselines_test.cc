#include "kernels/baselines.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/rotation.h"

namespace kvstrata::kernels {
namespace {

double RelMse(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += x[i] * x[i];
  return num / den;
}

// Key-like rows: Gaussian with a few outlier channels, the case rotations exist for.
std::vector<float> KeyLikeRows(int n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(n * d);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < d; ++i) {
      const float amp = (i == 3 || i == 17) ? 12.0f : 1.0f;
      x[t * d + i] = amp * normal(rng) + (i == 3 ? 20.0f : 0.0f);
    }
  }
  return x;
}

TEST(E4M3, EveryCodeRoundTripsAndKnownValues) {
  for (int v = 0; v < 256; ++v) {
    const float f = E4M3ToFloat(static_cast<uint8_t>(v));
    if (std::isnan(f)) continue;
    if (f == 0.0f) continue;  // +0 and -0 both decode to zero
    EXPECT_EQ(FloatToE4M3(f), v) << v;
  }
  EXPECT_EQ(E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), 0.001953125f);           // smallest subnormal, 2^-9
  EXPECT_EQ(E4M3ToFloat(0x08), 0.015625f);              // smallest normal, 2^-6
  EXPECT_EQ(FloatToE4M3(1e6f), 0x7e);                   // saturates
  EXPECT_EQ(E4M3ToFloat(FloatToE4M3(1.0625f)), 1.0f);   // tie, to even
  EXPECT_EQ(E4M3ToFloat(FloatToE4M3(1.1875f)), 1.25f);  // tie, to even
}

TEST(FakeQuant, ErrorsAreOrderedByBitsOnGaussianRows) {
  const int n = 256, d = 128;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> x(n * d);
  for (auto& v : x) v = normal(rng);
  std::vector<float> bf16(x.size()), fp8(x.size()), int4(x.size()), int2(x.size()), turbo(x.size());
  FakeQuantBf16(x.data(), n, d, bf16.data());
  FakeQuantFp8E4M3(x.data(), n, d, fp8.data());
  FakeQuantInt4(x.data(), n, d, 128, int4.data());
  FakeQuantNaiveInt2(x.data(), n, d, 128, int2.data());
  FakeQuantTurbo3(x.data(), n, d, 42, turbo.data());
  const double e_bf16 = RelMse(x, bf16), e_fp8 = RelMse(x, fp8), e_int4 = RelMse(x, int4),
               e_int2 = RelMse(x, int2), e_turbo = RelMse(x, turbo);
  EXPECT_LT(e_bf16, 1e-5);
  EXPECT_LT(e_bf16, e_fp8);
  EXPECT_LT(e_fp8, e_int4);
  EXPECT_LT(e_int4, e_turbo);
  // 3-bit Lloyd-Max on a Gaussian: MSE 0.0345 of the variance
  EXPECT_NEAR(e_turbo, 0.0345, 0.006);
  EXPECT_LT(e_turbo, e_int2);
}

TEST(FakeQuant, HadamardBeatsNaiveInt2OnOutlierChannels) {
  const int n = 256, d = 128;
  const std::vector<float> x = KeyLikeRows(n, d, 1);
  std::vector<double> hd(d * d);
  HadamardMatrix(d, hd.data());
  std::vector<float> h(d * d), had2(x.size()), int2(x.size());
  for (int i = 0; i < d * d; ++i) h[i] = static_cast<float>(hd[i]);
  FakeQuantRotatedInt2(x.data(), n, d, 128, h.data(), 1.0f, PageEncoding::kInt2Uniform,
                       had2.data());
  FakeQuantNaiveInt2(x.data(), n, d, 128, int2.data());
  EXPECT_LT(RelMse(x, had2), 0.5 * RelMse(x, int2));
}

TEST(FakeQuant, IdentityRotationEqualsNaiveInt2) {
  const int n = 64, d = 64;
  const std::vector<float> x = KeyLikeRows(n, d, 2);
  std::vector<float> eye(d * d), a(x.size()), b(x.size());
  IdentityRotation(d, eye.data());
  FakeQuantRotatedInt2(x.data(), n, d, 32, eye.data(), 1.0f, PageEncoding::kInt2Uniform, a.data());
  FakeQuantNaiveInt2(x.data(), n, d, 32, b.data());
  EXPECT_EQ(a, b);
}

TEST(FakeQuant, Int4ErrorWithinHalfAStep) {
  const int n = 32, d = 128;
  const std::vector<float> x = KeyLikeRows(n, d, 3);
  std::vector<float> y(x.size());
  FakeQuantInt4(x.data(), n, d, 64, y.data());
  for (int t = 0; t < n; ++t) {
    for (int g = 0; g < d; g += 64) {
      float lo = 1e30f, hi = -1e30f;
      for (int i = 0; i < 64; ++i)
        lo = std::min(lo, x[t * d + g + i]), hi = std::max(hi, x[t * d + g + i]);
      const float half_step = (hi - lo) / 15 / 2;
      for (int i = 0; i < 64; ++i) {
        ASSERT_LE(std::fabs(y[t * d + g + i] - x[t * d + g + i]),
                  half_step * 1.01f + (std::fabs(lo) + (hi - lo)) / 512);
      }
    }
  }
}

TEST(FakeQuant, KiviKeepsTheResidualAndQuantisesPerChannel) {
  const int n = 100, d = 64, group = 32, residual = 32;
  std::vector<float> x(n * d);
  // channel c is constant c over tokens, so per-channel quantisation is exact
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) x[t * d + c] = static_cast<float>(c) + (t >= 64 ? 0.3f : 0.0f);
  std::vector<float> k(x.size()), v(x.size());
  FakeQuantKivi2Keys(x.data(), n, d, group, residual, k.data());
  FakeQuantKivi2Values(x.data(), n, d, group, group, residual, v.data());
  EXPECT_EQ(Kivi2QuantizedTokens(n, group, residual), 64);
  for (int t = 0; t < 64; ++t)
    for (int c = 0; c < d; ++c) EXPECT_EQ(k[t * d + c], x[t * d + c]);  // constant channels
  for (int t = 64; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      EXPECT_EQ(k[t * d + c], RoundToBf16(x[t * d + c]));  // residual, full precision
      EXPECT_EQ(v[t * d + c], RoundToBf16(x[t * d + c]));
    }
  // Values are per token: a row 0..63 split into groups of 32 is not exact at 2 bits.
  double err = 0;
  for (int i = 0; i < 64 * d; ++i) err += std::fabs(v[i] - x[i]);
  EXPECT_GT(err, 1.0);
}

}  // namespace
}  // namespace kvstrata::kernels
