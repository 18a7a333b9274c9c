#pragma once

#include <memory>

#include "engine/backend.h"
#include "engine/rotations.h"
#include "model/model.h"

namespace kvstrata::engine {

// The CPU forward pass, fp32 activations over the model's weights as its file stores them:
// every product reads the stored blocks directly (kernels/cpu/matmul.h) and attention reads
// the cache's pages (BF16, and INT2 from the codes: engine/attention.h), on `threads` threads
// (the caller's included; the Engine passes EngineOptions::cpu_threads). The kernels' arithmetic
// for a token does not depend on the other tokens of the batch, so chunking a prompt does not
// change a bit of its pages. The instruction set is the best the CPU has
// (kernels::cpu::DetectCpuIsa), or $KVSTRATA_CPU_ISA (portable, avx2, avx512).
// `model` and `rotations` must outlive the backend; `cache` is shared with the engine.
std::unique_ptr<Backend> CreateCpuBackend(const model::LoadedModel& model,
                                          const RotationSet& rotations, KvCache* cache,
                                          int threads = 1);

}  // namespace kvstrata::engine
