// The codec page (kernels/codec_page.h) against the evaluation codec it serves: the packed
// block must read back exactly what FakeQuantSide reconstructs for the same recipe.

#include "kernels/codec_page.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/history_codec.h"

namespace kvstrata::kernels {
namespace {

constexpr int kTokens = 64;

SideRecipe Recipe(const std::string& side, int d = 64) {
  HistoryCodec c;
  std::string error;
  EXPECT_TRUE(ParseHistoryCodec(side + "|" + side, d, &c, &error)) << side << ": " << error;
  return c.all.side[0];
}

// Rows of a page as the cache sees them: Gaussian, with a spread of row magnitudes, an
// all-zero row and, from `zero_from`, channels that are zero in every row.
std::vector<float> PageRows(int d, uint32_t seed, int zero_from = -1) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> magnitude(0.05f, 20.0f);
  std::vector<float> x(static_cast<size_t>(kTokens) * d);
  for (int t = 0; t < kTokens; ++t) {
    const float m = t == 7 ? 0.0f : magnitude(rng);
    for (int c = 0; c < d; ++c) {
      x[t * d + c] = zero_from >= 0 && c >= zero_from ? 0.0f : m * normal(rng) * (1.0f + c / 16);
    }
  }
  return x;
}

// The head_dim a spec's regions cover.
int HeadDimOf(const std::string& spec) {
  int d = 0;
  size_t at = 0;
  while (at < spec.size() && spec[at] != ':') {
    const size_t x = spec.find('x', at);
    d += std::stoi(spec.substr(x + 1));
    at = spec.find_first_of("+:", x);
    if (at == std::string::npos || spec[at] == ':') break;
    ++at;
  }
  return d;
}

class CodecPage : public ::testing::TestWithParam<std::string> {};

TEST_P(CodecPage, ReadsBackExactlyWhatTheEvaluationCodecReconstructs) {
  const int d = HeadDimOf(GetParam());
  const SideRecipe r = Recipe(GetParam(), d);
  ASSERT_EQ(CodecRecipeUnservable(r, d), "");
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<float> x = PageRows(d, seed, seed == 3 ? d - 16 : -1);
    const CodecBlockLayout l = CodecBlockLayoutFor(r, kTokens);
    std::vector<uint8_t> block(l.bytes + 16, 0xAB);  // a guard past the block
    EncodeCodecBlock(x.data(), kTokens, d, r, block.data());
    for (int i = 0; i < 16; ++i) ASSERT_EQ(block[l.bytes + i], 0xAB) << "written past the block";
    std::vector<float> want(x.size()), got(x.size()), portable(x.size());
    FakeQuantSide(x.data(), kTokens, d, /*group_size=*/0, r, 1.0f, 0, want.data());
    DecodeCodecBlock(block.data(), kTokens, kTokens, d, r, got.data());
    DecodeCodecBlock(block.data(), kTokens, kTokens, d, r, portable.data(),
                     CodecDecoder::kPortable);
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << GetParam() << " seed " << seed << " row " << i / d
                                 << " channel " << i % d;
      ASSERT_EQ(portable[i], want[i]) << GetParam() << " seed " << seed << " row " << i / d
                                      << " channel " << i % d << " (portable decoder)";
    }
    // A prefix of the rows decodes to the same values.
    std::vector<float> part(static_cast<size_t>(5) * d);
    DecodeCodecBlock(block.data(), 5, kTokens, d, r, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), got.begin()));
  }
}

TEST_P(CodecPage, CostsWhatTheRecipeCountsPlusUnder16BytesOfPadding) {
  const int d = HeadDimOf(GetParam());
  const SideRecipe r = Recipe(GetParam(), d);
  const CodecBlockLayout l = CodecBlockLayoutFor(r, kTokens);
  EXPECT_EQ(l.bytes % 16, 0);
  const double counted = SideRecipeBits(r, d, 0) * kTokens * d / 8.0;
  EXPECT_GE(static_cast<double>(l.bytes), counted);
  EXPECT_LT(static_cast<double>(l.bytes), counted + 16.0 * (r.regions.size() + 1));
}

TEST_P(CodecPage, EachCodeChangesOnlyItsOwnChannel) {
  const int d = HeadDimOf(GetParam());
  const SideRecipe r = Recipe(GetParam(), d);
  const CodecBlockLayout l = CodecBlockLayoutFor(r, kTokens);
  const std::vector<float> x = PageRows(d, 9);
  std::vector<uint8_t> block(l.bytes);
  EncodeCodecBlock(x.data(), kTokens, d, r, block.data());
  std::vector<float> base(x.size()), flipped(x.size());
  DecodeCodecBlock(block.data(), kTokens, kTokens, d, r, base.data());
  // Flip one bit of every code byte of row 3 in turn: exactly one channel of row 3 changes.
  int c0 = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    for (int64_t byte = 0; byte < l.region_row_bytes[k]; ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<uint8_t> b = block;
        b[l.region_codes[k] + 3 * l.region_row_bytes[k] + byte] ^= static_cast<uint8_t>(1 << bit);
        DecodeCodecBlock(b.data(), kTokens, kTokens, d, r, flipped.data());
        int changed = 0, where = -1;
        for (size_t i = 0; i < x.size(); ++i) {
          if (flipped[i] != base[i]) ++changed, where = static_cast<int>(i);
        }
        ASSERT_EQ(changed, 1) << "region " << k << " byte " << byte << " bit " << bit;
        EXPECT_EQ(where / d, 3);
        EXPECT_EQ(where % d, c0 + (byte * 8 + bit) / r.regions[k].bits);
      }
    }
    c0 += r.regions[k].channels;
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, CodecPage,
                         ::testing::Values("4x16+3x16+2x32:s8:pr", "3x32+2x16+1x16:s8:pr",
                                           "4x64:s8:pr", "2x32+1x32:s8:pr", "4x32+3x32:s8:pr",
                                           "3x16+2x16+1x32:s8:pr", "2x32+0x32:s8:pr",
                                           "4x32+3x32+2x64:s8:pr",
                                           "4x8+3x24+2x24+1x8:s8:pr"),
                         [](const auto& info) {
                           std::string s;
                           for (char c : info.param) {
                             if (c == ':') break;
                             s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           }
                           return s;
                         });

TEST(CodecPage, ExplainsWhatCannotServe) {
  EXPECT_NE(CodecRecipeUnservable(Recipe("turbo3"), 64), "");
  EXPECT_NE(CodecRecipeUnservable(Recipe("3x32+2x32:s8"), 64).find("s8:pr"), std::string::npos);
  EXPECT_NE(CodecRecipeUnservable(Recipe("3x32+2x32:eig:s8:pr:a1.2"), 64).find("evaluation"),
            std::string::npos);
  EXPECT_NE(CodecRecipeUnservable(Recipe("3x32+2x32:eig:s8:pr:u"), 64).find("evaluation"),
            std::string::npos);
  EXPECT_NE(CodecRecipeUnservable(Recipe("3x36+2x28:s8:pr"), 64).find("whole bytes"),
            std::string::npos);
  EXPECT_EQ(CodecRecipeUnservable(Recipe("3x32+2x32:eig:s8:pr"), 64), "");
}

TEST(CodecEigenbasis, IsOrthogonal) {
  const std::vector<float> t = CodecEigenbasis(64, Recipe("4x16+3x16+2x32:eig:s8:pr").regions);
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 64; ++j) {
      double dot = 0.0;
      for (int k = 0; k < 64; ++k) dot += double{t[i * 64 + k]} * t[j * 64 + k];
      ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace kvstrata::kernels
