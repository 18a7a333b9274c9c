// The portable kernels for the build's baseline instruction set (see portable_matmul.h).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/int2_tables.h"
#include "kernels/numeric.h"
#include "kernels/quant.h"

namespace kvstrata::kernels::cpu::portable {
namespace {
inline uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
}  // namespace
// clang-format off
#include "kernels/cpu/portable_matmul.h"
#include "kernels/cpu/portable_attention.h"
// clang-format on
}  // namespace kvstrata::kernels::cpu::portable
