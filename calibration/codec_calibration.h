#pragma once

// Calibrating a history codec in one call: the per-layer next-token KL of the keys and of the
// values under a base codec, measured on calibration text (each layer's side in the codec,
// everything else in BF16), then the bits of every layer's keys and values allocated within a
// budget (AllocateBits) into a codec spec a rotation file carries (docs/fidelity.md, rounds
// 3-4; `kvstrata calibrate-codec`).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "calibration/evaluate.h"
#include "calibration/layer_ranking.h"
#include "calibration/text_corpus.h"
#include "model/model.h"

namespace kvstrata::calibration {

struct CodecCalibrationOptions {
  // K_RECIPE|V_RECIPE every layer starts from, and the richer or leaner rungs each side may
  // take (kernels/history_codec.h recipes). The defaults are the served P2v4's.
  std::string base = "4x16+3x16+2x32:eig:s8:pr|3x16+2x16+1x32:eig:s8:pr";
  std::vector<std::string> key_ladder = {
      "4x64:eig:s8:pr",          "4x32+3x32:eig:s8:pr",       "4x16+3x32+2x16:eig:s8:pr",
      "3x32+2x32:eig:s8:pr",     "3x32+2x16+1x16:eig:s8:pr",  "3x16+2x32+1x16:eig:s8:pr"};
  std::vector<std::string> value_ladder = {
      "4x16+3x16+2x32:eig:s8:pr", "3x32+2x32:eig:s8:pr", "3x16+2x32+1x16:eig:s8:pr",
      "2x32+1x32:eig:s8:pr"};
  double bits = 2.5;  // history bits per element, K and V averaged, metadata counted
  int context = 2048;  // tokens per calibration window
  int windows = 4;     // windows (MakeWindows order)
  int threads = 2;     // layers measured concurrently
  int chunk = 512;
  std::string rotations_path;  // the rotation file the codec goes with ("" = identity)
  std::string text = "calibration";  // the text set's name, recorded in the source
};

struct CodecCalibration {
  std::vector<double> key_sensitivity, value_sensitivity;  // next-token KL per layer
  BitAllocation allocation;
  std::string spec;    // the codec (AllocationSpec)
  std::string source;  // JSON: how the spec was chosen (RotationFileInfo::history_codec_source)
  double seconds = 0;
};

// InvalidArgument naming the option for a base or ladder recipe that does not parse, too few
// windows of `context` tokens in `documents`, or a budget below the leanest rungs.
absl::StatusOr<CodecCalibration> CalibrateCodec(std::shared_ptr<const model::LoadedModel> model,
                                                const std::vector<TextDocument>& documents,
                                                const CodecCalibrationOptions& options,
                                                const EvalProgressFn& progress = {});

// A copy of the rotation file at `from` whose metadata carries `spec` and `source`.
absl::Status WriteRotationFileWithCodec(const std::string& from, const std::string& to,
                                        const model::LoadedModel& model, const std::string& spec,
                                        const std::string& source);

}  // namespace kvstrata::calibration
