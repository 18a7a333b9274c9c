// MatmulRows and DequantizeRows with AVX2, FMA and F16C (x86-64-v3: most laptops), the same
// algorithm as avx512_matmul.cc at 8 lanes: each block of 32 weights is decoded into four
// vectors holding its exact dequantised values (d·q; Q4_1's minimum goes through Σ m·Σx), which
// then enter four accumulators per row of x. Decode steps (up to three rows of x) decode each
// block in registers, two rows of x per pass (16 registers); prefill chunks decode a tile of W's
// rows to fp32 once and pass three rows of x at a time over it. Both sum a row's products in
// the same order, so a row's result does not depend on the batch.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/impl.h"

namespace kvstrata::kernels::cpu::avx2 {
namespace {

inline float LoadFp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

inline __m256 U8x8ToFloat(__m128i bytes) {  // the low 8 bytes
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

inline __m256 I8x8ToFloat(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

inline __m256 Bf16x8ToFloat(const uint8_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

inline float Sum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// A block of 32 weights as four vectors of 8, scaled (the dequantised weights, less Q4_1's
// minimum, which goes to *min); plain formats have "blocks" of 32 consecutive elements.
template <WeightFormat F>
struct Blocks;

template <>
struct Blocks<WeightFormat::kQ4_1> {
  static constexpr bool kHasMin = true;
  static constexpr int kBytes = 20;
  static void Load(const uint8_t* b, __m256 (&w)[4], float* min) {
    int32_t dm_bits;
    std::memcpy(&dm_bits, b, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // {d, m, 0, 0}
    const __m256 d = _mm256_broadcastss_ps(dm);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4));
    const __m128i mask = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    w[0] = _mm256_mul_ps(U8x8ToFloat(lo), d);
    w[1] = _mm256_mul_ps(U8x8ToFloat(_mm_srli_si128(lo, 8)), d);
    w[2] = _mm256_mul_ps(U8x8ToFloat(hi), d);
    w[3] = _mm256_mul_ps(U8x8ToFloat(_mm_srli_si128(hi, 8)), d);
    *min = _mm_cvtss_f32(_mm_movehdup_ps(dm));
  }
};

template <>
struct Blocks<WeightFormat::kQ4_0> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 18;
  static void Load(const uint8_t* b, __m256 (&w)[4], float*) {
    const __m256 d = _mm256_set1_ps(LoadFp16(b));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m128i mask = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
    // q - 8 in -8..7 as signed bytes.
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, mask), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), mask), eight);
    w[0] = _mm256_mul_ps(I8x8ToFloat(lo), d);
    w[1] = _mm256_mul_ps(I8x8ToFloat(_mm_srli_si128(lo, 8)), d);
    w[2] = _mm256_mul_ps(I8x8ToFloat(hi), d);
    w[3] = _mm256_mul_ps(I8x8ToFloat(_mm_srli_si128(hi, 8)), d);
  }
};

template <>
struct Blocks<WeightFormat::kQ8_0> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 34;
  static void Load(const uint8_t* b, __m256 (&w)[4], float*) {
    const __m256 d = _mm256_set1_ps(LoadFp16(b));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
    w[0] = _mm256_mul_ps(I8x8ToFloat(q0), d);
    w[1] = _mm256_mul_ps(I8x8ToFloat(_mm_srli_si128(q0, 8)), d);
    w[2] = _mm256_mul_ps(I8x8ToFloat(q1), d);
    w[3] = _mm256_mul_ps(I8x8ToFloat(_mm_srli_si128(q1, 8)), d);
  }
};

template <>
struct Blocks<WeightFormat::kF32> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 128;
  static void Load(const uint8_t* b, __m256 (&w)[4], float*) {
    for (int k = 0; k < 4; ++k) w[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(b) + 8 * k);
  }
};

template <>
struct Blocks<WeightFormat::kF16> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 64;
  static void Load(const uint8_t* b, __m256 (&w)[4], float*) {
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * k)));
    }
  }
};

template <>
struct Blocks<WeightFormat::kBF16> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 64;
  static void Load(const uint8_t* b, __m256 (&w)[4], float*) {
    for (int k = 0; k < 4; ++k) w[k] = Bf16x8ToFloat(b + 16 * k);
  }
};

constexpr bool IsBlockFormatConst(WeightFormat f) {
  return f == WeightFormat::kQ8_0 || f == WeightFormat::kQ4_0 || f == WeightFormat::kQ4_1;
}

// Element c of a row of a plain format (the columns past the last full 32).
template <WeightFormat F>
float PlainElement(const uint8_t* row, int64_t c) {
  if constexpr (F == WeightFormat::kF32) {
    float w;
    std::memcpy(&w, row + 4 * c, 4);
    return w;
  } else if constexpr (F == WeightFormat::kF16) {
    return LoadFp16(row + 2 * c);
  } else {
    uint32_t u = 0;
    std::memcpy(reinterpret_cast<uint8_t*>(&u) + 2, row + 2 * c, 2);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

constexpr int64_t kMaxBlocks = 1024;  // cols up to 32768

// A row of x against a row of W from its four accumulators (one per quarter of a block, summed
// block after block): the one place a sum is finished, so every path gives a row the same bits.
// `mins` and `xsum` are the row's block minimums and x's block sums (Q4_1); `row` and `x` give
// a plain format's columns past the last full 32.
template <WeightFormat F>
float FinishRow(const __m256 (&acc)[4], const float* mins, const float* xsum, int64_t nb,
                const uint8_t* row, const float* x, int64_t cols) {
  using B = Blocks<F>;
  __m256 s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  if constexpr (B::kHasMin) {
    int64_t c = 0;
    for (; c + 8 <= nb; c += 8) {
      s = _mm256_fmadd_ps(_mm256_loadu_ps(mins + c), _mm256_loadu_ps(xsum + c), s);
    }
    float tail = 0.0f;
    for (; c < nb; ++c) tail += mins[c] * xsum[c];
    s = _mm256_add_ps(s, _mm256_setr_ps(tail, 0, 0, 0, 0, 0, 0, 0));
  }
  float v = Sum8(s);
  if constexpr (!IsBlockFormatConst(F)) {
    for (int64_t c = nb * 32; c < cols; ++c) v += PlainElement<F>(row, c) * x[c];
  }
  return v;
}

// M rows of x (1..2) against rows [r0, r1) of W, decoding each block of W in registers: for
// decode steps, where each weight is used once or twice. Four accumulators per row of x, the
// same whatever M, so a row's sum does not depend on the rows beside it.
template <WeightFormat F, int M>
void RowsM(const WeightView& w, const float* x, int64_t xs, const float* xsum, int64_t r0,
           int64_t r1, float* y, int64_t ys) {
  using B = Blocks<F>;
  const int64_t nb = w.cols / 32;
  const int64_t row_bytes = WeightRowBytes(F, w.cols);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * row_bytes;
    __m256 acc[M][4];
    for (int i = 0; i < M; ++i) {
      for (int k = 0; k < 4; ++k) acc[i][k] = _mm256_setzero_ps();
    }
    alignas(32) float mins[kMaxBlocks];
    for (int64_t b = 0; b < nb; ++b) {
      __m256 wv[4];
      // Only Q4_1 has minimums (and a row of it at most kMaxBlocks blocks: Rows checks).
      B::Load(row + b * B::kBytes, wv, B::kHasMin ? mins + b : nullptr);
      for (int i = 0; i < M; ++i) {
        const float* xi = x + i * xs + 32 * b;
        for (int k = 0; k < 4; ++k) {
          acc[i][k] = _mm256_fmadd_ps(wv[k], _mm256_loadu_ps(xi + 8 * k), acc[i][k]);
        }
      }
    }
    for (int i = 0; i < M; ++i) {
      y[i * ys + (r - r0)] =
          FinishRow<F>(acc[i], mins, xsum == nullptr ? nullptr : xsum + i * nb, nb, row,
                       x + i * xs, w.cols);
    }
  }
}

// M rows of x (1..3) against one row of W already decoded to fp32 (`wrow`, the blocks' values
// less Q4_1's minimums, which are in `mins`): the same products in the same order as RowsM.
template <WeightFormat F, int M>
void DecodedRowM(const float* wrow, const float* mins, const uint8_t* row, int64_t cols,
                 const float* x, int64_t xs, const float* xsum, float* y, int64_t ys) {
  const int64_t nb = cols / 32;
  __m256 acc[M][4];
  for (int i = 0; i < M; ++i) {
    for (int k = 0; k < 4; ++k) acc[i][k] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    for (int k = 0; k < 4; ++k) {
      const __m256 wv = _mm256_load_ps(wrow + 32 * b + 8 * k);
      for (int i = 0; i < M; ++i) {
        acc[i][k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i * xs + 32 * b + 8 * k), acc[i][k]);
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    y[i * ys] = FinishRow<F>(acc[i], mins, xsum == nullptr ? nullptr : xsum + i * nb, nb, row,
                             x + i * xs, cols);
  }
}

// m rows of x against rows [r0, r1) of W for prefill, where each weight meets many tokens: a
// tile of W's rows is decoded once to fp32 in `scratch` (at most kTileFloats), then every three
// rows of x (whose 3·cols floats stay in L1) pass over the tile's rows in turn. Decoding in
// registers for every pair of tokens, as RowsM does, spent most of a prefill decoding.
constexpr int64_t kTileFloats = 64 * 1024;  // 256 KiB: the tile stays in a core's L2

template <WeightFormat F>
void RowsTiled(const WeightView& w, const float* x, int m, int64_t xs, const float* xsum,
               int64_t r0, int64_t r1, float* y, int64_t ys, float* scratch) {
  using B = Blocks<F>;
  const int64_t nb = w.cols / 32;
  const int64_t stride = nb * 32;  // a decoded row: whole blocks only (a tail reads the bytes)
  const int64_t row_bytes = WeightRowBytes(F, w.cols);
  const int64_t tile_rows = std::clamp<int64_t>(kTileFloats / (stride + nb), 1, r1 - r0);
  // (A row wider than the tile budget gets a tile of its own: Rows sizes `scratch` for it.)
  float* wtile = scratch;
  float* mins = scratch + tile_rows * stride;
  for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const int64_t t1 = std::min(r1, t0 + tile_rows);
    for (int64_t r = t0; r < t1; ++r) {
      const uint8_t* row = w.data + r * row_bytes;
      float* out = wtile + (r - t0) * stride;
      for (int64_t b = 0; b < nb; ++b) {
        __m256 wv[4];
        float mn = 0.0f;
        B::Load(row + b * B::kBytes, wv, &mn);
        for (int k = 0; k < 4; ++k) _mm256_store_ps(out + 32 * b + 8 * k, wv[k]);
        mins[(r - t0) * nb + b] = mn;
      }
    }
    for (int i0 = 0; i0 < m; i0 += 3) {
      const float* xi = x + i0 * xs;
      const float* si = xsum == nullptr ? nullptr : xsum + i0 * nb;
      for (int64_t r = t0; r < t1; ++r) {
        const float* wrow = wtile + (r - t0) * stride;
        const float* mr = mins + (r - t0) * nb;
        const uint8_t* row = w.data + r * row_bytes;
        float* yr = y + i0 * ys + (r - r0);
        switch (std::min(3, m - i0)) {
          case 3:
            DecodedRowM<F, 3>(wrow, mr, row, w.cols, xi, xs, si, yr, ys);
            break;
          case 2:
            DecodedRowM<F, 2>(wrow, mr, row, w.cols, xi, xs, si, yr, ys);
            break;
          default:
            DecodedRowM<F, 1>(wrow, mr, row, w.cols, xi, xs, si, yr, ys);
        }
      }
    }
  }
}

// From this many rows of x on, a tile of W is decoded once (at 8 rows the default model's
// products took 0.73-0.87x the time of decoding in registers, at 512 rows 0.50-0.63x:
// kvstrata_bench_cpu_kernels, docs/benchmarks/cpu.md); up to three rows (decode) stay in registers.
constexpr int kTiledFromRows = 4;

template <WeightFormat F>
void Rows(const WeightView& w, const float* x, int m, int64_t xs, int64_t r0, int64_t r1, float* y,
          int64_t ys) {
  const int64_t nb = w.cols / 32;
  if (Blocks<F>::kHasMin && nb > kMaxBlocks) {  // wider than any model: the portable path
    return portable::MatmulRows(w, x, m, xs, r0, r1, y, ys);
  }
  // Kernel scratch: x's block sums (Q4_1), then for a tiled pass the decoded tile and its
  // minimums (32-byte aligned).
  const int64_t xsum_floats = Blocks<F>::kHasMin ? (static_cast<int64_t>(m) * nb + 7) / 8 * 8 : 0;
  const bool tiled = m >= kTiledFromRows && nb > 0;
  const int64_t tile_floats = tiled ? std::max(kTileFloats, nb * 33) + 8 : 0;
  float* scratch = ThreadScratch(xsum_floats + tile_floats);
  float* xsum = nullptr;
  if constexpr (Blocks<F>::kHasMin) {
    xsum = scratch;
    for (int i = 0; i < m; ++i) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + i * xs + 32 * b;
        const __m256 s =
            _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xb), _mm256_loadu_ps(xb + 8)),
                          _mm256_add_ps(_mm256_loadu_ps(xb + 16), _mm256_loadu_ps(xb + 24)));
        xsum[i * nb + b] = Sum8(s);
      }
    }
  }
  if (tiled) return RowsTiled<F>(w, x, m, xs, xsum, r0, r1, y, ys, scratch + xsum_floats);
  for (int i0 = 0; i0 < m; i0 += 2) {
    const float* si = xsum == nullptr ? nullptr : xsum + i0 * nb;
    if (m - i0 >= 2) {
      RowsM<F, 2>(w, x + i0 * xs, xs, si, r0, r1, y + i0 * ys, ys);
    } else {
      RowsM<F, 1>(w, x + i0 * xs, xs, si, r0, r1, y + i0 * ys, ys);
    }
  }
}

template <WeightFormat F>
void Dequantize(const WeightView& w, int64_t begin, int64_t end, float* out) {
  using B = Blocks<F>;
  const int64_t nb = w.cols / 32;
  const int64_t row_bytes = WeightRowBytes(F, w.cols);
  for (int64_t r = begin; r < end; ++r) {
    const uint8_t* row = w.data + r * row_bytes;
    float* o = out + (r - begin) * w.cols;
    for (int64_t b = 0; b < nb; ++b) {
      __m256 wv[4];
      float mn = 0.0f;
      B::Load(row + b * B::kBytes, wv, &mn);
      // d·q is exact, so only "+ m" rounds, as in the format's definition (and nothing is
      // added without a minimum: + 0 would turn d·0 = -0 into +0).
      for (int k = 0; k < 4; ++k) {
        if constexpr (B::kHasMin) wv[k] = _mm256_add_ps(wv[k], _mm256_set1_ps(mn));
        _mm256_storeu_ps(o + 32 * b + 8 * k, wv[k]);
      }
    }
    if constexpr (!IsBlockFormatConst(F)) {
      for (int64_t c = nb * 32; c < w.cols; ++c) o[c] = PlainElement<F>(row, c);
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

}  // namespace kvstrata::kernels::cpu::avx2
