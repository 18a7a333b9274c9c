// The codec fragment block (kernels/codec_fragment.h): it reads back exactly what the evaluation
// codec reconstructs, each field sits where the tensor cores' fragments want it (positions
// derived here from the PTX fragment layout of mma.m16n8k16, not from the encoder), and the
// fields tile the code area.

#include "kernels/codec_fragment.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "kernels/history_codec.h"

namespace kvstrata::kernels {
namespace {

constexpr int kTokens = 64;

SideRecipe Recipe(const std::string& side, int d) {
  HistoryCodec c;
  std::string error;
  EXPECT_TRUE(ParseHistoryCodec(side + "|" + side, d, &c, &error)) << side << ": " << error;
  return c.all.side[0];
}

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

struct Case {
  std::string spec;
  int head_dim;
};

class CodecFragment : public ::testing::TestWithParam<Case> {};

TEST_P(CodecFragment, ReadsBackExactlyWhatTheEvaluationCodecReconstructs) {
  const int d = GetParam().head_dim;
  const SideRecipe r = Recipe(GetParam().spec, d);
  ASSERT_EQ(CodecFragmentRecipeUnservable(r, d), "");
  const CodecBlockLayout l = CodecFragmentBlockLayoutFor(r);
  // Exactly the codes (64 x bits per channel), the row scales and ratios, then padding.
  const double counted = SideRecipeBits(r, d, 0) * kTokens * d / 8.0;
  EXPECT_EQ(l.bytes % 16, 0);
  EXPECT_GE(static_cast<double>(l.bytes), counted);
  EXPECT_LT(static_cast<double>(l.bytes), counted + 16.0);
  for (int kind = 0; kind < 2; ++kind) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      const std::vector<float> x = PageRows(d, seed + 10 * kind, seed == 3 ? d - 16 : -1);
      std::vector<uint8_t> block(l.bytes + 16, 0xAB);  // a guard past the block
      EncodeCodecFragmentBlock(x.data(), d, r, kind, block.data());
      for (int i = 0; i < 16; ++i) ASSERT_EQ(block[l.bytes + i], 0xAB) << "written past the block";
      std::vector<float> want(x.size()), got(x.size());
      FakeQuantSide(x.data(), kTokens, d, /*group_size=*/0, r, 1.0f, 0, want.data());
      DecodeCodecFragmentBlock(block.data(), kTokens, d, r, kind, got.data());
      for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << GetParam().spec << " kind " << kind << " seed " << seed
                                   << " row " << i / d << " channel " << i % d;
      }
      std::vector<float> part(static_cast<size_t>(5) * d);
      DecodeCodecFragmentBlock(block.data(), 5, d, r, kind, part.data());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), got.begin()));
    }
  }
}

TEST_P(CodecFragment, ACodeBitChangesOneValue) {
  const int d = GetParam().head_dim;
  const SideRecipe r = Recipe(GetParam().spec, d);
  const CodecBlockLayout l = CodecFragmentBlockLayoutFor(r);
  const std::vector<float> x = PageRows(d, 9);
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<uint8_t> block(l.bytes);
    EncodeCodecFragmentBlock(x.data(), d, r, kind, block.data());
    std::vector<float> base(x.size()), flipped(x.size());
    DecodeCodecFragmentBlock(block.data(), kTokens, d, r, kind, base.data());
    // Every 11th bit of the code area (all would take seconds under the sanitizers): exactly
    // one value changes.
    for (int64_t bit = kind; bit < l.row_scales * 8; bit += 11) {
      std::vector<uint8_t> b = block;
      b[bit / 8] ^= static_cast<uint8_t>(1 << (bit % 8));
      DecodeCodecFragmentBlock(b.data(), kTokens, d, r, kind, flipped.data());
      int changed = 0;
      for (size_t i = 0; i < x.size(); ++i) changed += flipped[i] != base[i];
      ASSERT_EQ(changed, 1) << "kind " << kind << " bit " << bit;
    }
  }
}

TEST(CodecFragmentLayout, FieldsTileEachPartsWords) {
  for (int kind = 0; kind < 2; ++kind) {
    for (int width : {1, 2, 4}) {
      std::set<int64_t> bits;
      for (int token = 0; token < kTokens; ++token) {
        for (int c = 0; c < 16; ++c) {
          const int64_t at = CodecFragmentFieldBit(kind, width, token, c);
          ASSERT_EQ(at % width, 0);
          ASSERT_LE(at % 16 + width, 16) << "a field crosses a half-word";
          for (int i = 0; i < width; ++i) ASSERT_TRUE(bits.insert(at + i).second) << at + i;
        }
      }
      EXPECT_EQ(bits.size(), 32u * 32 * width);  // 32 lanes x width words, every bit used
      EXPECT_EQ(*bits.rbegin(), 32 * 32 * width - 1);
    }
  }
}

// The decoders' view of a lane (CodecFragmentLaneField, LaneToken, LaneChannel) reads each
// (token, channel) at exactly the bit CodecFragmentFieldBit places it.
TEST(CodecFragmentLayout, LaneViewInvertsTheFieldBits) {
  for (int kind = 0; kind < 2; ++kind) {
    for (int width : {1, 2, 4}) {
      std::set<std::pair<int, int>> seen;
      for (int lane = 0; lane < 32; ++lane) {
        for (int group = 0; group < 8; ++group) {
          for (int second = 0; second < 2; ++second) {
            for (int elem = 0; elem < 2; ++elem) {
              const int token = CodecFragmentLaneToken(kind, lane, group, second, elem);
              const int channel = CodecFragmentLaneChannel(kind, lane, group, second, elem);
              ASSERT_TRUE(seen.insert({token, channel}).second) << token << " " << channel;
              // One field set in the lane's words: the lane view reads it back, nothing else.
              const int64_t bit = CodecFragmentFieldBit(kind, width, token, channel);
              ASSERT_EQ(bit / 32 / width, lane);
              uint32_t w[4] = {};
              w[bit / 32 % width] = 1u << (bit % 32);
              const uint32_t got = width == 1   ? CodecFragmentLaneField<1>(w, group, second, elem)
                                   : width == 2 ? CodecFragmentLaneField<2>(w, group, second, elem)
                                                : CodecFragmentLaneField<4>(w, group, second, elem);
              ASSERT_EQ(got, 1u) << "kind " << kind << " width " << width << " lane " << lane;
            }
          }
        }
      }
      EXPECT_EQ(seen.size(), 64u * 16);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, CodecFragment,
    ::testing::Values(Case{"4x16+3x16+2x32:s8:pr:u", 64}, Case{"3x16+2x16+1x32:s8:pr:u", 64},
                      Case{"4x64:s8:pr:u", 64}, Case{"2x32+0x32:s8:pr:u", 64},
                      Case{"4x32+3x32+2x64:s8:pr:u", 128}, Case{"1x128:s8:pr:u", 128}),
    [](const auto& info) {
      std::string s;
      for (char c : info.param.spec) {
        if (c == ':') break;
        s += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      }
      return s;
    });

// The positions against the fragment layout of mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type"): for the A operand (16 x 16, row-major), lane
// 4·groupID + threadID_in_group holds a0 = (groupID, 2·tid + {0, 1}), a1 = (groupID + 8, ...),
// a2 = (groupID, 2·tid + 8 + {0, 1}), a3 = (groupID + 8, 2·tid + 8 + ...). A kernel takes word
// m of a lane's part words, shifts it right by 2·width·j for group j of the word, and masks
// the low `width` bits of each half-word (the first pair) and the next `width` bits (the second
// pair), the low half-word the even element.
struct Fragment {
  int a_row, a_col;  // the element of the 16 x 16 A tile
};
Fragment ElementOf(int lane, int reg, int elem) {
  const int g = lane / 4, t = lane % 4;
  return {g + 8 * (reg % 2), 2 * t + 8 * (reg / 2) + elem};
}

TEST(CodecFragmentLayout, KRowsAndVColumnsLandInTheMmaFragments) {
  for (int width : {1, 2, 4}) {
    const int per_word = 8 / width;
    for (int lane = 0; lane < 32; ++lane) {
      for (int word = 0; word < width; ++word) {
        for (int j = 0; j < per_word; ++j) {
          const int group = word * per_word + j;
          for (int second = 0; second < 2; ++second) {
            for (int elem = 0; elem < 2; ++elem) {
              const int64_t bit = int64_t{lane * width + word} * 32 + 16 * elem + 2 * width * j +
                                  width * second;
              // K: group r is tile i = r / 2's row (r % 2)·8 + g, token 16i + that row; the
              // pair is register a0/a1 (first) or a2/a3 (second) of that tile's K step.
              {
                const int i = group / 2, reg = group % 2 + 2 * second;
                const Fragment f = ElementOf(lane, reg, elem);
                EXPECT_EQ(CodecFragmentFieldBit(0, width, 16 * i + f.a_row, f.a_col), bit)
                    << "K width " << width << " lane " << lane << " group " << group;
              }
              // V: A = Vᵀ, rows channels, columns the 16 tokens of k-step i; group q = 2i + h
              // is register a0/a2 (h = 0) or a1/a3 (h = 1).
              {
                const int i = group / 2, h = group % 2, reg = h + 2 * second;
                const Fragment f = ElementOf(lane, reg, elem);
                EXPECT_EQ(CodecFragmentFieldBit(1, width, 16 * i + f.a_col, f.a_row), bit)
                    << "V width " << width << " lane " << lane << " group " << group;
              }
            }
          }
        }
      }
    }
  }
}

TEST(CodecFragmentLayout, KernelLevelStepsAreTheUniformLevels) {
  for (int bits = 1; bits <= 4; ++bits) {
    EXPECT_EQ(kCodecFragmentLevelStep[bits], static_cast<float>(GaussianUniformStep(bits))) << bits;
  }
}

TEST(CodecFragmentLayout, ExplainsWhatCannotServe) {
  EXPECT_NE(CodecFragmentRecipeUnservable(Recipe("3x32+2x32:s8:pr", 64), 64).find("uniform"),
            std::string::npos);
  EXPECT_NE(CodecFragmentRecipeUnservable(Recipe("3x24+2x40:s8:pr:u", 64), 64).find("steps"),
            std::string::npos);
  EXPECT_NE(CodecFragmentRecipeUnservable(Recipe("3x32+2x32:s8:u", 64), 64).find("s8:pr"),
            std::string::npos);
  EXPECT_EQ(CodecFragmentRecipeUnservable(Recipe("3x32+2x32:eig:s8:pr:u", 64), 64), "");
}

// The launch check every fragment kernel makes: the host's layouts pass it, and a layout that
// is not a fragment block's (a region off the steps, codes not packed up to the row scales, the
// ratios elsewhere or past the block) fails it.
TEST(CodecFragmentLayout, LaunchCheckTakesTheHostLayoutsOnly) {
  const SideRecipe k = Recipe("4x16+3x16+2x32:eig:s8:pr:u", 64);
  const SideRecipe v = Recipe("2x32+1x16+0x16:s8:pr:u", 64);  // 16 channels dropped
  const int64_t k_bytes = CodecFragmentBlockLayoutFor(k).bytes;
  const CodecLayerLayout good = CodecFragmentLayerLayoutFor(k, v, 0, 3 * k_bytes);
  ASSERT_TRUE(CodecFragmentLayoutOk(good));
  EXPECT_TRUE(CodecFragmentLayoutOk(CodecFragmentLayerLayoutFor(
      Recipe("4x32+3x32+2x64:eig:s8:pr:u", 128), Recipe("3x64+2x64:s8:pr:u", 128), 0, 4096)));
  CodecLayerLayout off_steps = good;
  off_steps.side[1].channels[0] = 24;
  EXPECT_FALSE(CodecFragmentLayoutOk(off_steps));
  CodecLayerLayout scales_moved = good;
  scales_moved.side[0].row_scales += 1;
  EXPECT_FALSE(CodecFragmentLayoutOk(scales_moved));
  CodecLayerLayout ratios_moved = good;
  ratios_moved.side[1].ratios += 1;
  EXPECT_FALSE(CodecFragmentLayoutOk(ratios_moved));
  CodecLayerLayout short_block = good;
  short_block.side[0].block_bytes = short_block.side[0].ratios + 1;
  EXPECT_FALSE(CodecFragmentLayoutOk(short_block));
}

}  // namespace
}  // namespace kvstrata::kernels
