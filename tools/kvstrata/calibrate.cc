// kvstrata calibrate: fits OSCAR rotations (R = U·H·P per layer and KV head) and clip ratios
// for a model on real text, and writes them as a rotation file (docs/rotation-file.md).
//
//   scripts/fetch-text.sh
//   kvstrata calibrate --out rotations/SmolLM2-135M-Instruct.safetensors

#include "calibration/calibrate.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "calibration/text_corpus.h"
#include "engine/rotations.h"
#include "tokenizer/tokenizer.h"
#include "tools/kvstrata/commands.h"
#include "tools/kvstrata/fidelity_flags.h"

ABSL_FLAG(int64_t, tokens, 32768,
          "calibration tokens whose queries, keys and values enter the covariances");
ABSL_FLAG(int, window_tokens, 1024, "tokens per calibration sequence (>= 512)");
ABSL_FLAG(int64_t, heldout_tokens, 2048,
          "further calibration tokens (whole windows, never in the covariances) for the clip "
          "search");
ABSL_FLAG(bool, shared_rotation, false,
          "one rotation per layer shared by its KV heads (as OSCAR ships) instead of per head");
ABSL_FLAG(bool, value_proxy, false,
          "value rotations from OSCAR's proxy (squared raw logits) instead of VᵀSᵀSV with the "
          "causal softmax");
ABSL_FLAG(bool, hadamard_only, false,
          "ablation: every rotation is the Hadamard matrix (no eigenvectors U, no permutation P); "
          "clip ratios are still searched");
ABSL_FLAG(bool, lloyd_max, false, "search clip ratios for Lloyd-Max INT2 levels (int2-lloyd-max)");
ABSL_FLAG(int, group_size, 0, "INT2 channels per scale/offset (0 = head_dim)");

namespace kvstrata::cli {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "kvstrata calibrate: %s\n", std::string(s.message()).c_str());
  return 1;
}

int RunCalibrate() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return Fail(absl::InvalidArgumentError("--out is required"));
  const int64_t tokens = absl::GetFlag(FLAGS_tokens);
  const int window = absl::GetFlag(FLAGS_window_tokens);
  const int64_t heldout_tokens = absl::GetFlag(FLAGS_heldout_tokens);
  if (window < 512 || window > 8192) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--window-tokens=%d must be in [512, 8192] (a query sees INT2 history only past 383 "
        "tokens)",
        window)));
  }
  if (tokens < window) {
    return Fail(absl::InvalidArgumentError(
        absl::StrFormat("--tokens=%d must be at least --window-tokens=%d", tokens, window)));
  }
  if (heldout_tokens < window) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--heldout-tokens=%d must be at least --window-tokens=%d", heldout_tokens, window)));
  }
  const int group = absl::GetFlag(FLAGS_group_size);

  std::fprintf(stderr, "calibrate: loading the model\n");
  absl::StatusOr<std::shared_ptr<const model::LoadedModel>> model = LoadModelFromFlag();
  if (!model.ok()) return Fail(model.status());
  const model::ModelConfig& c = (*model)->config;
  if (group != 0 && (group % 16 != 0 || c.head_dim % group != 0)) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--group-size=%d must be 0 or a multiple of 16 dividing head_dim=%d", group, c.head_dim)));
  }
  absl::StatusOr<tokenizer::Tokenizer> tok = tokenizer::Tokenizer::Create((*model)->tokenizer);
  if (!tok.ok()) return Fail(tok.status());
  const std::string text_dir = TextDirFromFlag("calibration");
  absl::StatusOr<std::vector<calibration::TextDocument>> docs =
      calibration::LoadTextDocuments(text_dir, *tok);
  if (!docs.ok()) return Fail(docs.status());
  int64_t total = 0;
  calibration::CalibrationOptions options;
  for (const auto& d : *docs)
    total += static_cast<int64_t>(d.tokens.size()), options.documents.push_back(d.name);
  const int64_t n_cov = (tokens + window - 1) / window;
  const int64_t n_held = (heldout_tokens + window - 1) / window;
  const std::vector<calibration::TokenWindow> cov =
      calibration::MakeWindows(*docs, window, 0, n_cov);
  const std::vector<calibration::TokenWindow> held =
      calibration::MakeWindows(*docs, window, n_cov, n_held);
  if (static_cast<int64_t>(cov.size()) < n_cov || static_cast<int64_t>(held.size()) < n_held) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
        "--text-dir %s has %d windows of %d tokens, fewer than --tokens + --heldout-tokens need "
        "(%d)",
        text_dir, calibration::MakeWindows(*docs, window).size(), window, n_cov + n_held)));
  }
  std::fprintf(stderr,
               "calibrate: %s, %d layers x %d KV heads, head_dim %d; %zu documents (%lld tokens) "
               "from %s; %zu covariance + %zu held-out windows of %d tokens\n",
               c.name.c_str(), c.num_layers, c.num_kv_heads, c.head_dim, docs->size(),
               static_cast<long long>(total), text_dir.c_str(), cov.size(), held.size(), window);

  options.hadamard_only = absl::GetFlag(FLAGS_hadamard_only);
  options.shared_rotation = absl::GetFlag(FLAGS_shared_rotation);
  options.value_proxy = absl::GetFlag(FLAGS_value_proxy);
  options.lloyd_max = absl::GetFlag(FLAGS_lloyd_max);
  options.group_size = group;
  absl::StatusOr<calibration::CalibrationResult> result = calibration::Calibrate(
      *model, cov, held, options,
      [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
  if (!result.ok()) return Fail(result.status());
  if (absl::Status s = engine::WriteRotationFile(out, result->rotations, result->info); !s.ok()) {
    return Fail(s);
  }
  // Read it back through the engine's validating reader: what we wrote is what a server loads.
  absl::StatusOr<engine::RotationSet> check = engine::ReadRotationFile(
      out, c.num_layers, c.num_kv_heads, c.head_dim, (*model)->fingerprint);
  if (!check.ok()) return Fail(check.status());
  double k_clip = 0, v_clip = 0;
  for (float r : check->k_clip) k_clip += r;
  for (float r : check->v_clip) v_clip += r;
  std::printf(
      "wrote %s\n  sha256 %s\n  model %s (%s)\n  calibration data %s (%lld + %lld tokens)\n"
      "  mean clip ratio: keys %.4f, values %.4f\n",
      out.c_str(), check->digest.c_str(), c.name.c_str(),
      check->model_fingerprint.substr(0, 16).c_str(),
      check->info.calibration_digest.substr(0, 16).c_str(),
      static_cast<long long>(check->info.calibration_tokens),
      static_cast<long long>(check->info.heldout_tokens), k_clip / check->k_clip.size(),
      v_clip / check->v_clip.size());
  return 0;
}

}  // namespace

KVSTRATA_COMMAND(calibrate, "calibrate",
                 "fit OSCAR rotations and clip ratios on real text, write a rotation file",
                 RunCalibrate);

}  // namespace kvstrata::cli
