#pragma once

// Flags shared by `kvstrata calibrate` and `kvstrata eval` (absl flags are global to the
// binary, so each is defined once, here), and the model loading both do.

#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "model/model.h"

ABSL_DECLARE_FLAG(std::string, text_dir);
ABSL_DECLARE_FLAG(std::string, out);

namespace kvstrata::cli {

// --text-dir, or ${KVSTRATA_CACHE:-$HOME/.cache/kvstrata}/text/<set> where
// scripts/fetch-text.sh puts the calibration and evaluation sets.
std::string TextDirFromFlag(const std::string& set);

// Loads --model (default: DefaultModelPath()): a folder as a Hugging Face model, a file as
// GGUF. Errors name the flag.
absl::StatusOr<std::shared_ptr<const model::LoadedModel>> LoadModelFromFlag();

}  // namespace kvstrata::cli
