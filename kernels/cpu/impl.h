#pragma once

// The per-instruction-set implementations behind kernels/cpu/*.h, dispatched there. Internal to
// kvstrata_kernels. portable_matmul.h and portable_attention.h are compiled twice (portable.cc
// for the baseline, avx2.cc with -mavx2 -mfma -mf16c); avx512_*.cc are written with intrinsics.

#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/scratch.h"

// clang-format off
#define KV_CPU_IMPL_DECLARATIONS                                                           \
  void MatmulRows(const WeightView& w, const float* x, int m, int64_t x_stride,          \
                  int64_t row_begin, int64_t row_end, float* y, int64_t y_stride);       \
  void DequantizeRows(const WeightView& w, int64_t begin, int64_t end, float* out);      \
  void AttendBlock(const KvGeometry& g, const KvBlockPair& block, const QueryRows& q,     \
                   const AttentionState& state);                                         \
  void FinishAttentionState(const KvGeometry& g, int rows, const AttentionState& state); \
  void ExpInPlace(float* x, int n);
// clang-format on

namespace kvstrata::kernels::cpu {
namespace portable {
KV_CPU_IMPL_DECLARATIONS
}  // namespace portable
namespace avx2 {
KV_CPU_IMPL_DECLARATIONS
}  // namespace avx2
namespace avx512 {
KV_CPU_IMPL_DECLARATIONS
}  // namespace avx512

// Rows of x at most one pass over the weights serves.
inline constexpr int kMatmulRowsPerPass = 8;

}  // namespace kvstrata::kernels::cpu
