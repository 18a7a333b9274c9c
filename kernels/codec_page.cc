#include "kernels/codec_page.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(KVSTRATA_CPU_X86)
#include "kernels/cpu/codec_decode.h"
#include "kernels/cpu/isa.h"
#endif

namespace kvstrata::kernels {

namespace {

int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// The unit levels of the codes one byte holds, for 1, 2 and 4 bits: a row decodes a byte at a
// time with one lookup instead of a shift and mask per code.
struct ByteLevels {
  float v[256][8];
};

const ByteLevels& LevelsOfByte(int bits) {
  static const ByteLevels* tables = [] {
    auto* t = new ByteLevels[5]();
    for (int bits : {1, 2, 4}) {
      const float* levels = GaussianLloydMaxCentroids(bits);
      for (int byte = 0; byte < 256; ++byte) {
        for (int j = 0; j < 8 / bits; ++j) {
          t[bits].v[byte][j] = levels[(byte >> (j * bits)) & ((1 << bits) - 1)];
        }
      }
    }
    return t;
  }();
  return tables[bits];
}

// One row of a region: `channels` codes of `bits` (1..4) bits from `in`, times s.
void DecodeRegionRow(const uint8_t* in, int channels, int bits, float s, float* y) {
  if (bits == 3) {  // 8 codes in 3 bytes
    const float* levels = GaussianLloydMaxCentroids(3);
    for (int g = 0; g < channels / 8; ++g) {
      const uint32_t w = in[3 * g] | uint32_t{in[3 * g + 1]} << 8 | uint32_t{in[3 * g + 2]} << 16;
      for (int j = 0; j < 8; ++j) y[8 * g + j] = s * levels[(w >> (3 * j)) & 7];
    }
    return;
  }
  const ByteLevels& t = LevelsOfByte(bits);
  const int per_byte = 8 / bits;
  for (int b = 0; b < channels / per_byte; ++b) {
    const float* levels = t.v[in[b]];
    for (int j = 0; j < per_byte; ++j) y[b * per_byte + j] = s * levels[j];
  }
}

}  // namespace

// Never zero: an all-zero region then codes and reads back as ~0.
float CodecRegionScale(uint8_t row_code, uint8_t ratio_code) {
  return std::max(LogScaleValue(row_code) * LogScaleValue(ratio_code), 1e-30f);
}

std::string CodecRecipeUnservable(const SideRecipe& r, int head_dim) {
  if (r.kind != SideRecipe::Kind::kRegions) {
    return "only region recipes (BITSxCHANNELS+...) are served, not bf16/int2/int2lm/turbo3";
  }
  if (r.scale_bits != 8 || !r.page_ratios) return "a served recipe needs 8-bit page ratios (s8:pr)";
  if (r.level_multiplier != 1.0f || r.logit_bias != 0.0f || r.boost_rows > 0 ||
      r.least_squares_scale || r.norm_preserving || r.uniform_levels) {
    return "the options a, jb, t, ls, np and u are for evaluation only";
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

CodecLayerLayout CodecLayerLayoutOf(const SideRecipe& k_recipe, const CodecBlockLayout& k_blocks,
                                    const SideRecipe& v_recipe, const CodecBlockLayout& v_blocks,
                                    int64_t k_block0, int64_t v_block0) {
  CodecLayerLayout out;
  const SideRecipe* recipes[2] = {&k_recipe, &v_recipe};
  const CodecBlockLayout* blocks[2] = {&k_blocks, &v_blocks};
  const int64_t block0[2] = {k_block0, v_block0};
  for (int kind = 0; kind < 2; ++kind) {
    const SideRecipe& r = *recipes[kind];
    const CodecBlockLayout& l = *blocks[kind];
    CodecSideLayout& s = out.side[kind];
    s.block0 = block0[kind];
    s.block_bytes = static_cast<int32_t>(l.bytes);
    s.row_scales = static_cast<int32_t>(l.row_scales);
    s.ratios = static_cast<int32_t>(l.ratios);
    s.num_regions = static_cast<int32_t>(r.regions.size());
    for (size_t k = 0; k < r.regions.size(); ++k) {
      s.codes[k] = static_cast<int32_t>(l.region_codes[k]);
      s.bits[k] = static_cast<uint8_t>(r.regions[k].bits);
      s.channels[k] = static_cast<uint8_t>(r.regions[k].channels);
    }
  }
  return out;
}

CodecLayerLayout CodecLayerLayoutFor(const SideRecipe& k_recipe, const SideRecipe& v_recipe,
                                     int page_tokens, int64_t k_block0, int64_t v_block0) {
  return CodecLayerLayoutOf(k_recipe, CodecBlockLayoutFor(k_recipe, page_tokens), v_recipe,
                            CodecBlockLayoutFor(v_recipe, page_tokens), k_block0, v_block0);
}

void CodecPageScales(const float* rows, int page_tokens, int head_dim, const SideRecipe& r,
                     uint8_t* row_scales, uint8_t* ratios) {
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
    row_scales[t] = LogScaleCode(static_cast<float>(std::sqrt(row_sq / head_dim)));
  }
  for (size_t k = 0; k < nr; ++k) {
    ratios[k] = total > 0.0 ? LogScaleCode(static_cast<float>(std::sqrt(energy[k] / total))) : 0;
  }
}

void EncodeCodecBlock(const float* rows, int page_tokens, int head_dim, const SideRecipe& r,
                      uint8_t* block) {
  const CodecBlockLayout l = CodecBlockLayoutFor(r, page_tokens);
  std::memset(block, 0, static_cast<size_t>(l.bytes));
  const size_t nr = r.regions.size();
  CodecPageScales(rows, page_tokens, head_dim, r, block + l.row_scales, block + l.ratios);
  // Codes: the nearest level, found by counting the midpoints below the value.
  int c0 = 0;
  for (size_t k = 0; k < nr; ++k) {
    const CodecRegion& reg = r.regions[k];
    if (reg.bits > 0) {
      const float* levels = GaussianLloydMaxCentroids(reg.bits);
      const int count = 1 << reg.bits;
      for (int t = 0; t < page_tokens; ++t) {
        const float* x = rows + int64_t{t} * head_dim + c0;
        const float s = CodecRegionScale(block[l.row_scales + t], block[l.ratios + k]);
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
                      const SideRecipe& r, float* rows, CodecDecoder decoder) {
  const CodecBlockLayout l = CodecBlockLayoutFor(r, page_tokens);
#if defined(KVSTRATA_CPU_X86)
  static const bool avx512 = cpu::CpuSupports(cpu::CpuIsa::kAvx512);
  if (decoder == CodecDecoder::kFastest && avx512) {
    cpu::DecodeCodecBlockAvx512(block, l, num_tokens, head_dim, r, rows);
    return;
  }
#endif
  int c0 = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    const CodecRegion& reg = r.regions[k];
    for (int t = 0; t < num_tokens; ++t) {
      float* y = rows + int64_t{t} * head_dim + c0;
      if (reg.bits == 0) {
        std::fill(y, y + reg.channels, 0.0f);
        continue;
      }
      DecodeRegionRow(block + l.region_codes[k] + t * l.region_row_bytes[k], reg.channels, reg.bits,
                      CodecRegionScale(block[l.row_scales + t], block[l.ratios + k]), y);
    }
    c0 += reg.channels;
  }
}

}  // namespace kvstrata::kernels
