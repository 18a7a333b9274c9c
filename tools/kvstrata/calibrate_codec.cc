// kvstrata calibrate-codec: a history codec for the `codec` KV format in one command. Measures
// the per-layer next-token KL of the keys and of the values under a base codec on the
// calibration text, allocates every layer's bits within --bits, and writes a copy of the
// model's rotation file that carries the codec (docs/fidelity.md, rounds 3-4):
//
//   scripts/fetch-text.sh
//   kvstrata calibrate-codec --out my.P2.safetensors          # ~25 min for the default model
//   kvstrata generate --kv-format codec --rotations my.P2.safetensors --prompt "..."
//
// The defaults (base recipe, ladders, 2.5 bits, four windows of 2,048 tokens) are the recipe
// of rotations/SmolLM2-135M-Instruct.P2v4.safetensors. With --uniform-levels every recipe codes
// evenly spaced levels (`u`), measured as such, and the codec is served as codec fragment blocks
// (page encoding 5, docs/kv-format.md), the layout the GPU decodes without tables.

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "calibration/codec_calibration.h"
#include "calibration/text_corpus.h"
#include "engine/defaults.h"
#include "engine/rotations.h"
#include "tokenizer/tokenizer.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/engine_flags.h"
#include "tools/kvstrata/fidelity_flags.h"



ABSL_FLAG(double, bits, 2.5,
          "history bits per element, K and V averaged, metadata counted (the budget)");
ABSL_FLAG(std::string, codec_base, kvstrata::calibration::CodecCalibrationOptions{}.base,
          "K_RECIPE|V_RECIPE every layer starts from; its keys and values are measured");
ABSL_FLAG(std::string, codec_key_ladder,
          absl::StrJoin(kvstrata::calibration::CodecCalibrationOptions{}.key_ladder, ";"),
          ";-separated key recipes a layer may take besides the base's");
ABSL_FLAG(std::string, codec_value_ladder,
          absl::StrJoin(kvstrata::calibration::CodecCalibrationOptions{}.value_ladder, ";"),
          ";-separated value recipes a layer may take besides the base's");
ABSL_FLAG(int, sensitivity_context, 2048, "tokens per calibration window");
ABSL_FLAG(int, sensitivity_windows, 4, "calibration windows the sensitivities average over");
ABSL_FLAG(bool, uniform_levels, false,
          "code every recipe (base and ladders) on uniform levels (`u`): the codec is served as "
          "codec fragment blocks, which the GPU split decode reads without tables");
ABSL_FLAG(int, parallel_layers, 2,
          "layer measurements run concurrently (each with single-threaded BLAS)");

namespace kvstrata::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvstrata calibrate-codec: %s\n", std::string(s.message()).c_str());
  return 1;
}

int RunCalibrateCodec() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out: the rotation file to write"));
  calibration::CodecCalibrationOptions o;
  o.base = absl::GetFlag(FLAGS_codec_base);
  o.key_ladder = absl::StrSplit(absl::GetFlag(FLAGS_codec_key_ladder), ';', absl::SkipEmpty());
  o.value_ladder =
      absl::StrSplit(absl::GetFlag(FLAGS_codec_value_ladder), ';', absl::SkipEmpty());
  if (absl::GetFlag(FLAGS_uniform_levels)) {
    const auto uniform = [](const std::string& recipe) {
      return absl::StrCat(recipe, absl::EndsWith(recipe, ":u") ? "" : ":u");
    };
    const std::vector<std::string> sides = absl::StrSplit(o.base, '|');
    std::vector<std::string> base;
    for (const std::string& side : sides) base.push_back(uniform(side));
    o.base = absl::StrJoin(base, "|");
    for (std::string& r : o.key_ladder) r = uniform(r);
    for (std::string& r : o.value_ladder) r = uniform(r);
  }
  o.bits = absl::GetFlag(FLAGS_bits);
  o.context = absl::GetFlag(FLAGS_sensitivity_context);
  o.windows = absl::GetFlag(FLAGS_sensitivity_windows);
  o.threads = absl::GetFlag(FLAGS_parallel_layers);
  if (!(o.bits > 0.0 && o.bits <= 16.0)) {
    return Fail(absl::InvalidArgumentError("--bits must be in (0, 16]"));
  }
  if (o.context < 512 || o.context > 131072) {
    return Fail(absl::InvalidArgumentError("--sensitivity-context must be in [512, 131072]"));
  }
  if (o.windows < 1) return Fail(absl::InvalidArgumentError("--sensitivity-windows must be >= 1"));
  if (o.threads < 1 || o.threads > 64) {
    return Fail(absl::InvalidArgumentError("--parallel-layers must be in [1, 64]"));
  }

  std::fprintf(stderr, "calibrate-codec: loading the model\n");
  absl::StatusOr<std::shared_ptr<const model::LoadedModel>> model = LoadModelFromFlag();
  if (!model.ok()) return Fail(model.status());
  // The rotation file the codec goes with: --rotations, else the model's INT2 file.
  o.rotations_path = absl::GetFlag(FLAGS_rotations);
  if (o.rotations_path.empty()) {
    absl::StatusOr<std::string> found = engine::FindRotationFile(
        engine::DefaultRotationsDir(), (*model)->fingerprint, "uniform", /*with_codec=*/false);
    if (!found.ok()) {
      return Fail(absl::NotFoundError(absl::StrCat(
          found.status().message(), "; fit one with `kvstrata calibrate` and pass --rotations")));
    }
    o.rotations_path = *found;
  }
  absl::StatusOr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::Create((*model)->tokenizer);
  if (!tok.ok()) return Fail(tok.status());
  const std::string text_dir = TextDirFromFlag("calibration");
  absl::StatusOr<std::vector<calibration::TextDocument>> docs =
      calibration::LoadTextDocuments(text_dir, *tok);
  if (!docs.ok()) return Fail(docs.status());
  std::filesystem::path text_path(text_dir);
  if (!text_path.has_filename()) text_path = text_path.parent_path();  // ".../calibration/"
  o.text = text_path.filename().string();
  const int layers = (*model)->config.num_layers;
  std::fprintf(stderr,
               "calibrate-codec: %s, %d layers; keys and values of each layer under %s, "
               "%d windows of %d tokens from %s; rotations %s\n",
               (*model)->config.name.c_str(), layers, o.base.c_str(), o.windows, o.context,
               text_dir.c_str(), o.rotations_path.c_str());
  absl::StatusOr<calibration::CodecCalibration> c = calibration::CalibrateCodec(
      *model, *docs, o, [](const std::string& line) {
        std::fprintf(stderr, "%s\n", line.c_str());
      });
  if (!c.ok()) return Fail(c.status());
  std::printf("layer  keys: next-token KL  recipe                      values: KL  recipe\n");
  for (int l = 0; l < layers; ++l) {
    std::printf("%5d  %18.4e  %-27s %10.4e  %s\n", l, c->key_sensitivity[l],
                c->allocation.key_recipe[l].c_str(), c->value_sensitivity[l],
                c->allocation.value_recipe[l].c_str());
  }
  std::printf("allocation: predicted KL %.4e at %.4f history bits (base recipe everywhere: %.4e)\n",
              c->allocation.predicted, c->allocation.bits, c->allocation.base_predicted);
  std::printf("codec: %s\n", c->spec.c_str());
  if (absl::Status s = calibration::WriteRotationFileWithCodec(o.rotations_path, out, **model,
                                                               c->spec, c->source);
      !s.ok()) {
    return Fail(absl::UnavailableError(absl::StrCat("--out ", out, ": ", s.message())));
  }
  std::printf("wrote %s (%s's rotations with this history codec; %.0f s): serve it with "
              "--kv-format codec --rotations %s\n",
              out.c_str(), o.rotations_path.c_str(), c->seconds, out.c_str());
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(calibrate_codec, "calibrate-codec",
                 "allocate each layer's history bits by measured sensitivity; write a "
                 "rotation file carrying the codec",
                 RunCalibrateCodec);

}  // namespace kvstrata::cli
