#pragma once

// Flags shared by the subcommands that run the model engine (generate, bench-engine, and the
// calibration and evaluation commands to come): which model, which KV format, which rotation
// file, how much KV cache. absl flags are global to the binary, so each is defined once, here.

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "engine/defaults.h"
#include "engine/engine.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, kv_format);
ABSL_DECLARE_FLAG(std::string, rotations);
ABSL_DECLARE_FLAG(int, kv_cache_mb);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, gpu_weights);
ABSL_DECLARE_FLAG(bool, cuda_graphs);
ABSL_DECLARE_FLAG(bool, gpu_sampling);
ABSL_DECLARE_FLAG(int, cpu_threads);

namespace kvstrata::cli {

// Defaults shared with the service binaries (engine/defaults.h).
using engine::CacheDir;
using engine::DefaultModelPath;

// Engine options from --model (or the default model), --kv-format, --rotations, --kv-cache-mb,
// --device, the --gpu-* and --cuda-graphs flags and --cpu-threads; the caller adjusts the sizing
// (sequences, chunks) it needs. InvalidArgument naming the flag for a bad value or a --model that does not exist; NotFound pointing at
// scripts/fetch-model.sh when --model is not given and the default model is absent.
absl::StatusOr<engine::EngineOptions> EngineOptionsFromFlags();

}  // namespace kvstrata::cli
