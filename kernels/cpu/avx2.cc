// The portable kernels compiled for AVX2, FMA and F16C (see portable_matmul.h); CMake gives
// this file those flags, and the dispatcher calls it only where CpuSupports(kAvx2).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/int2_tables.h"
#include "kernels/numeric.h"
#include "kernels/quant.h"

namespace kvstrata::kernels::cpu::avx2 {
namespace {
inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
}  // namespace
// clang-format off
#include "kernels/cpu/portable_matmul.h"
#include "kernels/cpu/portable_attention.h"
// clang-format on
}  // namespace kvstrata::kernels::cpu::avx2
