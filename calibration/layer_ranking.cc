#include "calibration/layer_ranking.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/history_codec.h"

namespace kvstrata::calibration {

absl::StatusOr<std::vector<int>> RankLayers(const std::vector<double>& sensitivity) {
  if (sensitivity.empty()) return absl::InvalidArgumentError("no layers to rank");
  for (size_t l = 0; l < sensitivity.size(); ++l) {
    if (!(sensitivity[l] >= 0.0)) {  // also false for NaN
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": sensitivity ", sensitivity[l], " is not a number >= 0"));
    }
  }
  std::vector<int> order(sensitivity.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return sensitivity[a] > sensitivity[b]; });
  return order;
}

absl::StatusOr<std::vector<RankTier>> ParseRankTiers(const std::string& spec) {
  std::vector<RankTier> tiers;
  for (absl::string_view part : absl::StrSplit(spec, ';')) {
    const size_t eq = part.find('=');
    RankTier t;
    if (eq == absl::string_view::npos || !absl::SimpleAtoi(part.substr(0, eq), &t.layers) ||
        t.layers < 0 || eq + 1 == part.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tier \"", part, "\" is not N=K_RECIPE|V_RECIPE or N=base"));
    }
    t.recipe = std::string(part.substr(eq + 1));
    tiers.push_back(std::move(t));
  }
  return tiers;
}

absl::StatusOr<std::string> TieredCodecSpec(const std::string& base,
                                            const std::vector<RankTier>& tiers,
                                            const std::vector<int>& ranked, int head_dim) {
  std::string spec = base;
  size_t next = 0;
  for (const RankTier& t : tiers) {
    if (t.layers < 0 || next + t.layers > ranked.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tiers ask for more than the ", ranked.size(), " ranked layers"));
    }
    std::vector<int> layers(ranked.begin() + next, ranked.begin() + next + t.layers);
    next += t.layers;
    if (t.recipe == "base" || layers.empty()) continue;
    std::sort(layers.begin(), layers.end());
    absl::StrAppend(&spec, ";", absl::StrJoin(layers, "."), "=", t.recipe);
  }
  kernels::HistoryCodec codec;
  std::string error;
  if (!kernels::ParseHistoryCodec(spec, head_dim, &codec, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("codec \"", spec, "\": ", error));
  }
  return spec;
}

}  // namespace kvstrata::calibration
