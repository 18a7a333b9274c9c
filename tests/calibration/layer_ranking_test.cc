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

namespace kvstrata::calibration {
namespace {

// The per-layer next-token KL of P2's base keys on the calibration text
// (docs/fidelity2/sensitivity-kl-2k.json), from which scripts/allocate_tiers.py made P2w.
const std::vector<double> kKeySensitivity = {
    8.758327190813314e-05, 9.187545862654453e-05,  0.0001667402114337611,  0.00011603622862488154,
    9.930118309136839e-05, 0.0001384536669492121,  0.0001714646495371537,  0.00041834660037498345,
    0.0002908548016764521, 8.846485490689159e-05,  0.00012545594599799282, 0.0001273782462773511,
    7.068631832659179e-05, 6.298274679277867e-05,  0.00021435562641505102, 0.00013939405044757145,
    7.778130043833089e-05, 0.0002936276293330987,  0.0009635619234501553,  0.00012976524345573962,
    0.000575210883019541,  0.00014353511627256411, 0.000145876012042469,   0.0011004828717032045,
    0.0002250713053216093, 5.498011411114618e-05,  0.00010725765007011325, 6.577538098812635e-05,
    0.0002712351632825526, 8.672668615717319e-05};
const std::vector<std::string> kP2wKeyLadder = {"4x64:eig:s8:pr", "4x32+3x32:eig:s8:pr",
                                                "4x16+3x32+2x16:eig:s8:pr", "3x32+2x32:eig:s8:pr"};

TEST(AllocateBits, ReproducesP2wFromItsSensitivity) {
  // Keys only, P2w's five key rungs: the committed P2w codec (docs/fidelity2/P2w.codec).
  absl::StatusOr<BitAllocation> a =
      AllocateBits(kKeySensitivity, {}, kBase, kP2wKeyLadder, {}, 2.5, 64);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_NEAR(a->bits, 2.4969, 1e-4);
  EXPECT_NEAR(a->predicted, 3.465e-3, 1e-6);
  EXPECT_NEAR(a->base_predicted, 6.650e-3, 1e-6);
  const std::string v = "|3x16+2x16+1x32:eig:s8:pr";
  EXPECT_EQ(AllocationSpec(*a),
            "3x32+2x32:eig:s8:pr" + v + ";2.5.6.14.15.21.22=4x16+3x32+2x16:eig:s8:pr" + v +
                ";3.4.10.11.19.26=4x16+3x16+2x32:eig:s8:pr" + v +
                ";7.8.17.24.28=4x32+3x32:eig:s8:pr" + v + ";18.20.23=4x64:eig:s8:pr" + v);
  kernels::HistoryCodec codec;
  std::string error;
  ASSERT_TRUE(kernels::ParseHistoryCodec(AllocationSpec(*a), 64, &codec, &error)) << error;
  EXPECT_NEAR(kernels::HistoryCodecBits(codec, 30, 64, 64), a->bits, 1e-12);
}

TEST(AllocateBits, ValuesCompeteForTheSameBits) {
  // Two layers: the keys of layer 0 and the values of layer 1 matter. At the base's own bits
  // they each go a quarter bit up, paid for by a quarter bit down on the other two sides.
  const std::vector<std::string> keys = {"4x16+3x32+2x16:eig:s8:pr", "3x32+2x32:eig:s8:pr"};
  const std::vector<std::string> values = {"3x16+2x32+1x16:eig:s8:pr", "2x32+1x32:eig:s8:pr"};
  absl::StatusOr<BitAllocation> base_only =
      AllocateBits({1e-3, 1e-6}, {1e-6, 1e-3}, kBase, {}, {}, 2.5, 64);
  ASSERT_TRUE(base_only.ok()) << base_only.status();
  EXPECT_EQ(base_only->key_recipe[0], "4x16+3x16+2x32:eig:s8:pr");
  absl::StatusOr<BitAllocation> a =
      AllocateBits({1e-3, 1e-6}, {1e-6, 1e-3}, kBase, keys, values, base_only->bits, 64);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->key_recipe, (std::vector<std::string>{keys[0], keys[1]}));
  EXPECT_EQ(a->value_recipe, (std::vector<std::string>{values[1], values[0]}));
  EXPECT_LE(a->bits, base_only->bits + 1e-12);
  EXPECT_NEAR(a->predicted, (2e-3 * std::sqrt(0.5) + 2e-6 * std::sqrt(2.0)), 1e-9);
}

TEST(AllocateBits, RefusesWhatCannotBeAllocated) {
  EXPECT_FALSE(AllocateBits({}, {}, kBase, {}, {}, 2.5, 64).ok());
  EXPECT_FALSE(AllocateBits({1e-3, 1e-3}, {1e-3}, kBase, {}, {}, 2.5, 64).ok());
  EXPECT_FALSE(AllocateBits({1e-3, -1.0}, {}, kBase, {}, {}, 2.5, 64).ok());
  EXPECT_FALSE(AllocateBits({1e-3}, {}, "4x64", {}, {}, 2.5, 64).ok());
  EXPECT_FALSE(AllocateBits({1e-3}, {}, kBase, {"int2"}, {}, 2.5, 64).ok());
  absl::StatusOr<BitAllocation> a = AllocateBits({1e-3}, {}, kBase, {}, {}, 1.0, 64);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("no allocation fits"), std::string::npos);
}

}  // namespace
}  // namespace kvstrata::calibration
