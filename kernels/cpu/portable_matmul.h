// The portable MatmulRows and DequantizeRows: plain C++ shaped so the compiler vectorises the
// inner loops (eight independent partial sums per dot product). Included, inside the namespace
// of one instruction set, by portable.cc (the build's baseline) and avx2.cc (-mavx2 -mfma
// -mf16c); no include guard on purpose.

namespace {

// A block of 32 weights of format F before its scale (plain formats: 32 consecutive elements of
// the row, `valid` of them present), and the block's scale and minimum.
template <WeightFormat F>
inline void LoadBlock(const uint8_t* row, int64_t b, int valid, float* w, float* d, float* mn) {
  *d = 1.0f;
  *mn = 0.0f;
  if constexpr (F == WeightFormat::kQ4_1) {
    const uint8_t* p = row + b * 20;
    *d = Fp16ToFloat(LoadU16(p));
    *mn = Fp16ToFloat(LoadU16(p + 2));
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<float>(p[4 + j] & 15);
      w[j + 16] = static_cast<float>(p[4 + j] >> 4);
    }
  } else if constexpr (F == WeightFormat::kQ4_0) {
    const uint8_t* p = row + b * 18;
    *d = Fp16ToFloat(LoadU16(p));
    for (int j = 0; j < 16; ++j) {
      w[j] = static_cast<float>((p[2 + j] & 15) - 8);
      w[j + 16] = static_cast<float>((p[2 + j] >> 4) - 8);
    }
  } else if constexpr (F == WeightFormat::kQ8_0) {
    const uint8_t* p = row + b * 34;
    *d = Fp16ToFloat(LoadU16(p));
    for (int j = 0; j < 32; ++j) w[j] = static_cast<float>(static_cast<int8_t>(p[2 + j]));
  } else if constexpr (F == WeightFormat::kF32) {
    std::memcpy(w, row + b * 128, static_cast<size_t>(valid) * 4);
  } else if constexpr (F == WeightFormat::kF16) {
    for (int j = 0; j < valid; ++j) w[j] = Fp16ToFloat(LoadU16(row + b * 64 + 2 * j));
  } else {
    for (int j = 0; j < valid; ++j) w[j] = Bf16ToFloat(LoadU16(row + b * 64 + 2 * j));
  }
  for (int j = valid; j < 32; ++j) w[j] = 0.0f;
}

constexpr bool IsBlock(WeightFormat f) {
  return f == WeightFormat::kQ8_0 || f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1;
}

// Σ w[j] x[j] over 32 elements (x may hold fewer valid ones; w is 0 there, x is read only for
// `valid` elements).
inline float Dot32(const float* w, const float* x, int valid) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (valid == 32) {
    for (int j = 0; j < 32; j += 8) {
      for (int k = 0; k < 8; ++k) part[k] += w[j + k] * x[j + k];
    }
  } else {
    for (int j = 0; j < valid; ++j) part[j % 8] += w[j] * x[j];
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

template <WeightFormat F>
void Rows(const WeightView& w, const float* x, int m, int64_t xs, int64_t r0, int64_t r1, float* y,
          int64_t ys) {
  const int64_t nb = (w.cols + 31) / 32;
  const int64_t row_bytes = WeightRowBytes(F, w.cols);
  float* xsum = nullptr;  // per-block sums of x, for Q4_1's minimum
  if constexpr (F == WeightFormat::kQ4_1) {
    xsum = ThreadScratch(static_cast<int64_t>(m) * nb);
    for (int i = 0; i < m; ++i) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + i * xs + 32 * b;
        float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < 32; j += 8) {
          for (int k = 0; k < 8; ++k) part[k] += xb[j + k];
        }
        xsum[i * nb + b] = ((part[0] + part[1]) + (part[2] + part[3])) +
                           ((part[4] + part[5]) + (part[6] + part[7]));
      }
    }
  }
  for (int i0 = 0; i0 < m; i0 += kMatmulRowsPerPass) {
    const int mm = std::min(m - i0, kMatmulRowsPerPass);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = w.data + r * row_bytes;
      float acc[kMatmulRowsPerPass] = {};
      alignas(64) float wb[32];
      for (int64_t b = 0; b < nb; ++b) {
        const int valid = static_cast<int>(std::min<int64_t>(32, w.cols - 32 * b));
        float d, mn;
        LoadBlock<F>(row, b, valid, wb, &d, &mn);
        for (int i = 0; i < mm; ++i) {
          const float* xi = x + (i0 + i) * xs + 32 * b;
          const float dot = Dot32(wb, xi, valid);
          if constexpr (F == WeightFormat::kQ4_1) {
            acc[i] += d * dot + mn * xsum[(i0 + i) * nb + b];
          } else if constexpr (IsBlock(F)) {
            acc[i] += d * dot;
          } else {
            acc[i] += dot;
          }
        }
      }
      for (int i = 0; i < mm; ++i) y[(i0 + i) * ys + (r - r0)] = acc[i];
    }
  }
}

template <WeightFormat F>
void Dequantize(const WeightView& w, int64_t begin, int64_t end, float* out) {
  const int64_t nb = (w.cols + 31) / 32;
  const int64_t row_bytes = WeightRowBytes(F, w.cols);
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* row = w.data + r * row_bytes;
    float* o = out + (r - begin) * w.cols;
    alignas(64) float wb[32];
    for (int64_t b = 0; b < nb; ++b) {
      const int valid = static_cast<int>(std::min<int64_t>(32, w.cols - 32 * b));
      float d, mn;
      LoadBlock<F>(row, b, valid, wb, &d, &mn);
      // d * q is exact (an fp16 scale times a small integer), so only "+ m" rounds, as in the
      // format's definition.
      // (No "+ 0" for the formats without a minimum: it would turn d * 0 = -0 into +0.)
      for (int j = 0; j < valid; ++j) {
        o[32 * b + j] = F == WeightFormat::kQ4_1 ? d * wb[j] + mn : IsBlock(F) ? d * wb[j] : wb[j];
      }
    }
  }
}

}  // namespace

void MatmulRows(const WeightView& w, const float* x, int m, int64_t x_stride, int64_t row_begin,
                int64_t row_end, float* y, int64_t y_stride) {
  switch (w.format) {
    case WeightFormat::kF32:
      return Rows<WeightFormat::kF32>(w, x, m, x_stride, row_begin, row_end, y, y_stride);
    case WeightFormat::kF16:
      return Rows<WeightFormat::kF16>(w, x, m, x_stride, row_begin, row_end, y, y_stride);
    case WeightFormat::kBF16:
      return Rows<WeightFormat::kBF16>(w, x, m, x_stride, row_begin, row_end, y, y_stride);
    case WeightFormat::kQ8_0:
      return Rows<WeightFormat::kQ8_0>(w, x, m, x_stride, row_begin, row_end, y, y_stride);
    case WeightFormat::kQ4_0:
      return Rows<WeightFormat::kQ4_0>(w, x, m, x_stride, row_begin, row_end, y, y_stride);
    case WeightFormat::kQ4_1:
      return Rows<WeightFormat::kQ4_1>(w, x, m, x_stride, row_begin, row_end, y, y_stride);
  }
}

void DequantizeRows(const WeightView& w, int64_t begin, int64_t end, float* out) {
  switch (w.format) {
    case WeightFormat::kF32:
      return Dequantize<WeightFormat::kF32>(w, begin, end, out);
    case WeightFormat::kF16:
      return Dequantize<WeightFormat::kF16>(w, begin, end, out);
    case WeightFormat::kBF16:
      return Dequantize<WeightFormat::kBF16>(w, begin, end, out);
    case WeightFormat::kQ8_0:
      return Dequantize<WeightFormat::kQ8_0>(w, begin, end, out);
    case WeightFormat::kQ4_0:
      return Dequantize<WeightFormat::kQ4_0>(w, begin, end, out);
    case WeightFormat::kQ4_1:
      return Dequantize<WeightFormat::kQ4_1>(w, begin, end, out);
  }
}
