#pragma once

// `kvstrata calibrate`: fits OSCAR rotations and clip ratios for a model on real text.
//
//  1. Covariance pass. Each calibration window runs through the model (BF16 cache, identity
//     rotations); the backend's ForwardObserver hands over the post-RoPE q, k, v of every layer,
//     and AccumulateHeadStats (attention_stats.h) adds, per (layer, KV head), the query
//     covariance QᵀQ of the query heads sharing it, VᵀSᵀSV with the real causal softmax, and
//     OSCAR's diagonal proxy.
//  2. Fit R_K = U·H·P from QᵀQ and R_V from VᵀSᵀSV (or the proxy), per (layer, KV head) or one
//     per layer (the sum over the layer's heads, as OSCAR ships).
//  3. Clip search. Held-out windows (never in step 1) run through the model again; per (layer,
//     K|V, KV head) every candidate clip ratio is scored by the attention-logit error (keys)
//     or attention-output error (values) it causes on the tokens each query sees in INT2, with
//     the split layout's windows, and the smallest error wins.
//
// The result is a RotationSet plus the file metadata (engine/rotations.h, docs/rotation-file.md).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "calibration/text_corpus.h"
#include "engine/rotations.h"
#include "kernels/bits.h"
#include "model/model.h"

namespace kvstrata::calibration {

struct CalibrationOptions {
  // R = H alone (the normalised Walsh-Hadamard matrix, no eigenvectors, no permutation) with
  // searched clip ratios: the "no U" ablation (QuaRot-style rotation). Skips step 1.
  bool hadamard_only = false;
  bool shared_rotation = false;        // one rotation per layer (sum of the heads' covariances)
  bool value_proxy = false;            // R_V from OSCAR's proxy instead of VᵀSᵀSV
  bool lloyd_max = false;              // search clip ratios for Lloyd-Max INT2 levels
  int group_size = 0;                  // INT2 channels per scale/offset; 0 = head_dim
  kernels::SplitLayout layout;         // the windows the clip search assumes (sink 64, recent 256)
  std::vector<std::string> documents;  // names of the calibration documents (for metadata)
};

// Per (layer, K|V, KV head): the chosen clip ratio and the error it leaves relative to not
// clipping, from the held-out search.
struct ClipChoice {
  float ratio = 1.0f;
  double error = 0.0;            // at the chosen ratio
  double error_unclipped = 0.0;  // at ratio 1
};

struct CalibrationResult {
  engine::RotationSet rotations;
  engine::RotationFileInfo info;
  std::vector<ClipChoice> key_clips;    // [layers][kv_heads]
  std::vector<ClipChoice> value_clips;  // [layers][kv_heads]
  int64_t covariance_tokens = 0;
  int64_t heldout_tokens = 0;
};

using ProgressFn = std::function<void(const std::string& line)>;

// Runs the three steps over `covariance` and `heldout` windows (each window is one sequence,
// forwarded whole; both non-empty; every held-out window longer than the layout's
// sink + recent window + one page, so some query sees INT2 history). The model must have a
// tokenizer (the engine is built over it). Progress lines go to `progress` (may be empty).
absl::StatusOr<CalibrationResult> Calibrate(std::shared_ptr<const model::LoadedModel> model,
                                            const std::vector<TokenWindow>& covariance,
                                            const std::vector<TokenWindow>& heldout,
                                            const CalibrationOptions& options,
                                            const ProgressFn& progress = {});

}  // namespace kvstrata::calibration
