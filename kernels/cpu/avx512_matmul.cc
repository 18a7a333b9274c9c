// MatmulRows and DequantizeRows with AVX-512 (F, BW, VL; compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512vbmi -mfma -mf16c). The weights are read block by block where the file has
// them: per block of 32 elements one 16-byte load of the codes, two conversions to fp32, two
// FMAs per row of x and one FMA to apply the block's scale, which keeps a decode step at the
// speed of memory (docs/benchmarks/cpu.md).

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/simd_avx512.h"

namespace kvstrata::kernels::cpu::avx512 {
namespace {

inline float LoadFp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// One format's blocks of 32 weights as two fp32 vectors (elements 0-15, 16-31), scaled: d·q
// exactly (an fp16 scale times a small integer is exact in fp32), so the vectors hold the
// dequantised weights less Q4_1's block minimum, which goes to *min. Plain formats have
// "blocks" of 32 consecutive elements. 4-bit codes become values with one permute per 16
// (vpermps reads only the low 4 bits of each index) from a 16-entry table scaled by d.
template <WeightFormat F>
struct Blocks;

inline __m512 NibbleTable(float offset) {
  return _mm512_add_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_ps(offset));
}

template <>
struct Blocks<WeightFormat::kQ4_1> {
  static constexpr bool kHasMin = true;
  static constexpr int kBytes = 20;
  static void Load(const uint8_t* b, __m512& lo, __m512& hi, float* min) {
    int32_t dm_bits;
    std::memcpy(&dm_bits, b, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));  // {d, m, 0, 0}
    const __m512 table = _mm512_mul_ps(NibbleTable(0.0f), _mm512_broadcastss_ps(dm));
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 4)));
    lo = _mm512_permutexvar_ps(q, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
    *min = _mm_cvtss_f32(_mm_movehdup_ps(dm));
  }
};

template <>
struct Blocks<WeightFormat::kQ4_0> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 18;
  static void Load(const uint8_t* b, __m512& lo, __m512& hi, float*) {
    const __m512 table = _mm512_mul_ps(NibbleTable(-8.0f), _mm512_set1_ps(LoadFp16(b)));
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    lo = _mm512_permutexvar_ps(q, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  }
};

template <>
struct Blocks<WeightFormat::kQ8_0> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 34;
  static void Load(const uint8_t* b, __m512& lo, __m512& hi, float*) {
    const __m512 d = _mm512_set1_ps(LoadFp16(b));
    const __m128i* q = reinterpret_cast<const __m128i*>(b + 2);
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
  }
};

template <>
struct Blocks<WeightFormat::kF32> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 128;
  static void Load(const uint8_t* b, __m512& lo, __m512& hi, float*) {
    lo = _mm512_loadu_ps(reinterpret_cast<const float*>(b));
    hi = _mm512_loadu_ps(reinterpret_cast<const float*>(b) + 16);
  }
};

template <>
struct Blocks<WeightFormat::kF16> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 64;
  static void Load(const uint8_t* b, __m512& lo, __m512& hi, float*) {
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
  }
};

template <>
struct Blocks<WeightFormat::kBF16> {
  static constexpr bool kHasMin = false;
  static constexpr int kBytes = 64;
  static void Load(const uint8_t* b, __m512& lo, __m512& hi, float*) {
    lo = Bf16x16ToFloat(b);
    hi = Bf16x16ToFloat(b + 32);
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
    uint16_t h;
    std::memcpy(&h, row + 2 * c, 2);
    return Bf16ToFloatScalar(h);
  }
}

// Blocks per row the kernels take (cols up to 32768, more than any model's width).
constexpr int64_t kMaxBlocks = 1024;

// M rows of x (1..4) against rows [r0, r1) of W. xsum [M][nb]: per-block sums of x (Q4_1).
template <WeightFormat F, int M>
void RowsM(const WeightView& w, const float* x, int64_t xs, const float* xsum, int64_t r0,
           int64_t r1, float* y, int64_t ys) {
  using B = Blocks<F>;
  const int64_t nb = w.cols / 32;
  const int64_t row_bytes = WeightRowBytes(F, w.cols);
  // Every block's weights are scaled once (Blocks: the dequantised weights) and then enter
  // four accumulators per row of x (low and
  // high halves of even and odd blocks), enough independent FMA chains at any M. The order is
  // the same for every M, so a row's sum is the same bits whatever rows share the pass.
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * row_bytes;
    __m512 acc[M][4];
    for (int i = 0; i < M; ++i) {
      for (int k = 0; k < 4; ++k) acc[i][k] = _mm512_setzero_ps();
    }
    alignas(64) float mins[kMaxBlocks];  // Q4_1: the row's block minimums, for Σ_b m_b·xsum_b
    const auto block = [&](int64_t b, auto parity) {
      constexpr int a = 2 * decltype(parity)::value;
      const uint8_t* blk = row + b * B::kBytes;
      __m512 lo, hi;
      B::Load(blk, lo, hi, B::kHasMin ? mins + b : nullptr);  // Rows bounds Q4_1's width
      for (int i = 0; i < M; ++i) {
        const float* xi = x + i * xs + 32 * b;
        acc[i][a] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xi), acc[i][a]);
        acc[i][a + 1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xi + 16), acc[i][a + 1]);
      }
    };
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
      block(b, std::integral_constant<int, 0>{});
      block(b + 1, std::integral_constant<int, 1>{});
    }
    if (b < nb) block(b, std::integral_constant<int, 0>{});
    for (int i = 0; i < M; ++i) {
      __m512 s =
          _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3]));
      if constexpr (B::kHasMin) {
        for (int64_t c = 0; c < nb; c += 16) {
          const __mmask16 k = nb - c >= 16 ? __mmask16(0xffff) : __mmask16((1u << (nb - c)) - 1);
          s = _mm512_fmadd_ps(_mm512_maskz_load_ps(k, mins + c),
                              _mm512_maskz_loadu_ps(k, xsum + i * nb + c), s);
        }
      }
      float v = _mm512_reduce_add_ps(s);
      if constexpr (!IsBlockFormatConst(F)) {
        for (int64_t c = nb * 32; c < w.cols; ++c) v += PlainElement<F>(row, c) * x[i * xs + c];
      }
      y[i * ys + (r - r0)] = v;
    }
  }
}

template <WeightFormat F>
void Rows(const WeightView& w, const float* x, int m, int64_t xs, int64_t r0, int64_t r1, float* y,
          int64_t ys) {
  const int64_t nb = w.cols / 32;
  if (Blocks<F>::kHasMin && nb > kMaxBlocks) {  // wider than any model: the portable path
    return portable::MatmulRows(w, x, m, xs, r0, r1, y, ys);
  }
  float* xsum = nullptr;
  if constexpr (Blocks<F>::kHasMin) {
    xsum = ThreadScratch(static_cast<int64_t>(m) * nb);
    for (int i = 0; i < m; ++i) {
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = x + i * xs + 32 * b;
        xsum[i * nb + b] =
            _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)));
      }
    }
  }
  // Rows of x per pass over the weights: 4 (16 accumulators in registers, the x slices in L1);
  // measured faster than 3, 5 or 6 on SmolLM2's shapes at 8 and 512 rows.
  constexpr int per_pass = 4;
  for (int i0 = 0; i0 < m; i0 += per_pass) {
    const float* xi = x + i0 * xs;
    const float* si = xsum == nullptr ? nullptr : xsum + i0 * nb;
    float* yi = y + i0 * ys;
    switch (std::min(m - i0, per_pass)) {
      case 1:
        RowsM<F, 1>(w, xi, xs, si, r0, r1, yi, ys);
        break;
      case 2:
        RowsM<F, 2>(w, xi, xs, si, r0, r1, yi, ys);
        break;
      case 3:
        RowsM<F, 3>(w, xi, xs, si, r0, r1, yi, ys);
        break;
      default:
        RowsM<F, 4>(w, xi, xs, si, r0, r1, yi, ys);
        break;
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
      const uint8_t* blk = row + b * B::kBytes;
      __m512 lo, hi;
      float mn = 0.0f;
      B::Load(blk, lo, hi, &mn);
      // d·q is exact, so only "+ m" rounds, as in the format's definition (and nothing is
      // added without a minimum: + 0 would turn d·0 = -0 into +0).
      if constexpr (B::kHasMin) {
        lo = _mm512_add_ps(lo, _mm512_set1_ps(mn));
        hi = _mm512_add_ps(hi, _mm512_set1_ps(mn));
      }
      _mm512_storeu_ps(o + 32 * b, lo);
      _mm512_storeu_ps(o + 32 * b + 16, hi);
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

}  // namespace kvstrata::kernels::cpu::avx512
