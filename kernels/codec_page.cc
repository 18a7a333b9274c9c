#include "kernels/codec_page.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvstrata::kernels {

namespace {

int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// The stored scale of a region of a row: the product of the row's and the region's stored
// log2 values, never zero (an all-zero region then codes and reads back as ~0).
float RegionScale(uint8_t row_code, uint8_t ratio_code) {
  return std::max(LogScaleValue(row_code) * LogScaleValue(ratio_code), 1e-30f);
}

}  // namespace

std::string CodecRecipeUnservable(const SideRecipe& r, int head_dim) {
  if (r.kind != SideRecipe::Kind::kRegions) {
    return "only region recipes (BITSxCHANNELS+...) are served, not bf16/int2/int2lm/turbo3";
  }
  if (r.scale_bits != 8 || !r.page_ratios) return "a served recipe needs 8-bit page ratios (s8:pr)";
  if (r.level_multiplier != 1.0f || r.logit_bias != 0.0f || r.boost_rows > 0 ||
      r.least_squares_scale || r.norm_preserving) {
    return "the options a, jb, t, ls and np are for evaluation only";
  }
  if (r.regions.size() > static_cast<size_t>(kMaxCodecRegions)) {
    return "at most " + std::to_string(kMaxCodecRegions) + " regions";
  }
  int channels = 0;
  for (const CodecRegion& reg : r.regions) {
    if ((reg.channels * reg.bits) % 8 != 0) {
      return "region " + std::to_string(reg.bits) + "x" + std::to_string(reg.channels) +
             " does not fill whole bytes (channels x bits must be a multiple of 8)";
    }
    channels += reg.channels;
  }
  if (channels != head_dim) return "the regions do not cover head_dim";
  return "";
}

CodecBlockLayout CodecBlockLayoutFor(const SideRecipe& r, int page_tokens) {
  CodecBlockLayout l;
  int64_t at = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    const CodecRegion& reg = r.regions[k];
    if (reg.bits == 0) continue;
    l.region_codes[k] = at;
    l.region_row_bytes[k] = int64_t{reg.channels} * reg.bits / 8;
    at = RoundUp16(at + l.region_row_bytes[k] * page_tokens);
  }
  l.row_scales = at;
  l.ratios = l.row_scales + page_tokens;
  l.bytes = RoundUp16(l.ratios + static_cast<int64_t>(r.regions.size()));
  return l;
}

void EncodeCodecBlock(const float* rows, int page_tokens, int head_dim, const SideRecipe& r,
                      uint8_t* block) {
  const CodecBlockLayout l = CodecBlockLayoutFor(r, page_tokens);
  std::memset(block, 0, static_cast<size_t>(l.bytes));
  const size_t nr = r.regions.size();
  // Row scales and page ratios, as FakeQuantSide computes them for `pr` recipes.
  double energy[kMaxCodecRegions] = {};
  double total = 0.0;
  for (int t = 0; t < page_tokens; ++t) {
    const float* x = rows + int64_t{t} * head_dim;
    double row_sq = 0.0;
    int c0 = 0;
    for (size_t k = 0; k < nr; ++k) {
      double sq = 0.0;
      for (int i = 0; i < r.regions[k].channels; ++i) sq += double{x[c0 + i]} * x[c0 + i];
      row_sq += sq;
      energy[k] += sq / r.regions[k].channels;
      c0 += r.regions[k].channels;
    }
    total += row_sq / head_dim;
    block[l.row_scales + t] = LogScaleCode(static_cast<float>(std::sqrt(row_sq / head_dim)));
  }
  for (size_t k = 0; k < nr; ++k) {
    block[l.ratios + k] =
        total > 0.0 ? LogScaleCode(static_cast<float>(std::sqrt(energy[k] / total))) : 0;
  }
  // Codes: the nearest level, found by counting the midpoints below the value.
  int c0 = 0;
  for (size_t k = 0; k < nr; ++k) {
    const CodecRegion& reg = r.regions[k];
    if (reg.bits > 0) {
      const float* levels = GaussianLloydMaxCentroids(reg.bits);
      const int count = 1 << reg.bits;
      for (int t = 0; t < page_tokens; ++t) {
        const float* x = rows + int64_t{t} * head_dim + c0;
        const float s = RegionScale(block[l.row_scales + t], block[l.ratios + k]);
        uint8_t* out = block + l.region_codes[k] + t * l.region_row_bytes[k];
        for (int i = 0; i < reg.channels; ++i) {
          int c = 0;
          while (c + 1 < count && x[i] > 0.5f * s * (levels[c] + levels[c + 1])) ++c;
          const int bit = i * reg.bits;
          out[bit / 8] |= static_cast<uint8_t>(c << (bit % 8));
          if (bit % 8 + reg.bits > 8) out[bit / 8 + 1] |= static_cast<uint8_t>(c >> (8 - bit % 8));
        }
      }
    }
    c0 += reg.channels;
  }
}

void DecodeCodecBlock(const uint8_t* block, int num_tokens, int page_tokens, int head_dim,
                      const SideRecipe& r, float* rows) {
  const CodecBlockLayout l = CodecBlockLayoutFor(r, page_tokens);
  int c0 = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    const CodecRegion& reg = r.regions[k];
    for (int t = 0; t < num_tokens; ++t) {
      float* y = rows + int64_t{t} * head_dim + c0;
      if (reg.bits == 0) {
        std::fill(y, y + reg.channels, 0.0f);
        continue;
      }
      const float* levels = GaussianLloydMaxCentroids(reg.bits);
      const float s = RegionScale(block[l.row_scales + t], block[l.ratios + k]);
      const uint8_t* in = block + l.region_codes[k] + t * l.region_row_bytes[k];
      const int mask = (1 << reg.bits) - 1;
      for (int i = 0; i < reg.channels; ++i) {
        const int bit = i * reg.bits;
        int word = in[bit / 8];
        if (bit % 8 + reg.bits > 8) word |= in[bit / 8 + 1] << 8;
        y[i] = s * levels[(word >> (bit % 8)) & mask];
      }
    }
    c0 += reg.channels;
  }
}

}  // namespace kvstrata::kernels
