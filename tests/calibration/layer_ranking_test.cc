#include "calibration/layer_ranking.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/history_codec.h"

namespace kvstrata::calibration {
namespace {

constexpr char kBase[] = "4x16+3x16+2x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr";
constexpr char kBoost[] = "4x32+3x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr";

TEST(RankLayers, LargestFirstTiesToTheLowerLayer) {
  absl::StatusOr<std::vector<int>> r = RankLayers({0.1, 0.5, 0.2, 0.5, 0.0, 0.3});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, (std::vector<int>{1, 3, 5, 2, 0, 4}));
}

TEST(RankLayers, RejectsNanNegativeAndEmpty) {
  EXPECT_FALSE(RankLayers({0.1, std::numeric_limits<double>::quiet_NaN()}).ok());
  EXPECT_FALSE(RankLayers({0.1, -1e-9}).ok());
  EXPECT_FALSE(RankLayers({}).ok());
}

TEST(ParseRankTiers, CountsAndRecipes) {
  absl::StatusOr<std::vector<RankTier>> t =
      ParseRankTiers(std::string("2=") + kBoost + ";3=base;1=bf16|bf16");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].layers, 2);
  EXPECT_EQ((*t)[0].recipe, kBoost);
  EXPECT_EQ((*t)[1].layers, 3);
  EXPECT_EQ((*t)[1].recipe, "base");
  EXPECT_EQ((*t)[2].recipe, "bf16|bf16");
  for (const char* bad : {"", "8", "=int2|int2", "x=int2|int2", "-1=int2|int2", "3="}) {
    EXPECT_FALSE(ParseRankTiers(bad).ok()) << bad;
  }
}

TEST(TieredCodecSpec, TopLayersGetTheBoostInAscendingOrder) {
  const std::vector<int> ranked = {20, 3, 17, 0, 9, 1};
  absl::StatusOr<std::string> spec = TieredCodecSpec(kBase, {{3, kBoost}}, ranked, /*head_dim=*/64);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(*spec, std::string(kBase) + ";3.17.20=" + kBoost);
  // What the codec then does per layer: the boosted layers' keys at 3.5 code bits.
  kernels::HistoryCodec c;
  std::string error;
  ASSERT_TRUE(kernels::ParseHistoryCodec(*spec, 64, &c, &error)) << error;
  for (int l : {3, 17, 20}) EXPECT_EQ(c.Side(l, 0).regions.size(), 2u) << l;
  for (int l : {0, 1, 9, 29}) EXPECT_EQ(c.Side(l, 0).regions.size(), 3u) << l;
}

TEST(TieredCodecSpec, TiersFollowTheRankingDownAndBaseAddsNothing) {
  const std::vector<int> ranked = {5, 4, 3, 2, 1, 0};
  absl::StatusOr<std::string> spec =
      TieredCodecSpec(kBase, {{1, "4x64:s8|2x64:s8"}, {3, "base"}, {2, "int2|int2"}}, ranked, 64);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(*spec, std::string(kBase) + ";5=4x64:s8|2x64:s8;0.1=int2|int2");
  EXPECT_EQ(*TieredCodecSpec(kBase, {{0, kBoost}}, ranked, 64), kBase);
}

TEST(TieredCodecSpec, RejectsTooManyLayersAndBadRecipes) {
  const std::vector<int> ranked = {1, 0, 2};
  EXPECT_FALSE(TieredCodecSpec(kBase, {{2, kBoost}, {2, kBoost}}, ranked, 64).ok());
  EXPECT_FALSE(TieredCodecSpec(kBase, {{1, "5x64|2x64"}}, ranked, 64).ok());
  EXPECT_FALSE(TieredCodecSpec(kBase, {{1, kBoost}}, ranked, /*head_dim=*/128).ok());
}

}  // namespace
}  // namespace kvstrata::calibration
