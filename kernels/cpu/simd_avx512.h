#pragma once

// Small AVX-512 helpers shared by the avx512_*.cc kernels (which are compiled with the AVX-512
// flags; nothing else may include this).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvstrata::kernels::cpu::avx512 {

// 16 bf16 values (32 bytes, any alignment) as fp32: exact, a bf16 is the top half of a float.
inline __m512 Bf16x16ToFloat(const void* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

inline float Bf16ToFloatScalar(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The sums of 16 vectors, sum(v[i]) in lane i: a transpose-and-add tree, 45 instructions
// instead of 16 horizontal reductions.
inline __m512 Reduce16(const __m512 v[16]) {
  __m512 s[8];
  for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    s[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 q[4];
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the lane's partial sums of 4 vectors
    const __m512d a = _mm512_castps_pd(s[2 * i]), b = _mm512_castps_pd(s[2 * i + 1]);
    q[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // Fold the four 128-bit lanes: q[j] holds vectors 4j..4j+3.
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(q[2], q[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(q[2], q[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u01, u23, _MM_SHUFFLE(3, 1, 3, 1)));
}

}  // namespace kvstrata::kernels::cpu::avx512
