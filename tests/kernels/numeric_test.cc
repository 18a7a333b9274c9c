#include "kernels/numeric.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace kvstrata::kernels {
namespace {

TEST(Fp16, EveryEncodingRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = Fp16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToFp16(f), h) << "bits " << h;
  }
}

TEST(Fp16, MatchesCompilerConversion) {
#if !defined(__FLT16_MAX__)
  GTEST_SKIP() << "this compiler has no _Float16 on this target (the GCC build runs this test)";
#else
  // GCC's _Float16 conversion (round to nearest even) is an independent implementation.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = bits(rng);
    // Concentrate on the fp16 range, including subnormals and overflow.
    u = (u & 0x80ffffffu) | ((100u + (u >> 24) % 50u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t expected;
    std::memcpy(&expected, &h, 2);
    ASSERT_EQ(FloatToFp16(f), expected) << "value " << f;
    ++checked;
  }
  EXPECT_EQ(checked, 2000000);
#endif
}

TEST(Fp16, SaturatesInsteadOfInfinity) {
  EXPECT_EQ(Fp16ToFloat(FloatToFp16Saturate(1e9f)), 65504.0f);
  EXPECT_EQ(Fp16ToFloat(FloatToFp16Saturate(-1e9f)), -65504.0f);
  EXPECT_TRUE(std::isinf(Fp16ToFloat(FloatToFp16(1e9f))));
}

TEST(Bf16, RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float f = dist(rng);
    const float r = RoundToBf16(f);
    // Reference: the two bf16 neighbours of f, picked by distance, ties to even mantissa.
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t down_bits = u & 0xffff0000u;
    const uint32_t up_bits = down_bits + 0x10000u;
    float down, up;
    std::memcpy(&down, &down_bits, 4);
    std::memcpy(&up, &up_bits, 4);
    const double dd = std::fabs(double{f} - down), du = std::fabs(double{up} - f);
    float expected = dd < du ? down : (du < dd ? up : (((down_bits >> 16) & 1) ? up : down));
    ASSERT_EQ(r, expected) << f;
  }
  EXPECT_TRUE(std::isnan(RoundToBf16(std::nanf(""))));
}

}  // namespace
}  // namespace kvstrata::kernels
