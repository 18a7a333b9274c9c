// AttendBlock with AVX-512 (F, BW, VL, VBMI; compiled with those flags).
//
// BF16 (and fp32) blocks: scores with channels in lanes (one FMA per 16 channels and row) and a
// transpose-and-add of 16 tokens at a time; values with channels in lanes.
// INT2 blocks, from the codes:
//  * scores with tokens in lanes: the K codes of 16 tokens are gathered a word at a time, each
//    2-bit field becomes its level with one shift and one permute (a 16-entry table L[i & 3]),
//    and s = Σ_groups scale·(Σ_c q_c L) + offset·(Σ_c q_c) per token;
//  * values with tokens in lanes too: a vector of 16 code words holds, for each (u, e), one
//    channel's codes for 16 tokens (int2_tables.h), so Σ_t p_t·scale_t·L is accumulated as 16
//    partial sums per channel (the state's lanes) and Σ_t p_t·offset_t per channel group; the
//    lanes are added up once, in FinishAttentionState.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/cpu/impl.h"
#include "kernels/cpu/int2_tables.h"
#include "kernels/cpu/simd_avx512.h"

namespace kvstrata::kernels::cpu::avx512 {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kRowChunk = 16;  // rows whose scores one pass keeps

// exp(x), Cephes' single-precision polynomial: x = n·ln2 + r, |r| <= ln2/2. 0 for x < -87.34
// (and -inf), x is capped at 88.
inline __m512 Exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654475f);
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_mask_mov_ps(_mm512_scalef_ps(p, n), underflow, _mm512_setzero_ps());
}

inline float ExpScalar(float x) { return _mm512_cvtss_f32(Exp16(_mm512_set1_ps(x))); }

// The 16-entry table whose entry i is the level of code i & 3, for permutes of unmasked fields.
inline __m512 LevelTable(BlockFormat f) {
  const Int2Levels lv = LevelsFor(f == BlockFormat::kInt2LloydMax ? PageEncoding::kInt2LloydMax
                                                                  : PageEncoding::kInt2Uniform);
  return _mm512_setr_ps(lv.v[0], lv.v[1], lv.v[2], lv.v[3], lv.v[0], lv.v[1], lv.v[2], lv.v[3],
                        lv.v[0], lv.v[1], lv.v[2], lv.v[3], lv.v[0], lv.v[1], lv.v[2], lv.v[3]);
}

inline __mmask16 FirstLanes(int n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// 16 elements of a BF16 or fp32 row as fp32.
template <typename E>
inline __m512 Load16(const E* p) {
  if constexpr (sizeof(E) == 2) {
    return Bf16x16ToFloat(p);
  } else {
    return _mm512_loadu_ps(p);
  }
}

// ---- BF16 / fp32 blocks ------------------------------------------------------------------

template <int D, typename E>
void ScoresPlain(const uint8_t* block, int ntok, const float* q, int nr, float scale,
                 float (*s)[64]) {
  constexpr int J = D / 16;
  const E* k = reinterpret_cast<const E*>(block);
  for (int t0 = 0; t0 < ntok; t0 += 16) {
    const int nt = std::min(16, ntok - t0);
    alignas(64) __m512 part[kRowChunk][16];
    for (int t = 0; t < 16; ++t) {
      __m512 kc[J];
      for (int j = 0; j < J; ++j) {
        kc[j] = t < nt ? Load16(k + int64_t{t0 + t} * D + 16 * j) : _mm512_setzero_ps();
      }
      for (int r = 0; r < nr; ++r) {
        const float* qr = q + r * D;
        __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(qr), kc[0]);
        for (int j = 1; j < J; ++j) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * j), kc[j], acc);
        part[r][t] = acc;
      }
    }
    for (int r = 0; r < nr; ++r) {
      _mm512_store_ps(s[r] + t0, _mm512_mul_ps(Reduce16(part[r]), _mm512_set1_ps(scale)));
    }
  }
}

template <int D, int RR, typename E>
void ValuesPlainRows(const E* v, int ntok, const float (*p)[64], float* acc) {
  constexpr int J = D / 16;
  __m512 a[RR][J];
  for (int r = 0; r < RR; ++r) {
    for (int j = 0; j < J; ++j) a[r][j] = _mm512_loadu_ps(acc + r * D + 16 * j);
  }
  for (int t = 0; t < ntok; ++t) {
    __m512 vc[J];
    for (int j = 0; j < J; ++j) vc[j] = Load16(v + int64_t{t} * D + 16 * j);
    for (int r = 0; r < RR; ++r) {
      const __m512 pb = _mm512_set1_ps(p[r][t]);
      for (int j = 0; j < J; ++j) a[r][j] = _mm512_fmadd_ps(pb, vc[j], a[r][j]);
    }
  }
  for (int r = 0; r < RR; ++r) {
    for (int j = 0; j < J; ++j) _mm512_storeu_ps(acc + r * D + 16 * j, a[r][j]);
  }
}

template <int D, typename E>
void ValuesPlain(const uint8_t* block, int ntok, const float (*p)[64], int nr, float* acc) {
  constexpr int RV = 24 / (D / 16);  // rows whose sums stay in registers: 6, or 3 at D = 128
  const E* v = reinterpret_cast<const E*>(block);
  for (int r = 0; r < nr;) {
    const int take = std::min(RV, nr - r);
    switch (take) {
      case 1:
        ValuesPlainRows<D, 1>(v, ntok, p + r, acc + r * D);
        break;
      case 2:
        ValuesPlainRows<D, 2>(v, ntok, p + r, acc + r * D);
        break;
      case 3:
        ValuesPlainRows<D, 3>(v, ntok, p + r, acc + r * D);
        break;
      case 4:
        if constexpr (RV >= 4) ValuesPlainRows<D, 4>(v, ntok, p + r, acc + r * D);
        break;
      case 5:
        if constexpr (RV >= 5) ValuesPlainRows<D, 5>(v, ntok, p + r, acc + r * D);
        break;
      default:
        if constexpr (RV >= 6) ValuesPlainRows<D, 6>(v, ntok, p + r, acc + r * D);
        break;
    }
    r += take;
  }
}

// ---- INT2 blocks -------------------------------------------------------------------------

// Independent FMA chains per row and channel group in the INT2 scores: 16 accumulators in all
// for the 4 rows a pass takes (fewer rows at 8 groups).
constexpr int ScoreChains(int ng) { return ng >= 4 ? 1 : 4 / ng; }
constexpr int ScoreRows(int ng) { return ng >= 8 ? 2 : 4; }

// K: tokens in lanes. RK rows at a time, NG channel groups.
template <int D, int NG, int RK>
__attribute__((always_inline)) inline void ScoresInt2Rows(
    const __m512i (&z)[D / 16], const __m512 table, const __m512 (&sc)[NG], const __m512 (&off)[NG],
    const float* q, const float (*qsum)[NG], float scale, float* const* out) {
  constexpr int G = D / NG;
  constexpr int C = ScoreChains(NG);
  // C independent sums per row and group (word w goes to chain w % C), so the FMAs of one row
  // do not wait on each other; the same chains whatever RK, so a row's score does not depend
  // on the rows beside it.
  __m512 acc[RK][NG][C];
  for (int r = 0; r < RK; ++r) {
    for (int g = 0; g < NG; ++g) {
      for (int k = 0; k < C; ++k) acc[r][g][k] = _mm512_setzero_ps();
    }
  }
  // Every (word, position) with its channel and group known at compile time, so the sums stay
  // in registers.
  [&]<int... I>(std::integer_sequence<int, I...>) __attribute__((always_inline)) {
    (
        [&]() __attribute__((always_inline)) {
          constexpr int w = I / 16, pos = I % 16;
          constexpr int c = KChannel(D, w, pos);
          constexpr int grp = c / G;
          constexpr int k = w % C;
          const __m512 lv = _mm512_permutexvar_ps(_mm512_srli_epi32(z[w], 2 * pos), table);
          for (int r = 0; r < RK; ++r) {
            acc[r][grp][k] = _mm512_fmadd_ps(lv, _mm512_set1_ps(q[r * D + c]), acc[r][grp][k]);
          }
        }(),
        ...);
  }
  (std::make_integer_sequence<int, D>{});
  for (int r = 0; r < RK; ++r) {
    __m512 sum[NG];
    for (int g = 0; g < NG; ++g) {
      sum[g] = acc[r][g][0];
      for (int k = 1; k < C; ++k) sum[g] = _mm512_add_ps(sum[g], acc[r][g][k]);
    }
    __m512 s = _mm512_mul_ps(off[0], _mm512_set1_ps(qsum[r][0]));
    s = _mm512_fmadd_ps(sc[0], sum[0], s);
    for (int g = 1; g < NG; ++g) {
      s = _mm512_fmadd_ps(off[g], _mm512_set1_ps(qsum[r][g]), s);
      s = _mm512_fmadd_ps(sc[g], sum[g], s);
    }
    _mm512_store_ps(out[r], _mm512_mul_ps(s, _mm512_set1_ps(scale)));
  }
}

template <int D, int NG>
void ScoresInt2(const uint8_t* block, BlockFormat f, int ntok, const float* q, int nr, float scale,
                float (*s)[64]) {
  constexpr int W = D / 16;  // code words per token
  constexpr int G = D / NG;
  constexpr int RK = ScoreRows(NG);
  const uint8_t* codes = block;
  const uint8_t* params = block + 64 * (D / 4);  // [64][NG] {scale, offset} fp16
  const __m512 table = LevelTable(f);
  float qsum[kRowChunk][NG];
  for (int r = 0; r < nr; ++r) {
    for (int g = 0; g < NG; ++g) {
      float sum = 0.0f;
      for (int c = g * G; c < (g + 1) * G; ++c) sum += q[r * D + c];
      qsum[r][g] = sum;
    }
  }
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int t0 = 0; t0 < ntok; t0 += 16) {
    const __mmask16 valid = FirstLanes(ntok - t0);
    const __m512i tok = _mm512_add_epi32(lane, _mm512_set1_epi32(t0));
    __m512i z[W];
    const __m512i base = _mm512_mullo_epi32(tok, _mm512_set1_epi32(W));
    for (int w = 0; w < W; ++w) {
      z[w] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid,
                                         _mm512_add_epi32(base, _mm512_set1_epi32(w)), codes, 4);
    }
    __m512 sc[NG], off[NG];
    const __m512i pbase = _mm512_mullo_epi32(tok, _mm512_set1_epi32(NG));
    for (int g = 0; g < NG; ++g) {
      const __m512i pz = _mm512_mask_i32gather_epi32(
          _mm512_setzero_si512(), valid, _mm512_add_epi32(pbase, _mm512_set1_epi32(g)), params, 4);
      sc[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pz));
      off[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pz, 16)));
    }
    for (int r = 0; r < nr;) {
      const int take = std::min(RK, nr - r);
      float* out[RK];
      for (int i = 0; i < take; ++i) out[i] = s[r + i] + t0;
      const float* qr = q + r * D;
      const float(*qs)[NG] = qsum + r;
      // All the rows of the chunk in one pass over the codes.
      switch (take) {
        case 1:
          ScoresInt2Rows<D, NG, 1>(z, table, sc, off, qr, qs, scale, out);
          break;
        case 2:
          ScoresInt2Rows<D, NG, 2>(z, table, sc, off, qr, qs, scale, out);
          break;
        case 3:
          ScoresInt2Rows<D, NG, 3>(z, table, sc, off, qr, qs, scale, out);
          break;
        case 4:
          if constexpr (RK >= 4) ScoresInt2Rows<D, NG, 4>(z, table, sc, off, qr, qs, scale, out);
          break;
        case 5:
          if constexpr (RK >= 5) ScoresInt2Rows<D, NG, 5>(z, table, sc, off, qr, qs, scale, out);
          break;
        case 6:
          if constexpr (RK >= 6) ScoresInt2Rows<D, NG, 6>(z, table, sc, off, qr, qs, scale, out);
          break;
        case 7:
          if constexpr (RK >= 7) ScoresInt2Rows<D, NG, 7>(z, table, sc, off, qr, qs, scale, out);
          break;
        default:
          if constexpr (RK >= 8) ScoresInt2Rows<D, NG, 8>(z, table, sc, off, qr, qs, scale, out);
          break;
      }
      r += take;
    }
  }
}

// V: the lanes of row r are [64][16] partial sums per (z % 8, u) code slot (int2_tables.h),
// then [NG][16] offset sums.
template <int D, int NG>
void ValuesInt2(const uint8_t* block, BlockFormat f, int ntok, const float (*p)[64], int nr,
                const AttentionState& st) {
  constexpr int NSET = D / 32;  // token sets: code vectors z / 8
  constexpr int G = D / NG;
  // Channel-group patterns of a slot: at head_dim 64 all lanes of a slot share a channel; at
  // 128 even and odd lanes hold channels A and A + 64.
  constexpr int NGP = D == 64 ? NG : std::max(1, 64 / G);
  constexpr int kSlotGroupDiv = D == 64 ? G : std::min(G, 64);
  const uint8_t* codes = block;
  const uint8_t* params = block + 64 * (D / 4);
  const __m512 table = LevelTable(f);

  // Scales in each token set's lane order, per element and group pattern; offsets in token
  // order per group. Tokens past ntok get 0 (their codes are never weighed).
  __m512 sc[NSET][2][NGP];
  __m512i perm[NSET][2];
  for (int set = 0; set < NSET; ++set) {
    for (int e = 0; e < 2; ++e) {
      alignas(64) int32_t tok[16], idx[16];
      for (int j = 0; j < 16; ++j) {
        tok[j] = VToken(D, set, e, j);
        idx[j] = D == 64 ? tok[j] - 32 * set : tok[j] - 16 * set;
      }
      const __m512i tv = _mm512_load_si512(tok);
      perm[set][e] = _mm512_load_si512(idx);
      const __mmask16 valid = _mm512_cmp_epi32_mask(tv, _mm512_set1_epi32(ntok), _MM_CMPINT_LT);
      for (int gp = 0; gp < NGP; ++gp) {
        alignas(64) int32_t at[16];
        for (int j = 0; j < 16; ++j) {
          const int a = gp * kSlotGroupDiv;  // a slot with this pattern
          const int c = VChannel(D, a % 8, a / 8, j);
          at[j] = tok[j] * NG + c / G;
        }
        const __m512i pz = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid,
                                                       _mm512_load_si512(at), params, 4);
        sc[set][e][gp] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(pz));
      }
    }
  }
  __m512 offn[NG][4];
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int i = 0; i < 4; ++i) {
    const __m512i tok = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * i));
    const __mmask16 valid = FirstLanes(ntok - 16 * i);
    for (int g = 0; g < NG; ++g) {
      const __m512i at =
          _mm512_add_epi32(_mm512_mullo_epi32(tok, _mm512_set1_epi32(NG)), _mm512_set1_epi32(g));
      const __m512i pz = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, at, params, 4);
      offn[g][i] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(pz, 16)));
    }
  }

  // Per row: the weights p_t · scale_t of each token set, element and group pattern, and the
  // offset sums Σ_t p_t · offset_t per group.
  __m512 w[kRowChunk][NSET][2][NGP];
  for (int r = 0; r < nr; ++r) {
    float* lanes = st.lanes + r * AttentionState::LaneFloats(D);
    if (!st.lanes_used[r]) {  // zeroed on first use, so rows that never see INT2 pay nothing
      for (int64_t i = 0; i < AttentionState::LaneFloats(D); i += 16) {
        _mm512_store_ps(lanes + i, _mm512_setzero_ps());
      }
      st.lanes_used[r] = 1;
    }
    __m512 pn[4];
    for (int i = 0; i < 4; ++i) pn[i] = _mm512_load_ps(p[r] + 16 * i);
    for (int set = 0; set < NSET; ++set) {
      for (int e = 0; e < 2; ++e) {
        const __m512 pp = D == 64
                              ? _mm512_permutex2var_ps(pn[2 * set], perm[set][e], pn[2 * set + 1])
                              : _mm512_permutexvar_ps(perm[set][e], pn[set]);
        for (int gp = 0; gp < NGP; ++gp) w[r][set][e][gp] = _mm512_mul_ps(pp, sc[set][e][gp]);
      }
    }
    for (int g = 0; g < NG; ++g) {
      float* o = lanes + 64 * 16 + g * 16;
      __m512 acc = _mm512_load_ps(o);
      for (int i = 0; i < 4; ++i) acc = _mm512_fmadd_ps(pn[i], offn[g][i], acc);
      _mm512_store_ps(o, acc);
    }
  }
  // Each code slot's levels once, then every row's partial sums for that slot.
  for (int g8 = 0; g8 < 8; ++g8) {
    __m512i zv[NSET];
    for (int set = 0; set < NSET; ++set) zv[set] = _mm512_loadu_si512(codes + 64 * (set * 8 + g8));
    for (int u = 0; u < 8; ++u) {
      const int a = 8 * u + g8;
      const int gp = a / kSlotGroupDiv;
      __m512 lv[NSET][2];
      for (int set = 0; set < NSET; ++set) {
        for (int e = 0; e < 2; ++e) {
          lv[set][e] = _mm512_permutexvar_ps(_mm512_srli_epi32(zv[set], 16 * e + 2 * u), table);
        }
      }
      for (int r = 0; r < nr; ++r) {
        float* slot = st.lanes + r * AttentionState::LaneFloats(D) + a * 16;
        __m512 acc = _mm512_load_ps(slot);
        for (int set = 0; set < NSET; ++set) {
          for (int e = 0; e < 2; ++e) acc = _mm512_fmadd_ps(lv[set][e], w[r][set][e][gp], acc);
        }
        _mm512_store_ps(slot, acc);
      }
    }
  }
}

template <int D>
void FinishLanes(int rows, int ng, const AttentionState& st) {
  const int G = D / ng;
  for (int r = 0; r < rows; ++r) {
    if (!st.lanes_used[r]) continue;
    const float* lanes = st.lanes + r * AttentionState::LaneFloats(D);
    float* acc = st.acc + r * D;
    float offset[8];
    for (int g = 0; g < ng; ++g)
      offset[g] = _mm512_reduce_add_ps(_mm512_load_ps(lanes + 1024 + 16 * g));
    for (int k = 0; k < 4; ++k) {
      __m512 v[16];
      if constexpr (D == 64) {
        for (int i = 0; i < 16; ++i) v[i] = _mm512_load_ps(lanes + (16 * k + i) * 16);
        _mm512_storeu_ps(acc + 16 * k, _mm512_add_ps(_mm512_loadu_ps(acc + 16 * k), Reduce16(v)));
      } else {
        for (int half = 0; half < 2; ++half) {
          const __mmask16 lanes_of_half = half == 0 ? 0x5555 : 0xaaaa;
          for (int i = 0; i < 16; ++i) {
            v[i] = _mm512_maskz_mov_ps(lanes_of_half, _mm512_load_ps(lanes + (16 * k + i) * 16));
          }
          float* a = acc + 64 * half + 16 * k;
          _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), Reduce16(v)));
        }
      }
    }
    for (int c = 0; c < D; ++c) acc[c] += offset[c / G];
  }
}

// ---- The block --------------------------------------------------------------------------

template <int D>
void Attend(const KvGeometry& g, const KvBlockPair& b, const QueryRows& q,
            const AttentionState& st) {
  const int ng = D / g.group_size;
  for (int r0 = 0; r0 < q.rows; r0 += kRowChunk) {
    const int nr = std::min(kRowChunk, q.rows - r0);
    alignas(64) float s[kRowChunk][64];
    const float* qr = q.q + r0 * D;
    switch (b.format) {
      case BlockFormat::kBf16:
        ScoresPlain<D, uint16_t>(b.k, b.num_tokens, qr, nr, q.scale, s);
        break;
      case BlockFormat::kF32:
        ScoresPlain<D, float>(b.k, b.num_tokens, qr, nr, q.scale, s);
        break;
      case BlockFormat::kInt2Uniform:
      case BlockFormat::kInt2LloydMax:
        switch (ng) {
          case 1:
            ScoresInt2<D, 1>(b.k, b.format, b.num_tokens, qr, nr, q.scale, s);
            break;
          case 2:
            ScoresInt2<D, 2>(b.k, b.format, b.num_tokens, qr, nr, q.scale, s);
            break;
          case 4:
            ScoresInt2<D, 4>(b.k, b.format, b.num_tokens, qr, nr, q.scale, s);
            break;
          default:
            if constexpr (D == 128)
              ScoresInt2<D, 8>(b.k, b.format, b.num_tokens, qr, nr, q.scale, s);
            break;
        }
        break;
    }
    if (b.score_bias != nullptr) {  // an evaluation codec's logit correction (fp32 blocks)
      for (int r = 0; r < nr; ++r) {
        for (int t = 0; t < b.num_tokens; ++t) s[r][t] += ScoreBias(b, q, r0 + r, t);
      }
    }
    // The online softmax, a row at a time; every lane of the 64 is computed (masked ones give
    // exactly 0), so a row's sums do not depend on how many tokens the block holds past it.
    for (int r = 0; r < nr; ++r) {
      const int row = r0 + r;
      if (q.visible[row] <= 0) {  // sees none of the block: nothing to add
        for (int i = 0; i < 64; i += 16) _mm512_store_ps(s[r] + i, _mm512_setzero_ps());
        continue;
      }
      __m512 x[4];
      __m512 mx = _mm512_set1_ps(kNegInf);
      for (int i = 0; i < 4; ++i) {
        const __mmask16 seen = FirstLanes(q.visible[row] - 16 * i);
        x[i] = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), seen, _mm512_load_ps(s[r] + 16 * i));
        mx = _mm512_max_ps(mx, x[i]);
      }
      // The reference point moves only when a score passes it by more than kLazyRescale, so
      // most blocks rescale nothing (the probabilities stay below e^8, far from overflow).
      const float m_old = st.m[row];
      const float block_max = _mm512_reduce_max_ps(mx);
      float m_new = m_old, corr = 1.0f;
      if (m_old == kNegInf) {
        m_new = block_max;  // the state is still zero
      } else if (block_max > m_old + kLazyRescale) {
        m_new = block_max;
        corr = ExpScalar(m_old - m_new);
      }
      const __m512 mb = _mm512_set1_ps(m_new);
      __m512 p[4];
      for (int i = 0; i < 4; ++i) {
        p[i] = Exp16(_mm512_sub_ps(x[i], mb));
        _mm512_store_ps(s[r] + 16 * i, p[i]);
      }
      const float sum =
          _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(p[0], p[1]), _mm512_add_ps(p[2], p[3])));
      st.l[row] = st.l[row] * corr + sum;
      st.m[row] = m_new;
      if (corr != 1.0f) {
        const __m512 cb = _mm512_set1_ps(corr);
        float* acc = st.acc + row * D;
        for (int j = 0; j < D; j += 16)
          _mm512_storeu_ps(acc + j, _mm512_mul_ps(_mm512_loadu_ps(acc + j), cb));
        if (st.lanes_used[row]) {
          float* lanes = st.lanes + row * AttentionState::LaneFloats(D);
          for (int j = 0; j < 1024 + 16 * ng; j += 16) {
            _mm512_store_ps(lanes + j, _mm512_mul_ps(_mm512_load_ps(lanes + j), cb));
          }
        }
      }
    }
    const AttentionState rows = st.Rows(r0);
    switch (b.format) {
      case BlockFormat::kBf16:
        ValuesPlain<D, uint16_t>(b.v, b.num_tokens, s, nr, rows.acc);
        break;
      case BlockFormat::kF32:
        ValuesPlain<D, float>(b.v, b.num_tokens, s, nr, rows.acc);
        break;
      case BlockFormat::kInt2Uniform:
      case BlockFormat::kInt2LloydMax:
        switch (ng) {
          case 1:
            ValuesInt2<D, 1>(b.v, b.format, b.num_tokens, s, nr, rows);
            break;
          case 2:
            ValuesInt2<D, 2>(b.v, b.format, b.num_tokens, s, nr, rows);
            break;
          case 4:
            ValuesInt2<D, 4>(b.v, b.format, b.num_tokens, s, nr, rows);
            break;
          default:
            if constexpr (D == 128) ValuesInt2<D, 8>(b.v, b.format, b.num_tokens, s, nr, rows);
            break;
        }
        break;
    }
  }
}

}  // namespace

void AttendBlock(const KvGeometry& g, const KvBlockPair& block, const QueryRows& q,
                 const AttentionState& st) {
  if (g.head_dim == 64) return Attend<64>(g, block, q, st);
  return Attend<128>(g, block, q, st);
}

void FinishAttentionState(const KvGeometry& g, int rows, const AttentionState& st) {
  const int ng = g.head_dim / g.group_size;
  if (g.head_dim == 64) return FinishLanes<64>(rows, ng, st);
  return FinishLanes<128>(rows, ng, st);
}

void ExpInPlace(float* x, int n) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = FirstLanes(n - i);
    _mm512_mask_storeu_ps(x + i, m, Exp16(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace kvstrata::kernels::cpu::avx512
