#pragma once

// The engine configuration the calibration and evaluation commands run one sequence through:
// a single sequence of up to max_tokens tokens, forwarded in chunks of up to `chunk` tokens,
// with the pools sized for exactly that.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "kernels/bits.h"
#include "model/model.h"

namespace kvstrata::calibration {

// rotations_path "" = identity. group_size 0 = head_dim. cpu_threads as
// EngineOptions::cpu_threads (0: the default; 1 for engines that run concurrently).
absl::StatusOr<std::unique_ptr<engine::Engine>> CreateFidelityEngine(
    std::shared_ptr<const model::LoadedModel> model, engine::KvCacheFormat format,
    const kernels::SplitLayout& layout, int group_size, const std::string& rotations_path,
    int64_t max_tokens, int chunk, int cpu_threads = 0,
    std::shared_ptr<const kernels::HistoryCodec> codec = nullptr);

}  // namespace kvstrata::calibration
