// The portable attention compiled for AVX2, FMA and F16C (portable_attention.h); the products
// are avx2_matmul.cc. CMake gives both files those flags, and the dispatcher calls them only
// where CpuSupports(kAvx2).

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
#include "kernels/cpu/portable_attention.h"
}  // namespace kvstrata::kernels::cpu::avx2
