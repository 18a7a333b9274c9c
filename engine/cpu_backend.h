#pragma once

#include <memory>

#include "engine/backend.h"
#include "engine/rotations.h"
#include "model/model.h"

namespace kvstrata::engine {

// The fp32 CPU forward pass: GEMMs through OpenBLAS, attention through the split cache.
// `model` and `rotations` must outlive the backend; `cache` is shared with the engine.
std::unique_ptr<Backend> CreateCpuBackend(const model::LoadedModel& model,
                                          const RotationSet& rotations, KvCache* cache);

}  // namespace kvstrata::engine
