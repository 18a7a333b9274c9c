#include "kernels/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
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
  for (int g = 0; g * group_size < head_dim; ++g) {
    const float s = Fp16ToFloat(params[2 * g]), m = Fp16ToFloat(params[2 * g + 1]);
    const float value[4] = {m + s * levels.v[0], m + s * levels.v[1], m + s * levels.v[2],
                            m + s * levels.v[3]};
    for (int c = g * group_size; c < (g + 1) * group_size; ++c) row[c] = value[codes[c] & 3];
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

namespace {

// Bit positions of the layouts, computed once per head_dim: decoding a block is then a table
// walk instead of evaluating KCodeBit/VCodeBit per code.
struct LayoutTables {
  int head_dim;
  std::vector<uint16_t> k;  // [head_dim]: bit within a K row
  std::vector<uint16_t> v;  // [64 * head_dim]: bit within a V block
};

const LayoutTables& Tables(int head_dim) {
  static const LayoutTables* tables[2] = {nullptr, nullptr};
  static std::once_flag once[2];
  const int which = head_dim == 64 ? 0 : 1;
  std::call_once(once[which], [&] {
    auto* t = new LayoutTables{head_dim, std::vector<uint16_t>(head_dim),
                               std::vector<uint16_t>(kInt2PageTokens * head_dim)};
    for (int c = 0; c < head_dim; ++c) t->k[c] = static_cast<uint16_t>(KCodeBit(c, head_dim));
    for (int tok = 0; tok < kInt2PageTokens; ++tok)
      for (int c = 0; c < head_dim; ++c)
        t->v[tok * head_dim + c] = static_cast<uint16_t>(VCodeBit(tok, c, head_dim));
    tables[which] = t;
  });
  return *tables[which];
}

}  // namespace

void PackKRow(const uint8_t* codes, int head_dim, uint8_t* packed) {
  std::memset(packed, 0, head_dim / 4);
  const std::vector<uint16_t>& bits = Tables(head_dim).k;
  for (int c = 0; c < head_dim; ++c) packed[bits[c] / 8] |= (codes[c] & 3) << (bits[c] % 8);
}

void UnpackKRow(const uint8_t* packed, int head_dim, uint8_t* codes) {
  const std::vector<uint16_t>& bits = Tables(head_dim).k;
  for (int c = 0; c < head_dim; ++c) codes[c] = GetCode(packed, bits[c]);
}

void PackVBlock(const uint8_t* codes, int head_dim, uint8_t* packed) {
  std::memset(packed, 0, kInt2PageTokens * head_dim / 4);
  const std::vector<uint16_t>& bits = Tables(head_dim).v;
  for (int i = 0; i < kInt2PageTokens * head_dim; ++i) {
    packed[bits[i] / 8] |= (codes[i] & 3) << (bits[i] % 8);
  }
}

void UnpackVBlock(const uint8_t* packed, int head_dim, uint8_t* codes) {
  const std::vector<uint16_t>& bits = Tables(head_dim).v;
  for (int i = 0; i < kInt2PageTokens * head_dim; ++i) codes[i] = GetCode(packed, bits[i]);
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
