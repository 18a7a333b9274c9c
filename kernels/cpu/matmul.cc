#include "kernels/cpu/matmul.h"

#include <cstdlib>
#include <memory>
#include <vector>

#include "kernels/cpu/impl.h"

namespace kvstrata::kernels::cpu {

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "F32";
    case WeightFormat::kF16:
      return "F16";
    case WeightFormat::kBF16:
      return "BF16";
    case WeightFormat::kQ8_0:
      return "Q8_0";
    case WeightFormat::kQ4_0:
      return "Q4_0";
    case WeightFormat::kQ4_1:
      return "Q4_1";
  }
  return "unknown";
}

bool IsBlockFormat(WeightFormat format) {
  return format == WeightFormat::kQ8_0 || format == WeightFormat::kQ4_0 ||
         format == WeightFormat::kQ4_1;
}

int64_t WeightRowBytes(WeightFormat format, int64_t cols) {
  switch (format) {
    case WeightFormat::kF32:
      return 4 * cols;
    case WeightFormat::kF16:
    case WeightFormat::kBF16:
      return 2 * cols;
    case WeightFormat::kQ8_0:
      return cols / 32 * 34;
    case WeightFormat::kQ4_0:
      return cols / 32 * 18;
    case WeightFormat::kQ4_1:
      return cols / 32 * 20;
  }
  return 0;
}

float* ThreadScratch(int64_t floats, int which) {
  struct Buffer {
    std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
    int64_t size = 0;
  };
  thread_local Buffer buffers[4];
  Buffer& b = buffers[which];
  if (b.size < floats) {
    const int64_t size = (floats + 15) / 16 * 16;
    b.data.reset(static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(size) * 4)));
    b.size = size;
  }
  return b.data.get();
}

void MatmulRows(CpuIsa isa, const WeightView& w, const float* x, int m, int64_t x_stride,
                int64_t row_begin, int64_t row_end, float* y, int64_t y_stride) {
  if (m <= 0 || row_begin >= row_end) return;
  switch (isa) {
    case CpuIsa::kPortable:
      return portable::MatmulRows(w, x, m, x_stride, row_begin, row_end, y, y_stride);
    case CpuIsa::kAvx2:
#if KVSTRATA_CPU_X86
      return avx2::MatmulRows(w, x, m, x_stride, row_begin, row_end, y, y_stride);
#endif
    case CpuIsa::kAvx512:
#if KVSTRATA_CPU_X86
      return avx512::MatmulRows(w, x, m, x_stride, row_begin, row_end, y, y_stride);
#endif
      break;
  }
  return portable::MatmulRows(w, x, m, x_stride, row_begin, row_end, y, y_stride);
}

void DequantizeRows(CpuIsa isa, const WeightView& w, int64_t begin, int64_t end, float* out) {
  if (begin >= end) return;
  switch (isa) {
    case CpuIsa::kPortable:
      return portable::DequantizeRows(w, begin, end, out);
    case CpuIsa::kAvx2:
#if KVSTRATA_CPU_X86
      return avx2::DequantizeRows(w, begin, end, out);
#endif
    case CpuIsa::kAvx512:
#if KVSTRATA_CPU_X86
      return avx512::DequantizeRows(w, begin, end, out);
#endif
      break;
  }
  return portable::DequantizeRows(w, begin, end, out);
}

void MatmulRowsRef(const WeightView& w, const float* x, int m, int64_t x_stride, int64_t row_begin,
                   int64_t row_end, float* y, int64_t y_stride) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = row_begin; r < row_end; ++r) {
    DequantizeRows(CpuIsa::kPortable, w, r, r + 1, row.data());
    for (int i = 0; i < m; ++i) {
      double s = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) s += double{row[c]} * x[i * x_stride + c];
      y[i * y_stride + (r - row_begin)] = static_cast<float>(s);
    }
  }
}

}  // namespace kvstrata::kernels::cpu
