#include "model/dequant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/numeric.h"

namespace kvstrata::model {
namespace {

using ::testing::HasSubstr;

void PutU16(std::vector<uint8_t>& out, uint16_t v) {
  out.push_back(static_cast<uint8_t>(v));
  out.push_back(static_cast<uint8_t>(v >> 8));
}

// fp16 bit patterns of the scales used below (exact binary fractions).
constexpr uint16_t kHalf = 0x3800;      // 0.5
constexpr uint16_t kQuarter = 0x3400;   // 0.25
constexpr uint16_t kEighth = 0x3000;    // 0.125
constexpr uint16_t kMinusOne = 0xbc00;  // -1.0
constexpr uint16_t kThree = 0x4200;     // 3.0

std::vector<float> Decode(GgmlType type, const std::vector<uint8_t>& src, size_t n) {
  std::vector<float> out(n, std::numeric_limits<float>::quiet_NaN());
  const absl::Status status = Dequantize(type, src, out, "test.tensor");
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

TEST(DequantTest, Q8_0IsScaleTimesSignedByte) {
  // Two blocks with different scales; the second holds the int8 extremes.
  std::vector<uint8_t> src;
  std::vector<float> expected;
  for (const auto& [bits, d] : {std::pair{kHalf, 0.5f}, std::pair{kThree, 3.0f}}) {
    PutU16(src, bits);
    for (int j = 0; j < 32; ++j) {
      const int8_t q = bits == kHalf ? static_cast<int8_t>(j - 16)
                                     : static_cast<int8_t>(j % 2 == 0 ? -128 + j : 127 - j);
      src.push_back(static_cast<uint8_t>(q));
      expected.push_back(d * static_cast<float>(q));
    }
  }
  ASSERT_EQ(src.size(), 2u * 34);
  EXPECT_EQ(Decode(GgmlType::kQ8_0, src, 64), expected);
}

TEST(DequantTest, Q4_0IsScaleTimesNibbleMinusEight) {
  std::vector<uint8_t> src;
  PutU16(src, kQuarter);
  for (int j = 0; j < 16; ++j) src.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  std::vector<float> expected(32);
  for (int j = 0; j < 16; ++j) {
    expected[j] = 0.25f * static_cast<float>(j - 8);              // low nibble: element j
    expected[j + 16] = 0.25f * static_cast<float>((15 - j) - 8);  // high nibble: element j + 16
  }
  EXPECT_EQ(Decode(GgmlType::kQ4_0, src, 32), expected);
}

TEST(DequantTest, Q4_1IsScaleTimesNibblePlusMin) {
  std::vector<uint8_t> src;
  PutU16(src, kEighth);
  PutU16(src, kMinusOne);
  for (int j = 0; j < 16; ++j) src.push_back(static_cast<uint8_t>(((j * 7) & 15) | (j << 4)));
  std::vector<float> expected(32);
  for (int j = 0; j < 16; ++j) {
    expected[j] = 0.125f * static_cast<float>((j * 7) & 15) - 1.0f;
    expected[j + 16] = 0.125f * static_cast<float>(j) - 1.0f;
  }
  EXPECT_EQ(Decode(GgmlType::kQ4_1, src, 32), expected);
}

TEST(DequantTest, HalfFloatsDecodeExactly) {
  const std::vector<std::pair<uint16_t, float>> f16 = {
      {0x3c00, 1.0f},     {0xc000, -2.0f},           {0x7bff, 65504.0f},
      {0x0001, 0x1p-24f}, {0x3555, 0.333251953125f}, {0x7c00, INFINITY},
  };
  std::vector<uint8_t> src;
  std::vector<float> expected;
  for (const auto& [bits, value] : f16) {
    PutU16(src, bits);
    expected.push_back(value);
  }
  EXPECT_EQ(Decode(GgmlType::kF16, src, f16.size()), expected);
  const std::vector<float> negative_zero = Decode(GgmlType::kF16, {0x00, 0x80}, 1);
  EXPECT_TRUE(std::signbit(negative_zero[0]) && negative_zero[0] == 0.0f);

  const std::vector<std::pair<uint16_t, float>> bf16 = {
      {0x3f80, 1.0f}, {0xc040, -3.0f}, {0x7f80, INFINITY}, {0x3e20, 0.15625f}};
  src.clear();
  expected.clear();
  for (const auto& [bits, value] : bf16) {
    PutU16(src, bits);
    expected.push_back(value);
  }
  EXPECT_EQ(Decode(GgmlType::kBF16, src, bf16.size()), expected);
}

TEST(DequantTest, F32CopiesUnalignedBytes) {
  const std::vector<float> values = {1.5f, -0.0f, 3.25e-20f, -7.0f};
  std::vector<uint8_t> src(1 + values.size() * 4);
  std::memcpy(src.data() + 1, values.data(), values.size() * 4);
  std::vector<float> out(values.size());
  ASSERT_TRUE(Dequantize(GgmlType::kF32, std::span(src).subspan(1), out, "x").ok());
  EXPECT_EQ(std::memcmp(out.data(), values.data(), values.size() * 4), 0);
}

TEST(DequantTest, UnsupportedTypeNamesTensorAndType) {
  std::vector<uint8_t> src(210);
  std::vector<float> out(256);
  const absl::Status status = Dequantize(GgmlType::kQ6_K, src, out, "blk.7.ffn_down.weight");
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("Q6_K"));
  EXPECT_THAT(status.message(), HasSubstr("blk.7.ffn_down.weight"));
}

TEST(DequantTest, SizeMismatchesAreErrors) {
  std::vector<float> out(32);
  std::vector<uint8_t> short_src(33);
  absl::Status status = Dequantize(GgmlType::kQ8_0, short_src, out, "t1");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("t1"));
  std::vector<float> partial(33);
  std::vector<uint8_t> src(68);
  status = Dequantize(GgmlType::kQ8_0, src, partial, "t2");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("whole blocks"));
}

TEST(DequantTest, TypeTableFollowsGgml) {
  EXPECT_EQ(GgmlTypeFromId(0), GgmlType::kF32);
  EXPECT_EQ(GgmlTypeFromId(3), GgmlType::kQ4_1);
  EXPECT_EQ(GgmlTypeFromId(8), GgmlType::kQ8_0);
  EXPECT_EQ(GgmlTypeFromId(30), GgmlType::kBF16);
  for (const uint32_t retired : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 1000u}) {
    EXPECT_FALSE(GgmlTypeFromId(retired).has_value()) << retired;
  }
  for (uint32_t id = 0; id < 64; ++id) {
    if (const std::optional<GgmlType> type = GgmlTypeFromId(id)) {
      EXPECT_EQ(static_cast<uint32_t>(*type), id);
      EXPECT_NE(GetGgmlTypeInfo(*type).name, "unknown");
    }
  }
  EXPECT_EQ(GetGgmlTypeInfo(GgmlType::kQ4_1).block_bytes, 20);
  EXPECT_EQ(GetGgmlTypeInfo(GgmlType::kQ6_K).block_bytes, 210);
  EXPECT_EQ(GetGgmlTypeInfo(GgmlType::kQ6_K).block_elements, 256);
  EXPECT_EQ(*GgmlTypeBytes(GgmlType::kQ8_0, 64), 68u);
  EXPECT_FALSE(GgmlTypeBytes(GgmlType::kF32, uint64_t{1} << 62).ok());  // 2^64 bytes
}

// The encoder the tiny models use: within the format's precision of the input.
TEST(DequantTest, QuantizeRoundTripsWithinPrecision) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> x(32 * 40);
  for (float& v : x) v = normal(rng);
  x[5] = 0.0f;
  std::fill(x.begin() + 64, x.begin() + 96, 0.0f);  // an all-zero block
  for (const GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                              GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    SCOPED_TRACE(GetGgmlTypeInfo(type).name);
    const absl::StatusOr<std::vector<uint8_t>> bytes = Quantize(type, x);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    std::vector<float> y(x.size());
    ASSERT_TRUE(Dequantize(type, *bytes, y, "x").ok());
    for (size_t block = 0; block < x.size() / 32; ++block) {
      float lo = x[block * 32], hi = lo, amax = 0.0f;
      for (size_t j = block * 32; j < block * 32 + 32; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
        amax = std::max(amax, std::fabs(x[j]));
      }
      for (size_t j = block * 32; j < block * 32 + 32; ++j) {
        float bound = 0.0f;
        switch (type) {
          case GgmlType::kF32:
            bound = 0.0f;
            break;
          case GgmlType::kF16:
            bound = std::fabs(x[j]) * 0x1p-11f + 0x1p-25f;
            break;
          case GgmlType::kBF16:
            bound = std::fabs(x[j]) * 0x1p-8f;
            break;
          case GgmlType::kQ8_0:
            bound = amax / 127.0f * 0.6f + 1e-7f;
            break;
          case GgmlType::kQ4_0:
            // The extreme's opposite can clamp a full step (q = 16 -> 15).
            bound = amax / 8.0f * 1.01f + 1e-7f;
            break;
          default:  // Q4_1
            bound = (hi - lo) / 15.0f * 0.6f + std::fabs(lo) * 0x1p-11f + 1e-7f;
            break;
        }
        EXPECT_LE(std::fabs(y[j] - x[j]), bound) << "element " << j;
      }
    }
  }
  EXPECT_EQ(Quantize(GgmlType::kQ6_K, x).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(Quantize(GgmlType::kQ8_0, std::span(x).first(33)).ok());
}

}  // namespace
}  // namespace kvstrata::model
