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

namespace {

// Code bits per element of a regions recipe (no scales): what Δ compares.
double CodeBits(const kernels::SideRecipe& r, int head_dim) {
  double bits = 0.0;
  for (const kernels::CodecRegion& reg : r.regions) bits += static_cast<double>(reg.bits) * reg.channels;
  return bits / head_dim;
}

struct Rung {
  std::string recipe;
  double delta = 0;  // code bits over the base's
  double bits = 0;   // kernels::SideRecipeBits
};

absl::StatusOr<std::vector<Rung>> Ladder(const std::string& base_side,
                                         const std::vector<std::string>& recipes, int head_dim) {
  std::vector<std::string> all = {base_side};
  for (const std::string& r : recipes) {
    if (r != base_side) all.push_back(r);
  }
  std::vector<Rung> out;
  double base_code = 0.0;
  for (size_t i = 0; i < all.size(); ++i) {
    kernels::HistoryCodec c;
    std::string error;
    // Parsed as the key side of a codec (its value side is irrelevant here).
    if (!kernels::ParseHistoryCodec(all[i] + "|bf16", head_dim, &c, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("recipe \"", all[i], "\": ", error));
    }
    const kernels::SideRecipe& side = c.all.side[0];
    if (side.kind != kernels::SideRecipe::Kind::kRegions) {
      return absl::InvalidArgumentError(
          absl::StrCat("recipe \"", all[i], "\": a ladder needs regions recipes"));
    }
    const double code = CodeBits(side, head_dim);
    if (i == 0) base_code = code;
    out.push_back({all[i], code - base_code, kernels::SideRecipeBits(side, head_dim, head_dim)});
  }
  return out;
}

absl::Status CheckSensitivity(const std::vector<double>& s, const char* side) {
  for (size_t l = 0; l < s.size(); ++l) {
    if (!(s[l] >= 0.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(side, " layer ", l, ": sensitivity ", s[l], " is not a number >= 0"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BitAllocation> AllocateBits(const std::vector<double>& key_sensitivity,
                                           const std::vector<double>& value_sensitivity,
                                           const std::string& base,
                                           const std::vector<std::string>& key_ladder,
                                           const std::vector<std::string>& value_ladder,
                                           double budget, int head_dim) {
  const size_t layers = key_sensitivity.size();
  if (layers == 0) return absl::InvalidArgumentError("no layers to allocate");
  if (!value_sensitivity.empty() && value_sensitivity.size() != layers) {
    return absl::InvalidArgumentError(absl::StrCat("key sensitivities for ", layers,
                                                   " layers, value sensitivities for ",
                                                   value_sensitivity.size()));
  }
  if (absl::Status s = CheckSensitivity(key_sensitivity, "key"); !s.ok()) return s;
  if (absl::Status s = CheckSensitivity(value_sensitivity, "value"); !s.ok()) return s;
  const std::vector<std::string> sides = absl::StrSplit(base, '|');
  if (sides.size() != 2 || base.find(';') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("base \"", base, "\" is not K_RECIPE|V_RECIPE without overrides"));
  }
  absl::StatusOr<std::vector<Rung>> kl = Ladder(sides[0], key_ladder, head_dim);
  if (!kl.ok()) return kl.status();
  absl::StatusOr<std::vector<Rung>> vl = Ladder(
      sides[1], value_sensitivity.empty() ? std::vector<std::string>{} : value_ladder, head_dim);
  if (!vl.ok()) return vl.status();
  const std::vector<double> zero(layers, 0.0);
  const std::vector<double>& sv = value_sensitivity.empty() ? zero : value_sensitivity;
  const std::vector<double>& sk = key_sensitivity;
  double total = 0.0;
  for (size_t l = 0; l < layers; ++l) total += sk[l] + sv[l];
  const double allowed = budget * 2.0 * static_cast<double>(layers);

  BitAllocation best;
  bool found = false;
  std::vector<int> pk(layers), pv(layers);
  const auto pick = [](const std::vector<Rung>& ladder, double s, double lambda) {
    int choice = 0;
    double cost = 0.0;
    for (size_t i = 0; i < ladder.size(); ++i) {
      const double c = s * std::exp2(-2.0 * ladder[i].delta) + lambda * ladder[i].bits;
      if (i == 0 || c < cost) choice = static_cast<int>(i), cost = c;
    }
    return choice;
  };
  // λ from "bits are free" to "bits are all that matter", geometrically.
  constexpr int kSteps = 4000;
  const double scale = total > 0.0 ? total / static_cast<double>(layers) : 1.0;
  for (int step = 0; step <= kSteps; ++step) {
    const double lambda = scale * std::pow(10.0, -6.0 + 8.0 * step / kSteps);
    double used = 0.0, predicted = 0.0;
    for (size_t l = 0; l < layers; ++l) {
      pk[l] = pick(*kl, sk[l], lambda);
      pv[l] = pick(*vl, sv[l], lambda);
      used += (*kl)[pk[l]].bits + (*vl)[pv[l]].bits;
      predicted += sk[l] * std::exp2(-2.0 * (*kl)[pk[l]].delta) +
                   sv[l] * std::exp2(-2.0 * (*vl)[pv[l]].delta);
    }
    if (used > allowed + 1e-9) continue;
    if (!found || predicted < best.predicted) {
      found = true;
      best.predicted = predicted;
      best.bits = used / (2.0 * static_cast<double>(layers));
      best.key_recipe.clear();
      best.value_recipe.clear();
      for (size_t l = 0; l < layers; ++l) {
        best.key_recipe.push_back((*kl)[pk[l]].recipe);
        best.value_recipe.push_back((*vl)[pv[l]].recipe);
      }
    }
  }
  if (!found) {
    return absl::InvalidArgumentError(
        absl::StrCat("no allocation fits ", budget, " history bits per element"));
  }
  best.base_predicted = total;
  return best;
}

std::string AllocationSpec(const BitAllocation& a) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // in order of lowest layer
  for (size_t l = 0; l < a.key_recipe.size(); ++l) {
    const std::string pair = a.key_recipe[l] + "|" + a.value_recipe[l];
    auto it =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == pair; });
    if (it == groups.end()) {
      groups.push_back({pair, {static_cast<int>(l)}});
    } else {
      it->second.push_back(static_cast<int>(l));
    }
  }
  size_t base = 0;
  for (size_t i = 1; i < groups.size(); ++i) {
    if (groups[i].second.size() > groups[base].second.size()) base = i;
  }
  std::string spec = groups[base].first;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i != base)
      absl::StrAppend(&spec, ";", absl::StrJoin(groups[i].second, "."), "=", groups[i].first);
  }
  return spec;
}

}  // namespace kvstrata::calibration
