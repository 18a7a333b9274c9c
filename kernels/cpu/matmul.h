#pragma once

// Products with weight matrices in the form GGUF files store them, on the CPU: the model's
// matrices are read in place, block by block, and never expanded to fp32 in memory (a decode
// step at batch 1 is bound by the bytes it reads: 0.625 bytes per weight for Q4_1 against 4).
// Activations and accumulation stay fp32, so the results are the fp32 products of the exact
// dequantised weights up to summation order.
//
// Formats (ggml's, little-endian; a row of `cols` elements is cols / 32 consecutive blocks for
// the block formats, where element j < 16 of a block is the low nibble of qs[j] and j + 16 its
// high nibble):
//   Q8_0 {fp16 d; int8 qs[32]}           w = d * q
//   Q4_0 {fp16 d; uint8 qs[16]}          w = d * (q - 8)
//   Q4_1 {fp16 d; fp16 m; uint8 qs[16]}  w = d * q + m
//   F32, F16, BF16                       one element each
// model/dequant.h defines the same formats for the loaders; DequantizeRows equals its
// Dequantize bit for bit.

#include <cstdint>

#include "kernels/cpu/isa.h"

namespace kvstrata::kernels::cpu {

enum class WeightFormat : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1 };

const char* WeightFormatName(WeightFormat format);
bool IsBlockFormat(WeightFormat format);  // Q8_0, Q4_0, Q4_1: 32 elements per block
// Bytes of one row; `cols` must be a multiple of 32 for the block formats.
int64_t WeightRowBytes(WeightFormat format, int64_t cols);

// A weight matrix [rows][cols], row-major (y = x·Wᵀ), rows packed without padding.
struct WeightView {
  WeightFormat format = WeightFormat::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // rows * WeightRowBytes(format, cols) bytes, any alignment

  const uint8_t* row(int64_t r) const { return data + r * WeightRowBytes(format, cols); }
};

// y = x·Wᵀ on the slice [row_begin, row_end) of W's rows:
//   y[i * y_stride + (r - row_begin)] = Σ_c x[i * x_stride + c] · W[r][c]   for i < m.
// x [m][cols] fp32 (row stride x_stride), y [m][row_end - row_begin] (row stride y_stride).
// Any m >= 1; the weights are read once per few rows of x. Each output is computed the same
// way whatever m and the other rows are, so results do not depend on how rows are batched.
// Single-threaded: callers split the
// rows over threads. Uses a per-thread scratch buffer that grows with m * cols / 32 once.
void MatmulRows(CpuIsa isa, const WeightView& w, const float* x, int m, int64_t x_stride,
                int64_t row_begin, int64_t row_end, float* y, int64_t y_stride);

// The specification of MatmulRows: every weight dequantised exactly (DequantizeRows), products
// summed in double, rounded once to float.
void MatmulRowsRef(const WeightView& w, const float* x, int m, int64_t x_stride, int64_t row_begin,
                   int64_t row_end, float* y, int64_t y_stride);

// Rows [begin, end) of W as fp32 into out [(end - begin)][cols], exactly the format's values.
void DequantizeRows(CpuIsa isa, const WeightView& w, int64_t begin, int64_t end, float* out);

}  // namespace kvstrata::kernels::cpu
