#include "kernels/history_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/numeric.h"
#include "kernels/rotation.h"

namespace kvstrata::kernels {
namespace {

HistoryCodec Parse(const std::string& spec, int d = 64) {
  HistoryCodec c;
  std::string error;
  EXPECT_TRUE(ParseHistoryCodec(spec, d, &c, &error)) << spec << ": " << error;
  return c;
}

std::vector<float> GaussianRows(int n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(n) * d);
  for (auto& v : x) v = normal(rng);
  return x;
}

double RelMse(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) num += (x[i] - y[i]) * (x[i] - y[i]), den += x[i] * x[i];
  return num / den;
}

// The region quantiser written out independently: RMS scale rounded to fp16, every value to
// the level with the smallest error (brute force), reconstruction scale · level.
void ReferenceRegion(const float* z, int n, int bits, float* y) {
  const float* levels = GaussianLloydMaxCentroids(bits);
  double sq = 0;
  for (int i = 0; i < n; ++i) sq += double{z[i]} * z[i];
  const float s = RoundToFp16(static_cast<float>(std::sqrt(sq / n)));
  for (int i = 0; i < n; ++i) {
    int best = 0;
    for (int k = 1; k < (1 << bits); ++k) {
      if (std::fabs(z[i] - s * levels[k]) < std::fabs(z[i] - s * levels[best])) best = k;
    }
    y[i] = s * levels[best];
  }
}

TEST(HistoryCodec, ParsesRecipesAndCountsBits) {
  HistoryCodec c = Parse("2x64|2x64");
  EXPECT_DOUBLE_EQ(HistoryCodecBits(c, 30, 64, 64), 2.25);  // one fp16 norm per row
  c = Parse("3x32+2x32:eig:s8|2x64");
  EXPECT_TRUE(c.all.side[0].eigenbasis);
  EXPECT_EQ(c.all.side[0].scale_bits, 8);
  EXPECT_FALSE(c.all.side[1].eigenbasis);
  EXPECT_DOUBLE_EQ(SideRecipeBits(c.all.side[0], 64, 64), (96 + 64 + 16) / 64.0);
  EXPECT_DOUBLE_EQ(HistoryCodecBits(c, 30, 64, 64), 2.5);
  EXPECT_DOUBLE_EQ(HistoryCodecBits(Parse("int2|bf16"), 30, 64, 64), (2.5 + 16) / 2);
  EXPECT_DOUBLE_EQ(HistoryCodecBits(Parse("turbo3|int2"), 30, 64, 64), (3.25 + 2.5) / 2);
  // Overrides: layers 0 and 29 at 3.25 bits on both sides, the other 28 at 2.25.
  c = Parse("2x64|2x64;0.29=3x64|3x64");
  EXPECT_EQ(c.Side(0, 0).regions[0].bits, 3);
  EXPECT_EQ(c.Side(1, 1).regions[0].bits, 2);
  EXPECT_DOUBLE_EQ(HistoryCodecBits(c, 30, 64, 64), (28 * 2.25 + 2 * 3.25) / 30);
  EXPECT_FLOAT_EQ(Parse("2x64:a0.9|bf16").all.side[0].level_multiplier, 0.9f);
  // A dropped region costs nothing, not even its scale.
  EXPECT_DOUBLE_EQ(SideRecipeBits(Parse("2x32+0x32:s8|bf16").all.side[0], 64, 64), 72 / 64.0);

  std::string error;
  EXPECT_FALSE(ParseHistoryCodec("2x64", 64, &c, &error));
  EXPECT_NE(error.find("K_RECIPE|V_RECIPE"), std::string::npos);
  EXPECT_FALSE(ParseHistoryCodec("2x32|2x64", 64, &c, &error));  // covers 32 of 64
  EXPECT_NE(error.find("cover 32"), std::string::npos);
  EXPECT_FALSE(ParseHistoryCodec("5x64|2x64", 64, &c, &error));
  EXPECT_FALSE(ParseHistoryCodec("2x64:zz|2x64", 64, &c, &error));
  EXPECT_FALSE(ParseHistoryCodec("2x64|2x64;x=2x64|2x64", 64, &c, &error));
}

TEST(HistoryCodec, LloydMaxCentroidsAreTheirCellsMeans) {
  // Each level is the mean of a unit Gaussian over its cell (the cells' edges being the
  // midpoints), by numeric integration: an independent check of the constants.
  for (int bits = 1; bits <= 4; ++bits) {
    const float* L = GaussianLloydMaxCentroids(bits);
    const int n = 1 << bits;
    for (int k = 0; k < n; ++k) {
      const double lo = k == 0 ? -8.0 : 0.5 * (L[k - 1] + L[k]);
      const double hi = k == n - 1 ? 8.0 : 0.5 * (L[k] + L[k + 1]);
      double mass = 0, first = 0;
      const int steps = 20000;
      for (int i = 0; i < steps; ++i) {
        const double x = lo + (hi - lo) * (i + 0.5) / steps;
        const double p = std::exp(-0.5 * x * x);
        mass += p, first += x * p;
      }
      EXPECT_NEAR(first / mass, L[k], 2e-3) << bits << " bits, level " << k;
    }
  }
}

TEST(HistoryCodec, RegionsMatchTheIndependentReference) {
  const int n = 64, d = 64;
  const std::vector<float> x = GaussianRows(n, d, 7);
  HistoryCodec c = Parse("3x16+2x32+1x16|4x32+0x32");
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<float> y(x.size()), want(x.size());
    FakeQuantSide(x.data(), n, d, 64, c.all.side[kind], 1.0f, 0, y.data());
    int c0 = 0;
    for (const CodecRegion& r : c.all.side[kind].regions) {
      for (int t = 0; t < n; ++t) {
        if (r.bits == 0) {
          for (int i = 0; i < r.channels; ++i) want[t * d + c0 + i] = 0.0f;
          continue;
        }
        ReferenceRegion(x.data() + t * d + c0, r.channels, r.bits, want.data() + t * d + c0);
      }
      c0 += r.channels;
    }
    for (size_t i = 0; i < x.size(); ++i) ASSERT_FLOAT_EQ(y[i], want[i]) << kind << " " << i;
  }
}

TEST(HistoryCodec, ErrorFallsWithBitsAsTheGaussianTheoryPredicts) {
  const int n = 512, d = 64;
  const std::vector<float> x = GaussianRows(n, d, 11);
  const double want[5] = {0, 0.3634, 0.1175, 0.03454, 0.009497};  // Lloyd-Max distortions
  for (int bits = 1; bits <= 4; ++bits) {
    const std::string side = std::to_string(bits) + "x64";
    HistoryCodec c = Parse(side + "|" + side);
    std::vector<float> y(x.size());
    FakeQuantSide(x.data(), n, d, 64, c.all.side[0], 1.0f, 0, y.data());
    EXPECT_NEAR(RelMse(x, y), want[bits], 0.1 * want[bits]) << bits;
  }
  // The least-squares refit never increases a row's error.
  HistoryCodec plain = Parse("2x64|2x64"), ls = Parse("2x64:ls|2x64");
  std::vector<float> a(x.size()), b(x.size());
  FakeQuantSide(x.data(), n, d, 64, plain.all.side[0], 1.0f, 0, a.data());
  FakeQuantSide(x.data(), n, d, 64, ls.all.side[0], 1.0f, 0, b.data());
  EXPECT_LE(RelMse(x, b), RelMse(x, a) * 1.001);
  // The norm-preserving scale gives every row back its norm (up to the fp16 scale).
  HistoryCodec np = Parse("2x64:np|2x64");
  FakeQuantSide(x.data(), n, d, 64, np.all.side[0], 1.0f, 0, b.data());
  for (int t = 0; t < n; ++t) {
    double nx = 0, ny = 0;
    for (int i = 0; i < d; ++i)
      nx += x[t * d + i] * x[t * d + i], ny += b[t * d + i] * b[t * d + i];
    EXPECT_NEAR(std::sqrt(ny / nx), 1.0, 2e-3) << t;
  }
}

TEST(HistoryCodec, EigenbasisQuantisesInTheBasisOfU) {
  // Rows stored as y = x·U·H·P. With `eig` the codec must quantise w = x·U·B (B: a Hadamard
  // matrix per region) and return ŵ·Bᵀ·(H·P), built here from H and the bit reversal directly.
  const int n = 64, d = 64;
  std::vector<double> h(d * d), h32(32 * 32);
  HadamardMatrix(d, h.data());
  HadamardMatrix(32, h32.data());
  // (H·P)[i][j] = H[i][bitrev⁻¹(j)]: P sends column i to position bitrev(i).
  std::vector<double> hp(d * d);
  for (int i = 0; i < d; ++i)
    for (int c = 0; c < d; ++c) hp[i * d + BitReverse(c, 6)] = h[i * d + c];
  std::vector<double> b(d * d, 0.0);
  for (int blk = 0; blk < 2; ++blk)
    for (int i = 0; i < 32; ++i)
      for (int j = 0; j < 32; ++j) b[(blk * 32 + i) * d + blk * 32 + j] = h32[i * 32 + j];
  const std::vector<float> y = GaussianRows(n, d, 3);
  HistoryCodec c = Parse("3x32+2x32:eig|2x64");
  std::vector<float> got(y.size());
  FakeQuantSide(y.data(), n, d, 64, c.all.side[0], 1.0f, 0, got.data());
  for (int t = 0; t < n; ++t) {
    // w = y·(H·P)ᵀ·B
    std::vector<double> xu(d, 0.0), w(d, 0.0);
    for (int j = 0; j < d; ++j)
      for (int k = 0; k < d; ++k) xu[j] += y[t * d + k] * hp[j * d + k];
    for (int j = 0; j < d; ++j)
      for (int k = 0; k < d; ++k) w[j] += xu[k] * b[k * d + j];
    std::vector<float> wf(w.begin(), w.end()), wq(d);
    ReferenceRegion(wf.data(), 32, 3, wq.data());
    ReferenceRegion(wf.data() + 32, 32, 2, wq.data() + 32);
    std::vector<double> back(d, 0.0), want(d, 0.0);
    for (int j = 0; j < d; ++j)
      for (int k = 0; k < d; ++k) back[j] += wq[k] * b[j * d + k];
    for (int j = 0; j < d; ++j)
      for (int k = 0; k < d; ++k) want[j] += back[k] * hp[k * d + j];
    for (int j = 0; j < d; ++j) ASSERT_NEAR(got[t * d + j], want[j], 2e-4) << t << " " << j;
  }
}

TEST(HistoryCodec, UniformLevelsAreMaxsOptimalUniformQuantisers) {
  // Max (1960), table of the optimum uniform quantiser for a unit Gaussian: step and error.
  const double step[5] = {0, 1.5958, 0.9957, 0.5860, 0.3352};
  const double error[5] = {0, 0.3634, 0.1188, 0.03744, 0.01154};
  const int n = 512, d = 64;
  const std::vector<float> x = GaussianRows(n, d, 17);
  for (int bits = 1; bits <= 4; ++bits) {
    EXPECT_NEAR(GaussianUniformStep(bits), step[bits], 1e-3) << bits;
    const float* levels = GaussianUniformLevels(bits);
    for (int i = 1; i < (1 << bits); ++i) {
      EXPECT_NEAR(levels[i] - levels[i - 1], GaussianUniformStep(bits), 1e-6) << bits;
    }
    EXPECT_NEAR(levels[0], -levels[(1 << bits) - 1], 1e-6) << bits;
    EXPECT_NEAR(GaussianDistortion(levels, 1 << bits, 1.0), error[bits], 2e-4) << bits;
    // ... and what the codec does with them: its error, and every value a level times the
    // row's one scale (fp16 RMS here).
    const std::string side = std::to_string(bits) + "x64:u";
    HistoryCodec c = Parse(side + "|" + side);
    ASSERT_TRUE(c.all.side[0].uniform_levels);
    EXPECT_EQ(RecipeLevels(c.all.side[0], bits), levels);
    std::vector<float> y(x.size());
    FakeQuantSide(x.data(), n, d, 64, c.all.side[0], 1.0f, 0, y.data());
    EXPECT_NEAR(RelMse(x, y), error[bits], 0.1 * error[bits]) << bits;
    for (int t = 0; t < 4; ++t) {
      double sq = 0;
      for (int i = 0; i < d; ++i) sq += double{x[t * d + i]} * x[t * d + i];
      const float s = RoundToFp16(static_cast<float>(std::sqrt(sq / d)));
      for (int i = 0; i < d; ++i) {
        const double k = y[t * d + i] / (s * GaussianUniformStep(bits)) + 0.5 * ((1 << bits) - 1);
        EXPECT_NEAR(k, std::round(k), 1e-3) << bits << " " << t << " " << i;
      }
    }
  }
  std::string error_text;
  HistoryCodec bad;
  EXPECT_FALSE(ParseHistoryCodec("2x64:uu|2x64", 64, &bad, &error_text));
  EXPECT_NE(error_text.find("uu"), std::string::npos) << error_text;
}

TEST(HistoryCodec, PageRatiosShareOneScalePerRow) {
  // Bits: the 8-bit row scale, plus one 8-bit ratio per region per page of 64 tokens.
  EXPECT_DOUBLE_EQ(SideRecipeBits(Parse("4x16+3x16+2x32:s8:pr|bf16").all.side[0], 64, 64),
                   (64 + 48 + 64 + 8 + 3 * 8.0 / 64) / 64);
  // Rows whose regions differ in energy by fixed factors (what the page ratio models):
  // region k of row t is c_t · f_k · N(0, 1). The page ratios then cost little against a
  // scale per region, and a region's reconstruction uses only levels times one scale.
  const int n = 64, d = 64;
  std::vector<float> x = GaussianRows(n, d, 13);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> mag(0.2f, 5.0f);
  const float f[3] = {4.0f, 1.0f, 0.25f};
  for (int t = 0; t < n; ++t) {
    const float c = mag(rng);
    for (int i = 0; i < d; ++i) x[t * d + i] *= c * f[i < 16 ? 0 : i < 32 ? 1 : 2];
  }
  HistoryCodec own = Parse("4x16+3x16+2x32:s8|bf16"), pr = Parse("4x16+3x16+2x32:s8:pr|bf16");
  std::vector<float> a(x.size()), b(x.size());
  FakeQuantSide(x.data(), n, d, 64, own.all.side[0], 1.0f, 0, a.data());
  FakeQuantSide(x.data(), n, d, 64, pr.all.side[0], 1.0f, 0, b.data());
  EXPECT_LT(RelMse(x, b), 1.3 * RelMse(x, a));
  EXPECT_GT(RelMse(x, b), 0.5 * RelMse(x, a));
  for (int t = 0; t < n; ++t) {
    // within the 2-bit region the values are ± two magnitudes of one scale
    std::vector<float> mags;
    for (int i = 32; i < 64; ++i) {
      const float m = std::fabs(b[t * d + i]);
      if (std::find(mags.begin(), mags.end(), m) == mags.end()) mags.push_back(m);
    }
    ASSERT_LE(mags.size(), 2u);
    if (mags.size() == 2) {
      EXPECT_NEAR(std::max(mags[0], mags[1]) / std::min(mags[0], mags[1]), 1.5104 / 0.4528, 1e-3);
    }
  }
}

TEST(HistoryCodec, LogScaleCodes) {
  EXPECT_EQ(LogScaleCode(0.0f), 0);
  EXPECT_EQ(LogScaleCode(-1.0f), 0);
  EXPECT_EQ(LogScaleValue(0), 0.0f);
  EXPECT_EQ(LogScaleValue(LogScaleCode(1.0f)), 1.0f);
  EXPECT_EQ(LogScaleCode(1e30f), 255);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> e(-15.0f, 10.0f);
  for (int i = 0; i < 1000; ++i) {
    const float s = std::exp2(e(rng));
    const float r = LogScaleValue(LogScaleCode(s)) / s;
    EXPECT_LE(std::fabs(std::log2(r)), 1.0 / 16 + 1e-6) << s;  // half a step of 2^(1/8)
  }
}

TEST(HistoryCodec, Bf16AndInt2RecipesAreTheServedQuantisers) {
  const int n = 64, d = 64;
  const std::vector<float> x = GaussianRows(n, d, 9);
  HistoryCodec c = Parse("int2|bf16");
  std::vector<float> k(x.size()), v(x.size());
  FakeQuantSide(x.data(), n, d, 64, c.all.side[0], 0.9f, 0, k.data());
  FakeQuantSide(x.data(), n, d, 64, c.all.side[1], 0.9f, 0, v.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(v[i], RoundToBf16(x[i]));
  // INT2 rows take at most 4 distinct values each.
  for (int t = 0; t < n; ++t) {
    std::vector<float> seen;
    for (int i = 0; i < d; ++i) {
      if (std::find(seen.begin(), seen.end(), k[t * d + i]) == seen.end())
        seen.push_back(k[t * d + i]);
    }
    EXPECT_LE(seen.size(), 4u);
  }
}

}  // namespace
}  // namespace kvstrata::kernels

namespace kvstrata::kernels {
namespace {

TEST(HistoryCodecLogitBias, ParsesForKeysOnly) {
  HistoryCodec c = Parse("4x16+3x16+2x32:eig:s8:pr:jb|3x64");
  EXPECT_FLOAT_EQ(c.all.side[0].logit_bias, 1.0f);
  EXPECT_FLOAT_EQ(c.all.side[1].logit_bias, 0.0f);
  EXPECT_FLOAT_EQ(Parse("2x64:jb0.5|2x64").all.side[0].logit_bias, 0.5f);
  EXPECT_FLOAT_EQ(Parse("2x64:jb-1|2x64").all.side[0].logit_bias, -1.0f);
  // It costs no bits.
  EXPECT_DOUBLE_EQ(HistoryCodecBits(Parse("3x32+2x32:eig:s8:jb|2x64"), 30, 64, 64),
                   HistoryCodecBits(Parse("3x32+2x32:eig:s8|2x64"), 30, 64, 64));
  std::string error;
  EXPECT_FALSE(ParseHistoryCodec("2x64|2x64:jb", 64, &c, &error));
  EXPECT_NE(error.find("keys only"), std::string::npos) << error;
  EXPECT_FALSE(ParseHistoryCodec("2x64:jbx|2x64", 64, &c, &error));
  EXPECT_FALSE(ParseHistoryCodec("1x8+1x8+1x8+1x8+1x8+1x8+1x8+1x8+2x0|2x64", 64, &c, &error));
  EXPECT_FALSE(ParseHistoryCodec("1x4+1x4+1x4+1x4+1x4+1x4+1x4+1x4+2x32:jb|2x64", 64, &c, &error));
  EXPECT_NE(error.find("at most 8 regions"), std::string::npos) << error;
}

TEST(HistoryCodecLogitBias, DistortionsAreTheLloydMaxOnes) {
  const double want[5] = {1.0, 0.3634, 0.1175, 0.03454, 0.009497};
  for (int bits = 0; bits <= 4; ++bits) {
    EXPECT_NEAR(LloydMaxDistortion(bits, 1.0f), want[bits], 1e-3 * want[bits]) << bits;
  }
  // Other level multipliers, against a Monte Carlo of the quantiser; 1 is the minimum.
  std::mt19937 rng(8);
  std::normal_distribution<double> normal;
  for (const float a : {0.8f, 1.2f}) {
    for (int bits = 1; bits <= 3; ++bits) {
      const float* L = GaussianLloydMaxCentroids(bits);
      double sum = 0.0;
      const int n = 200000;
      for (int i = 0; i < n; ++i) {
        const double x = normal(rng);
        double best = 1e30;
        for (int k = 0; k < (1 << bits); ++k) best = std::min(best, std::fabs(x - a * L[k]));
        sum += best * best;
      }
      EXPECT_NEAR(LloydMaxDistortion(bits, a), sum / n, 0.02 * sum / n) << bits << " " << a;
      EXPECT_GT(LloydMaxDistortion(bits, a), LloydMaxDistortion(bits, 1.0f));
    }
  }
}

// The term's promise: for a query q, ½·s²·E[(q·e)²] over the rows equals the mean of
// Σ_r f[r]·c[t][r], where e is each row's actual error. Gaussian rows whose eigen-regions
// differ in energy (as keys in U's basis do), page ratios as served.
TEST(HistoryCodecLogitBias, PredictsTheScoreVarianceOfTheKeyError) {
  const int n = 64, d = 64, pages = 8;
  const SideRecipe r = Parse("4x16+3x16+2x32:eig:s8:pr:jb|2x64").all.side[0];
  const SideRecipe plain = Parse("4x16+3x16+2x32:eig:s8:pr|2x64").all.side[0];
  std::mt19937 rng(23);
  std::normal_distribution<float> normal;
  std::vector<float> q(d);
  for (float& v : q) v = normal(rng);
  const float sm = 0.125f;
  std::vector<float> f(kCodecBiasTerms);
  CodecBiasFeatures(r, d, q.data(), 1, sm, f.data());
  double norm = 0.0;
  for (float v : q) norm += double{v} * v;
  double fsum = 0.0;
  for (float v : f) fsum += v;
  EXPECT_NEAR(fsum, sm * sm * norm, 1e-4 * fsum);  // T is orthogonal: the regions split ‖q‖²
  EXPECT_EQ(f[3], 0.0f);                           // past the recipe's three regions
  std::vector<float> none(kCodecBiasTerms, 1.0f);
  CodecBiasFeatures(plain, d, q.data(), 1, sm, none.data());
  for (float v : none) EXPECT_EQ(v, 0.0f);

  double predicted = 0.0, measured = 0.0;
  for (int p = 0; p < pages; ++p) {
    // rows in the file's rotated space whose U-basis energy falls off along the eigen-order
    std::vector<float> w(static_cast<size_t>(n) * d), x(w.size());
    for (int t = 0; t < n; ++t) {
      const float row = 0.5f + 2.0f * std::fabs(normal(rng));
      for (int i = 0; i < d; ++i) w[t * d + i] = row * normal(rng) * std::exp(-i / 20.0f);
    }
    std::vector<double> u(static_cast<size_t>(d) * d, 0.0);
    for (int i = 0; i < d; ++i) u[i * d + i] = 1.0;
    std::vector<float> hp(static_cast<size_t>(d) * d);
    ComposeRotation(u.data(), d, hp.data());  // U = I: the stored rows are w·H·P
    ApplyRotation(w.data(), n, d, hp.data(), x.data());
    std::vector<float> y(x.size()), coef(static_cast<size_t>(n) * kCodecBiasTerms, -1.0f);
    FakeQuantSide(x.data(), n, d, 64, r, 1.0f, 0, y.data(), coef.data());
    std::vector<float> y_plain(x.size()), coef_plain(coef.size(), -1.0f);
    FakeQuantSide(x.data(), n, d, 64, plain, 1.0f, 0, y_plain.data(), coef_plain.data());
    for (int t = 0; t < n; ++t) {
      double dot = 0.0, bias = 0.0;
      for (int i = 0; i < d; ++i) dot += double{q[i]} * (x[t * d + i] - y[t * d + i]);
      for (int k = 0; k < kCodecBiasTerms; ++k)
        bias += double{f[k]} * coef[t * kCodecBiasTerms + k];
      measured += 0.5 * sm * sm * dot * dot;
      predicted += bias;
      for (int k = 3; k < kCodecBiasTerms; ++k) ASSERT_EQ(coef[t * kCodecBiasTerms + k], 0.0f);
      for (int k = 0; k < kCodecBiasTerms; ++k)
        ASSERT_EQ(coef_plain[t * kCodecBiasTerms + k], 0.0f);
    }
    ASSERT_EQ(y, y_plain);  // the term changes the scores, never the stored rows
  }
  EXPECT_NEAR(predicted / measured, 1.0, 0.15) << predicted << " vs " << measured;
}

}  // namespace
}  // namespace kvstrata::kernels

namespace kvstrata::kernels {
namespace {

// "tN": per page, the N rows with the largest weighted error are coded one bit finer, and
// exactly as a recipe one bit finer everywhere codes them (the page ratios are the page's).
TEST(HistoryCodecBoostedRows, TheCostliestRowsGetOneMoreBit) {
  const int n = 64, d = 64;
  const SideRecipe base = Parse("4x16+3x16+2x32:eig:s8:pr|2x64").all.side[0];
  const SideRecipe boost = Parse("4x16+3x16+2x32:eig:s8:pr:t4|2x64").all.side[0];
  const SideRecipe finer = Parse("4x16+4x16+3x32:eig:s8:pr|2x64").all.side[0];
  EXPECT_EQ(boost.boost_rows, 4);
  // 4 rows of 64 get a bit on the 48 channels below 4 bits, plus four 6-bit positions.
  EXPECT_DOUBLE_EQ(SideRecipeBits(boost, 64, 64),
                   SideRecipeBits(base, 64, 64) + (4 * 48 + 24) / 64.0 / 64);
  std::string error;
  HistoryCodec c;
  EXPECT_FALSE(ParseHistoryCodec("2x64:t0|2x64", 64, &c, &error));
  EXPECT_FALSE(ParseHistoryCodec("2x64:t64|2x64", 64, &c, &error));

  // Rows with heavy-tailed magnitudes and mismatched region energies, so some rows cost more.
  std::vector<float> x = GaussianRows(n, d, 31);
  std::mt19937 rng(4);
  std::student_t_distribution<float> heavy(3.0f);
  for (float& v : x) v *= std::fabs(heavy(rng)) + 0.3f;
  std::vector<float> a(x.size()), b(x.size()), f(x.size());
  FakeQuantSide(x.data(), n, d, 64, base, 1.0f, 0, a.data());
  FakeQuantSide(x.data(), n, d, 64, boost, 1.0f, 0, b.data());
  FakeQuantSide(x.data(), n, d, 64, finer, 1.0f, 0, f.data());
  int changed = 0;
  for (int t = 0; t < n; ++t) {
    const bool same = std::equal(a.begin() + t * d, a.begin() + (t + 1) * d, b.begin() + t * d);
    if (same) continue;
    ++changed;
    for (int i = 0; i < d; ++i) ASSERT_EQ(b[t * d + i], f[t * d + i]) << t << " " << i;
  }
  EXPECT_EQ(changed, 4);
  EXPECT_LT(RelMse(x, b), 0.95 * RelMse(x, a));
}

}  // namespace
}  // namespace kvstrata::kernels
