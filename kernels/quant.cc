#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace kvstrata::kernels {

namespace {
constexpr int kMaxGroup = 128;  // group_size <= head_dim <= 128
}  // namespace

float ClipThreshold(const float* x, int n, float ratio) {
  std::vector<float> mags(n);
  for (int i = 0; i < n; ++i) mags[i] = std::fabs(x[i]);
  const int k = std::min(n - 1, static_cast<int>(std::floor(static_cast<double>(ratio) * n)));
  std::nth_element(mags.begin(), mags.begin() + k, mags.end());
  return mags[k];
}

void QuantizeGroupInt2(const float* x, int n, float clip_ratio, PageEncoding encoding,
                       uint8_t* codes, uint16_t* scale_fp16, uint16_t* offset_fp16) {
  const float tau = ClipThreshold(x, n, clip_ratio);
  float c[kMaxGroup];
  for (int i = 0; i < n; ++i) c[i] = std::clamp(x[i], -tau, tau);

  if (encoding == PageEncoding::kInt2LloydMax) {
    double sum = 0, sum_sq = 0;
    for (int i = 0; i < n; ++i) sum += c[i];
    const double mean = sum / n;
    for (int i = 0; i < n; ++i) sum_sq += (c[i] - mean) * (c[i] - mean);
    *offset_fp16 = FloatToFp16Saturate(static_cast<float>(mean));
    *scale_fp16 = FloatToFp16Saturate(static_cast<float>(std::sqrt(sum_sq / n)));
    const float m = Fp16ToFloat(*offset_fp16);
    const float s = Fp16ToFloat(*scale_fp16);
    const Int2Levels& L = kGaussianLloydMaxLevels;
    for (int i = 0; i < n; ++i) {
      // nearest level; on a tie the lower code wins
      int best = 0;
      float best_err = std::fabs(c[i] - (m + s * L.v[0]));
      for (int k = 1; k < 4; ++k) {
        const float err = std::fabs(c[i] - (m + s * L.v[k]));
        if (err < best_err) best = k, best_err = err;
      }
      codes[i] = static_cast<uint8_t>(best);
    }
    return;
  }

  float lo = tau, hi = -tau;  // every clipped value lies in [-tau, tau]
  for (int i = 0; i < n; ++i) lo = std::min(lo, c[i]), hi = std::max(hi, c[i]);
  *offset_fp16 = FloatToFp16Saturate(lo);
  *scale_fp16 = FloatToFp16Saturate((hi - lo) / 3.0f);
  const float m = Fp16ToFloat(*offset_fp16);
  const float s = Fp16ToFloat(*scale_fp16);
  for (int i = 0; i < n; ++i) {
    int q = 0;
    if (s > 0.0f) q = static_cast<int>(std::floor((c[i] - m) / s + 0.5f));
    codes[i] = static_cast<uint8_t>(std::clamp(q, 0, 3));
  }
}

void PackGroupCodes(const uint8_t* codes, int n, uint8_t* packed) {
  const int quarter = n / 4;
  for (int j = 0; j < quarter; ++j) {
    packed[j] =
        static_cast<uint8_t>((codes[j] & 3) | (codes[j + quarter] & 3) << 2 |
                             (codes[j + 2 * quarter] & 3) << 4 | (codes[j + 3 * quarter] & 3) << 6);
  }
}

void UnpackGroupCodes(const uint8_t* packed, int n, uint8_t* codes) {
  const int quarter = n / 4;
  for (int j = 0; j < quarter; ++j) {
    for (int k = 0; k < 4; ++k) codes[j + k * quarter] = (packed[j] >> (2 * k)) & 3;
  }
}

void QuantizeRowInt2(const float* row, int head_dim, int group_size, float clip_ratio,
                     PageEncoding encoding, uint8_t* packed, uint16_t* params) {
  uint8_t codes[128];
  for (int g = 0; g * group_size < head_dim; ++g) {
    QuantizeGroupInt2(row + g * group_size, group_size, clip_ratio, encoding, codes, &params[2 * g],
                      &params[2 * g + 1]);
    PackGroupCodes(codes, group_size, packed + g * group_size / 4);
  }
}

void DequantizeRowInt2(const uint8_t* packed, const uint16_t* params, int head_dim, int group_size,
                       PageEncoding encoding, float* row) {
  const Int2Levels levels = LevelsFor(encoding);
  uint8_t codes[128];
  for (int g = 0; g * group_size < head_dim; ++g) {
    UnpackGroupCodes(packed + g * group_size / 4, group_size, codes);
    const float s = Fp16ToFloat(params[2 * g]);
    const float m = Fp16ToFloat(params[2 * g + 1]);
    for (int i = 0; i < group_size; ++i) row[g * group_size + i] = m + s * levels.v[codes[i]];
  }
}

namespace {

struct Int2BlockParts {
  uint8_t* codes;
  uint8_t* params;  // fp16 pairs, possibly unaligned: accessed through memcpy
};

Int2BlockParts Int2Parts(uint8_t* block, const KvGeometry& g) {
  return {block, block + int64_t{g.page_tokens} * Int2CodeBytesPerToken(g)};
}

}  // namespace

void EncodeInt2Block(const float* rows, int num_tokens, const KvGeometry& g, float clip_ratio,
                     PageEncoding encoding, uint8_t* block) {
  const Int2BlockParts parts = Int2Parts(block, g);
  const int64_t code_bytes = Int2CodeBytesPerToken(g);
  const int64_t groups = Int2GroupsPerToken(g);
  uint16_t params[2 * 128 / 16];
  for (int t = 0; t < num_tokens; ++t) {
    QuantizeRowInt2(rows + int64_t{t} * g.head_dim, g.head_dim, g.group_size, clip_ratio, encoding,
                    parts.codes + t * code_bytes, params);
    std::memcpy(parts.params + t * groups * 4, params, groups * 4);
  }
}

void DecodeInt2Block(const uint8_t* block, int num_tokens, const KvGeometry& g,
                     PageEncoding encoding, float* rows) {
  const Int2BlockParts parts = Int2Parts(const_cast<uint8_t*>(block), g);
  const int64_t code_bytes = Int2CodeBytesPerToken(g);
  const int64_t groups = Int2GroupsPerToken(g);
  uint16_t params[2 * 128 / 16];
  for (int t = 0; t < num_tokens; ++t) {
    std::memcpy(params, parts.params + t * groups * 4, groups * 4);
    DequantizeRowInt2(parts.codes + t * code_bytes, params, g.head_dim, g.group_size, encoding,
                      rows + int64_t{t} * g.head_dim);
  }
}

void EncodeBf16Block(const float* rows, int num_tokens, const KvGeometry& g, uint8_t* block) {
  for (int64_t i = 0; i < int64_t{num_tokens} * g.head_dim; ++i) {
    const uint16_t h = FloatToBf16(rows[i]);
    std::memcpy(block + 2 * i, &h, 2);
  }
}

void DecodeBf16Block(const uint8_t* block, int num_tokens, const KvGeometry& g, float* rows) {
  for (int64_t i = 0; i < int64_t{num_tokens} * g.head_dim; ++i) {
    uint16_t h;
    std::memcpy(&h, block + 2 * i, 2);
    rows[i] = Bf16ToFloat(h);
  }
}

}  // namespace kvstrata::kernels
