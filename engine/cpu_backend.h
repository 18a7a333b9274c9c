#pragma once

#include <memory>

#include "engine/backend.h"
#include "engine/rotations.h"
#include "model/model.h"

namespace kvstrata::engine {

// The fp32 CPU forward pass: GEMMs through OpenBLAS, attention through the split cache, on
// `threads` threads (the caller's included; the Engine passes EngineOptions::cpu_threads).
// `model` and `rotations` must outlive the backend; `cache` is shared with the engine.
std::unique_ptr<Backend> CreateCpuBackend(const model::LoadedModel& model,
                                          const RotationSet& rotations, KvCache* cache,
                                          int threads = 1);

}  // namespace kvstrata::engine
