#include "engine/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/quant.h"

namespace kvstrata::engine {

void ChunkAttention(KvCache& cache, const SequenceKv& seq, int layer, const float* q, int n,
                    int64_t pos0, int num_heads, float sm_scale, float* out) {
  const kernels::KvGeometry& g = cache.geometry();
  const int d = g.head_dim;
  const int P = g.page_tokens;
  const int group = num_heads / g.num_kv_heads;
  const int rows = n * group;  // row r = t * group + j  <->  query t, head kv_head * group + j
  const int64_t end = pos0 + n;
  const int64_t pages = (end + P - 1) / P;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  std::vector<float> qh(static_cast<size_t>(rows) * d), acc(static_cast<size_t>(rows) * d);
  std::vector<float> m(rows), l(rows), scores(static_cast<size_t>(rows) * P);
  std::vector<float> k_tile(static_cast<size_t>(P) * d), v_tile(static_cast<size_t>(P) * d);

  for (int h = 0; h < g.num_kv_heads; ++h) {
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < group; ++j) {
        const float* src = q + (static_cast<int64_t>(t) * num_heads + h * group + j) * d;
        std::copy(src, src + d, qh.begin() + (static_cast<int64_t>(t) * group + j) * d);
      }
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(m.begin(), m.end(), kNegInf);
    std::fill(l.begin(), l.end(), 0.0f);

    for (int64_t p = 0; p < pages; ++p) {
      const int64_t tok0 = p * P;
      const int ntok = static_cast<int>(std::min<int64_t>(P, end - tok0));
      const int64_t first_int2 = cache.FirstInt2Query(p);
      // Queries t >= tok0 see the page: in BF16 before first_int2, as history from it on.
      const int64_t ranges[2][2] = {{std::max(pos0, tok0), std::min(end, first_int2)},
                                    {std::max({pos0, tok0, first_int2}), end}};
      for (int version = 0; version < 2; ++version) {
        const int64_t t_begin = ranges[version][0], t_end = ranges[version][1];
        if (t_begin >= t_end) continue;
        if (version == 0) {
          kernels::DecodeBf16Block(cache.Bf16Block(seq, p, layer, 0, h), ntok, g, k_tile.data());
          kernels::DecodeBf16Block(cache.Bf16Block(seq, p, layer, 1, h), ntok, g, v_tile.data());
        } else {
          cache.DecodeHistory(seq, p, layer, /*kind=*/0, h, ntok, k_tile.data());
          cache.DecodeHistory(seq, p, layer, /*kind=*/1, h, ntok, v_tile.data());
        }
        const int r0 = static_cast<int>(t_begin - pos0) * group;
        const int nr = static_cast<int>(t_end - t_begin) * group;
        // scores[nr][ntok] = Q·Kᵀ · scale
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, ntok, d, sm_scale,
                    qh.data() + static_cast<int64_t>(r0) * d, d, k_tile.data(), d, 0.0f,
                    scores.data(), ntok);
        for (int r = 0; r < nr; ++r) {
          const int64_t t = pos0 + (r0 + r) / group;
          float* s = scores.data() + static_cast<int64_t>(r) * ntok;
          const int visible = static_cast<int>(std::min<int64_t>(ntok, t - tok0 + 1));  // causal
          float row_max = kNegInf;
          for (int j = 0; j < visible; ++j) row_max = std::max(row_max, s[j]);
          const int row = r0 + r;
          const float new_m = std::max(m[row], row_max);
          const float correction = m[row] == kNegInf ? 0.0f : std::exp(m[row] - new_m);
          float sum = 0.0f;
          for (int j = 0; j < visible; ++j) sum += (s[j] = std::exp(s[j] - new_m));
          for (int j = visible; j < ntok; ++j) s[j] = 0.0f;
          l[row] = l[row] * correction + sum;
          m[row] = new_m;
          float* a = acc.data() + static_cast<int64_t>(row) * d;
          for (int i = 0; i < d; ++i) a[i] *= correction;
        }
        // acc[nr][d] += P·V
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, d, ntok, 1.0f, scores.data(),
                    ntok, v_tile.data(), d, 1.0f, acc.data() + static_cast<int64_t>(r0) * d, d);
      }
    }
    for (int t = 0; t < n; ++t) {
      for (int j = 0; j < group; ++j) {
        const int row = t * group + j;
        float* dst = out + (static_cast<int64_t>(t) * num_heads + h * group + j) * d;
        const float inv = l[row] > 0.0f ? 1.0f / l[row] : 0.0f;
        for (int i = 0; i < d; ++i) dst[i] = acc[static_cast<int64_t>(row) * d + i] * inv;
      }
    }
  }
}

}  // namespace kvstrata::engine
