#pragma once

// Per-layer bit allocation from a measured sensitivity (docs/fidelity.md, "Round 2"): the
// layers ranked by how much error the base codec causes in each, and a history-codec spec
// (kernels/history_codec.h) that gives the top of the ranking more bits. The sensitivity comes
// from `kvstrata eval --layer-sensitivity` on the calibration text, so which layers are boosted
// is reproducible and never chosen on the text the formats are evaluated on.

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvstrata::calibration {

// The layers ordered by sensitivity, largest first; equal values keep the lower layer first
// (so a ranking is a pure function of the numbers). InvalidArgument on an empty list or on a
// value that is NaN or negative (every sensitivity measure here is an error, >= 0).
absl::StatusOr<std::vector<int>> RankLayers(const std::vector<double>& sensitivity);

// Consecutive stretches of the ranking, from the most sensitive layer down: `layers` layers get
// `recipe` ("K_RECIPE|V_RECIPE", or "base" for the base codec's own recipe).
struct RankTier {
  int layers = 0;
  std::string recipe;
};

// Parses "N=RECIPE(;N=RECIPE)*", e.g. "8=4x32+3x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr" or
// "4=A|B;18=base;8=C|D" (the last: top 4 get A|B, the next 18 the base, the next 8 C|D).
// InvalidArgument naming the bad tier.
absl::StatusOr<std::vector<RankTier>> ParseRankTiers(const std::string& spec);

// `base` (a codec spec, kernels/history_codec.h) with one override per tier that is not "base",
// over the tier's layers of `ranked` (written in ascending order, '.'-separated; tiers with no
// layers add nothing). InvalidArgument when the tiers ask for more layers than `ranked` holds,
// or when the result does not parse for rows of head_dim.
absl::StatusOr<std::string> TieredCodecSpec(const std::string& base,
                                            const std::vector<RankTier>& tiers,
                                            const std::vector<int>& ranked, int head_dim);

// Per-layer bits for both sides by water-filling (scripts/allocate_tiers.py's model, for keys
// and values): layer l's keys alone in the base recipe cost next-token KL sk[l] (its values
// alone sv[l]); a recipe with Δ more code bits per element than the base scales that by
// 2^(-2Δ), the layers and sides add up, and every (layer, side) gets the ladder rung that
// minimises the predicted KL within `budget` history bits per element (K and V averaged,
// every scale counted: kernels::SideRecipeBits). The base's own recipe is always a rung. A
// Lagrange-multiplier sweep; ties go to the earlier rung, so the result is a pure function of
// the numbers.
struct BitAllocation {
  std::vector<std::string> key_recipe, value_recipe;  // [layers]
  // History bits per element (K and V averaged); Σ s·2^(-2Δ) over layers and sides, and the
  // same with the base recipe everywhere.
  double bits = 0;
  double predicted = 0;
  double base_predicted = 0;
};
// `base` is K_RECIPE|V_RECIPE (no overrides); an empty value_sensitivity keeps every layer's
// values at the base (value_ladder unused). InvalidArgument on sizes that differ, on a
// sensitivity that is NaN or negative, on a recipe that does not parse, or when even the
// cheapest rungs exceed the budget.
absl::StatusOr<BitAllocation> AllocateBits(const std::vector<double>& key_sensitivity,
                                           const std::vector<double>& value_sensitivity,
                                           const std::string& base,
                                           const std::vector<std::string>& key_ladder,
                                           const std::vector<std::string>& value_ladder,
                                           double budget, int head_dim);

// The allocation as a codec spec: the most common (K, V) pair (ties: the one of the lowest
// layer) as the base, the other pairs as overrides in order of their lowest layer.
std::string AllocationSpec(const BitAllocation& allocation);

}  // namespace kvstrata::calibration
