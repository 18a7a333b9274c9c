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

void QuantizeRowInt2(const float* row, int head_dim, int group_size, float clip_ratio,
                     PageEncoding encoding, uint8_t* codes, uint16_t* params) {
  for (int g = 0; g * group_size < head_dim; ++g) {
    QuantizeGroupInt2(row + g * group_size, group_size, clip_ratio, encoding,
                      codes + g * group_size, &params[2 * g], &params[2 * g + 1]);
  }
}

void DequantizeRowInt2(const uint8_t* codes, const uint16_t* params, int head_dim, int group_size,
                       PageEncoding encoding, float* row) {
  const Int2Levels levels = LevelsFor(encoding);
  for (int c = 0; c < head_dim; ++c) {
    const int g = c / group_size;
    row[c] = Fp16ToFloat(params[2 * g + 1]) + Fp16ToFloat(params[2 * g]) * levels.v[codes[c] & 3];
  }
}

namespace {

void PutCode(uint8_t* packed, int bit, uint8_t code) {
  packed[bit / 8] =
      static_cast<uint8_t>((packed[bit / 8] & ~(3 << (bit % 8))) | (code & 3) << (bit % 8));
}

uint8_t GetCode(const uint8_t* packed, int bit) { return (packed[bit / 8] >> (bit % 8)) & 3; }

constexpr int kInt2PageTokens = 64;  // the V layout is defined over 64-token blocks

}  // namespace

void PackKRow(const uint8_t* codes, int head_dim, uint8_t* packed) {
  for (int c = 0; c < head_dim; ++c) PutCode(packed, KCodeBit(c, head_dim), codes[c]);
}

void UnpackKRow(const uint8_t* packed, int head_dim, uint8_t* codes) {
  for (int c = 0; c < head_dim; ++c) codes[c] = GetCode(packed, KCodeBit(c, head_dim));
}

void PackVBlock(const uint8_t* codes, int head_dim, uint8_t* packed) {
  for (int t = 0; t < kInt2PageTokens; ++t) {
    for (int c = 0; c < head_dim; ++c) {
      PutCode(packed, VCodeBit(t, c, head_dim), codes[t * head_dim + c]);
    }
  }
}

void UnpackVBlock(const uint8_t* packed, int head_dim, uint8_t* codes) {
  for (int t = 0; t < kInt2PageTokens; ++t) {
    for (int c = 0; c < head_dim; ++c)
      codes[t * head_dim + c] = GetCode(packed, VCodeBit(t, c, head_dim));
  }
}

void EncodeInt2Block(const float* rows, int num_tokens, const KvGeometry& g, float clip_ratio,
                     PageEncoding encoding, int kind, uint8_t* block) {
  const int d = g.head_dim;
  const int64_t groups = Int2GroupsPerToken(g);
  uint8_t* codes_area = block;
  uint8_t* params_area = block + int64_t{g.page_tokens} * Int2CodeBytesPerToken(g);
  uint8_t codes[kInt2PageTokens * 128] = {};
  uint16_t params[2 * 128 / 16];
  for (int t = 0; t < num_tokens; ++t) {
    QuantizeRowInt2(rows + int64_t{t} * d, d, g.group_size, clip_ratio, encoding, codes + t * d,
                    params);
    std::memcpy(params_area + t * groups * 4, params, groups * 4);
  }
  if (kind == 0) {
    for (int t = 0; t < g.page_tokens; ++t) PackKRow(codes + t * d, d, codes_area + t * (d / 4));
  } else {
    PackVBlock(codes, d, codes_area);
  }
}

void DecodeInt2Block(const uint8_t* block, int num_tokens, const KvGeometry& g,
                     PageEncoding encoding, int kind, float* rows) {
  const int d = g.head_dim;
  const int64_t groups = Int2GroupsPerToken(g);
  const uint8_t* codes_area = block;
  const uint8_t* params_area = block + int64_t{g.page_tokens} * Int2CodeBytesPerToken(g);
  uint8_t codes[kInt2PageTokens * 128];
  uint16_t params[2 * 128 / 16];
  if (kind == 0) {
    for (int t = 0; t < num_tokens; ++t) UnpackKRow(codes_area + t * (d / 4), d, codes + t * d);
  } else {
    UnpackVBlock(codes_area, d, codes);
  }
  for (int t = 0; t < num_tokens; ++t) {
    std::memcpy(params, params_area + t * groups * 4, groups * 4);
    DequantizeRowInt2(codes + t * d, params, d, g.group_size, encoding, rows + int64_t{t} * d);
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
