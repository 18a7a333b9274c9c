#pragma once

// Per-thread scratch buffers for the CPU kernels and their callers, so a decode step allocates
// nothing once warm. Buffer 0 belongs to the kernels themselves; callers use 1 to 3.

#include <cstdint>

namespace kvstrata::kernels::cpu {

// At least `floats` floats, 64-byte aligned, owned by the calling thread; grows and keeps its
// size. Valid until the same thread asks for the same buffer again.
float* ThreadScratch(int64_t floats, int which = 0);

}  // namespace kvstrata::kernels::cpu
