#include "calibration/codec_calibration.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/rotations.h"

namespace kvstrata::calibration {

absl::StatusOr<CodecCalibration> CalibrateCodec(std::shared_ptr<const model::LoadedModel> model,
                                                const std::vector<TextDocument>& documents,
                                                const CodecCalibrationOptions& o,
                                                const EvalProgressFn& progress) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> base = absl::StrSplit(o.base, '|');
  if (base.size() != 2 || base[0].empty() || base[1].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("base codec \"", o.base, "\": expected K_RECIPE|V_RECIPE"));
  }
  if (!(o.bits > 0.0 && o.bits <= 16.0)) {
    return absl::InvalidArgumentError(absl::StrCat("bits ", o.bits, ": must be in (0, 16]"));
  }
  if (o.context < 2 || o.windows < 1) {
    return absl::InvalidArgumentError("a calibration needs a context >= 2 and >= 1 window");
  }
  // One format per (side, layer): that layer's keys (or values) in the base recipe, every
  // other row in BF16, as `kvstrata eval --layer-sensitivity --rank-by next-token-kl` does.
  const std::string at = o.rotations_path.empty() ? "" : absl::StrCat("@", o.rotations_path);
  const int layers = model->config.num_layers, head_dim = model->config.head_dim;
  std::vector<EvalFormat> formats;
  for (int side = 0; side < 2; ++side) {
    const std::string recipe = side == 0 ? absl::StrCat(base[0], "|bf16")
                                         : absl::StrCat("bf16|", base[1]);
    absl::StatusOr<EvalFormat> one =
        ResolveEvalFormat(absl::StrCat(side == 0 ? "K" : "V", "=codec:", recipe, at), {});
    if (!one.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("base codec \"", o.base, "\": ", one.status().message()));
    }
    for (int l = 0; l < layers; ++l) {
      EvalFormat f = *one;
      f.name = absl::StrCat(one->name, "@", l);
      f.codec = absl::StrCat("bf16|bf16;", l, "=", recipe);
      formats.push_back(std::move(f));
    }
  }
  EvalOptions eval;
  eval.contexts = {o.context};
  eval.windows = {o.windows};
  eval.attention_samples = 0;
  eval.threads = o.threads;
  eval.chunk = o.chunk;
  absl::StatusOr<EvalReport> report = Evaluate(std::move(model), documents, formats, eval, progress);
  if (!report.ok()) return report.status();
  if (report->results.size() != formats.size()) {
    return absl::InternalError("the evaluation returned another number of results");
  }
  CodecCalibration c;
  for (size_t i = 0; i < formats.size(); ++i) {
    const EvalResult& r = report->results[i];
    if (r.format != formats[i].name) {
      return absl::InternalError(absl::StrCat("result ", i, " is ", r.format, ", expected ",
                                              formats[i].name));
    }
    (static_cast<int>(i) < layers ? c.key_sensitivity : c.value_sensitivity).push_back(r.kl_mean);
  }
  absl::StatusOr<BitAllocation> a = AllocateBits(c.key_sensitivity, c.value_sensitivity, o.base,
                                                 o.key_ladder, o.value_ladder, o.bits, head_dim);
  if (!a.ok()) return a.status();
  c.allocation = *std::move(a);
  c.spec = AllocationSpec(c.allocation);
  nlohmann::json source;
  source["method"] = "allocate-bits";
  source["rank_by"] = "next-token-kl";
  source["tier_base"] = o.base;
  source["budget"] = o.bits;
  source["key_ladder"] = o.key_ladder;
  source["value_ladder"] = o.value_ladder;
  source["key_sensitivity"] = c.key_sensitivity;
  source["value_sensitivity"] = c.value_sensitivity;
  source["predicted_kl"] = c.allocation.predicted;
  source["bits"] = c.allocation.bits;
  source["measured"] = {{"context", o.context}, {"windows", o.windows}, {"text", o.text}};
  c.source = source.dump();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return c;
}

absl::Status WriteRotationFileWithCodec(const std::string& from, const std::string& to,
                                        const model::LoadedModel& model, const std::string& spec,
                                        const std::string& source) {
  absl::StatusOr<engine::RotationSet> r =
      engine::ReadRotationFile(from, model.config.num_layers, model.config.num_kv_heads,
                               model.config.head_dim, model.fingerprint);
  if (!r.ok()) return r.status();
  engine::RotationFileInfo info = r->info;
  info.history_codec = spec;
  info.history_codec_source = source;
  return engine::WriteRotationFile(to, *r, info);
}

}  // namespace kvstrata::calibration
