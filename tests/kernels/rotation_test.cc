#include "kernels/rotation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvstrata::kernels {
namespace {

// A random orthogonal matrix by Gram-Schmidt on Gaussian columns, [d][d] row-major.
std::vector<double> RandomOrthogonal(int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::vector<double> u(d * d);
  for (auto& v : u) v = normal(rng);
  for (int c = 0; c < d; ++c) {
    for (int p = 0; p < c; ++p) {
      double dot = 0;
      for (int i = 0; i < d; ++i) dot += u[i * d + c] * u[i * d + p];
      for (int i = 0; i < d; ++i) u[i * d + c] -= dot * u[i * d + p];
    }
    double norm = 0;
    for (int i = 0; i < d; ++i) norm += u[i * d + c] * u[i * d + c];
    for (int i = 0; i < d; ++i) u[i * d + c] /= std::sqrt(norm);
  }
  return u;
}

double MaxOrthogonalityError(const std::vector<float>& r, int d) {
  double worst = 0;
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) {
      double dot = 0;
      for (int k = 0; k < d; ++k) dot += double{r[i * d + k]} * r[j * d + k];
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

TEST(Fwht, MatchesHadamardMatrix) {
  for (int d : {4, 64, 128}) {
    std::vector<double> h(d * d);
    HadamardMatrix(d, h.data());
    std::vector<float> x(d), y(d);
    std::mt19937 rng(d);
    std::normal_distribution<float> normal;
    for (auto& v : x) v = normal(rng);
    y = x;
    FwhtNormalized(y.data(), d);
    for (int j = 0; j < d; ++j) {
      double expect = 0;
      for (int i = 0; i < d; ++i) expect += x[i] * h[i * d + j];
      EXPECT_NEAR(y[j], expect, 1e-5) << "d=" << d << " j=" << j;
    }
    FwhtNormalized(y.data(), d);  // its own inverse
    for (int i = 0; i < d; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
  }
}

TEST(BitReverse, KnownValues) {
  EXPECT_EQ(BitReverse(0, 7), 0);
  EXPECT_EQ(BitReverse(1, 7), 64);
  EXPECT_EQ(BitReverse(2, 7), 32);
  EXPECT_EQ(BitReverse(3, 7), 96);
  EXPECT_EQ(BitReverse(127, 7), 127);
  EXPECT_EQ(BitReverse(1, 6), 32);
}

TEST(Compose, EqualsExplicitProductAndIsOrthogonal) {
  for (int d : {64, 128}) {
    const std::vector<double> u = RandomOrthogonal(d, 17 + d);
    std::vector<float> r(d * d);
    ComposeRotation(u.data(), d, r.data());
    EXPECT_LT(MaxOrthogonalityError(r, d), 1e-5);
    // Explicit U·H·P with P[i][bitrev(i)] = 1.
    std::vector<double> h(d * d);
    HadamardMatrix(d, h.data());
    const int bits = d == 64 ? 6 : 7;
    for (int i = 0; i < d; ++i) {
      for (int k = 0; k < d; ++k) {
        double uh = 0;
        for (int j = 0; j < d; ++j) uh += u[i * d + j] * h[j * d + k];
        ASSERT_NEAR(r[i * d + BitReverse(k, bits)], uh, 1e-6);
      }
    }
  }
}

TEST(Rotation, PreservesDotProductsAndInverts) {
  const int d = 128;
  const std::vector<double> u = RandomOrthogonal(d, 99);
  std::vector<float> r(d * d);
  ComposeRotation(u.data(), d, r.data());
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 5.0f);
  std::vector<float> q(4 * d), k(4 * d), qr(4 * d), kr(4 * d), back(4 * d);
  for (auto& v : q) v = normal(rng);
  for (auto& v : k) v = normal(rng);
  ApplyRotation(q.data(), 4, d, r.data(), qr.data());
  ApplyRotation(k.data(), 4, d, r.data(), kr.data());
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      double dot = 0, dot_r = 0;
      for (int i = 0; i < d; ++i) {
        dot += double{q[a * d + i]} * k[b * d + i];
        dot_r += double{qr[a * d + i]} * kr[b * d + i];
      }
      EXPECT_NEAR(dot_r, dot, 1e-4 * (1 + std::fabs(dot)));
    }
  }
  ApplyRotationTransposed(kr.data(), 4, d, r.data(), back.data());
  for (int i = 0; i < 4 * d; ++i) EXPECT_NEAR(back[i], k[i], 1e-4);
}

TEST(Rotation, RandomSignHadamardIsOrthogonalAndSeeded) {
  const int d = 64;
  std::vector<float> a(d * d), b(d * d), c(d * d);
  RandomSignHadamard(d, 1, a.data());
  RandomSignHadamard(d, 1, b.data());
  RandomSignHadamard(d, 2, c.data());
  EXPECT_LT(MaxOrthogonalityError(a, d), 1e-6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

}  // namespace
}  // namespace kvstrata::kernels
