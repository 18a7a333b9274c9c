// DecodeCodecBlockAvx512 (compiled with AVX-512 F/BW/VL/VBMI).

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/codec_decode.h"

namespace kvstrata::kernels::cpu {

void DecodeCodecBlockAvx512(const uint8_t* block, const CodecBlockLayout& l, int num_tokens,
                            int head_dim, const SideRecipe& r, float* rows) {
  int c0 = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    const CodecRegion& reg = r.regions[k];
    if (reg.bits == 0) {
      for (int t = 0; t < num_tokens; ++t) {
        std::fill_n(rows + int64_t{t} * head_dim + c0, reg.channels, 0.0f);
      }
      c0 += reg.channels;
      continue;
    }
    const int b = reg.bits;
    const __m512 levels = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << (1 << b)) - 1),
                                                GaussianLloydMaxCentroids(b));
    // Lane i of 16 takes bits [i·b, (i+1)·b) of a 64-bit word: shifts for lanes 0-7 and 8-15.
    const __m512i shift_lo = _mm512_setr_epi64(0, b, 2 * b, 3 * b, 4 * b, 5 * b, 6 * b, 7 * b);
    const __m512i shift_hi = _mm512_add_epi64(shift_lo, _mm512_set1_epi64(8 * b));
    const __m512i mask = _mm512_set1_epi32((1 << b) - 1);
    const uint8_t ratio = block[l.ratios + k];
    for (int t = 0; t < num_tokens; ++t) {
      const uint8_t* in = block + l.region_codes[k] + t * l.region_row_bytes[k];
      const float s = CodecRegionScale(block[l.row_scales + t], ratio);
      const __m512 scale = _mm512_set1_ps(s);
      float* y = rows + int64_t{t} * head_dim + c0;
      for (int i = 0; i < reg.channels; i += 16) {
        // 16 codes fill 2·b bytes; 8 are read, which stay inside the block: the row scales
        // follow every region's codes.
        uint64_t word;
        std::memcpy(&word, in + 2 * (i / 16) * b, sizeof(word));
        const __m512i w = _mm512_set1_epi64(static_cast<long long>(word));
        const __m256i lo = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(w, shift_lo));
        const __m256i hi = _mm512_cvtepi64_epi32(_mm512_srlv_epi64(w, shift_hi));
        const __m512i codes =
            _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), mask);
        const __m512 v = _mm512_mul_ps(scale, _mm512_permutexvar_ps(codes, levels));
        const int n = std::min(16, reg.channels - i);
        _mm512_mask_storeu_ps(y + i, static_cast<__mmask16>((1u << n) - 1), v);
      }
    }
    c0 += reg.channels;
  }
}

}  // namespace kvstrata::kernels::cpu
