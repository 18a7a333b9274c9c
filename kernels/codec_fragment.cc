#include "kernels/codec_fragment.h"

#include <algorithm>
#include <cstring>

namespace kvstrata::kernels {

namespace {

int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

// The bits of each step (16 channels) of a recipe whose regions are whole steps.
template <typename F>
void ForEachStep(const SideRecipe& r, F&& f) {
  int step = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    for (int i = 0; i < r.regions[k].channels / kCodecFragmentStep; ++i) {
      f(step++, static_cast<int>(k), r.regions[k].bits);
    }
  }
}

}  // namespace

int CodecFragmentParts(int bits, CodecFragmentPart* parts) {
  switch (bits) {
    case 1:
    case 2:
    case 4:
      parts[0] = {bits, 0};
      return 1;
    case 3:
      parts[0] = {2, 0};
      parts[1] = {1, 2};
      return 2;
    default:
      return 0;
  }
}

std::string CodecFragmentRecipeUnservable(const SideRecipe& r, int head_dim) {
  if (r.kind == SideRecipe::Kind::kRegions && !r.uniform_levels) {
    return "a fragment block codes uniform levels (u)";
  }
  SideRecipe lloyd_max = r;
  lloyd_max.uniform_levels = false;
  const std::string why = CodecRecipeUnservable(lloyd_max, head_dim);
  if (!why.empty()) return why;
  for (const CodecRegion& reg : r.regions) {
    if (reg.channels % kCodecFragmentStep != 0) {
      return "region " + std::to_string(reg.bits) + "x" + std::to_string(reg.channels) +
             " is not whole steps of 16 channels";
    }
  }
  return "";
}

CodecBlockLayout CodecFragmentBlockLayoutFor(const SideRecipe& r) {
  CodecBlockLayout l;
  int64_t at = 0;
  for (size_t k = 0; k < r.regions.size(); ++k) {
    const CodecRegion& reg = r.regions[k];
    if (reg.bits == 0) continue;
    l.region_codes[k] = at;
    l.region_row_bytes[k] = int64_t{reg.channels} * reg.bits / 8;
    at += l.region_row_bytes[k] * kCodecFragmentTokens;  // 128·bits per step: stays 16-aligned
  }
  l.row_scales = at;
  l.ratios = l.row_scales + kCodecFragmentTokens;
  l.bytes = RoundUp16(l.ratios + static_cast<int64_t>(r.regions.size()));
  return l;
}

CodecLayerLayout CodecFragmentLayerLayoutFor(const SideRecipe& k_recipe, const SideRecipe& v_recipe,
                                             int64_t k_block0, int64_t v_block0) {
  return CodecLayerLayoutOf(k_recipe, CodecFragmentBlockLayoutFor(k_recipe), v_recipe,
                            CodecFragmentBlockLayoutFor(v_recipe), k_block0, v_block0);
}

bool CodecFragmentLayoutOk(const CodecLayerLayout& layout) {
  for (const CodecSideLayout& s : layout.side) {
    int64_t code_bytes = 0;
    for (int k = 0; k < s.num_regions; ++k) {
      if (s.channels[k] % kCodecFragmentStep != 0) return false;
      code_bytes += int64_t{kCodecFragmentTokens} * kCodecFragmentStep / 8 * s.bits[k] *
                    (s.channels[k] / kCodecFragmentStep);
    }
    if (s.row_scales != code_bytes || s.ratios != s.row_scales + kCodecFragmentTokens ||
        s.ratios + s.num_regions > s.block_bytes) {
      return false;
    }
  }
  return true;
}

void CodecFragmentLevelTable(float (&levels)[5][16]) {
  for (int bits = 0; bits < 5; ++bits) {
    for (int c = 0; c < 16; ++c) {
      levels[bits][c] = bits > 0 && c < (1 << bits) ? GaussianUniformLevels(bits)[c] : 0.0f;
    }
  }
}

void EncodeCodecFragmentBlock(const float* rows, int head_dim, const SideRecipe& r, int kind,
                              uint8_t* block) {
  const CodecBlockLayout l = CodecFragmentBlockLayoutFor(r);
  std::memset(block, 0, static_cast<size_t>(l.bytes));
  CodecPageScales(rows, kCodecFragmentTokens, head_dim, r, block + l.row_scales, block + l.ratios);
  int64_t at = 0;  // the step's first byte
  ForEachStep(r, [&](int step, int k, int bits) {
    if (bits == 0) return;
    const float* levels = RecipeLevels(r, bits);
    const int count = 1 << bits;
    CodecFragmentPart parts[2];
    const int num_parts = CodecFragmentParts(bits, parts);
    for (int t = 0; t < kCodecFragmentTokens; ++t) {
      const float s = CodecRegionScale(block[l.row_scales + t], block[l.ratios + k]);
      for (int c = 0; c < kCodecFragmentStep; ++c) {
        const float x = rows[int64_t{t} * head_dim + kCodecFragmentStep * step + c];
        // The nearest level, found by counting the midpoints below the value.
        int code = 0;
        while (code + 1 < count && x > 0.5f * s * (levels[code] + levels[code + 1])) ++code;
        int64_t part_at = at;
        for (int p = 0; p < num_parts; ++p) {
          const int64_t bit = CodecFragmentFieldBit(kind, parts[p].width, t, c);
          const uint32_t field = (code >> parts[p].shift) & ((1u << parts[p].width) - 1);
          // A field never crosses a byte: width divides its position's offset in the byte.
          block[part_at + bit / 8] |= static_cast<uint8_t>(field << (bit % 8));
          part_at += 128 * parts[p].width;
        }
      }
    }
    at += 128 * bits;
  });
}

namespace {

// One part's words for one lane: `W` 32-bit little-endian words at 4·W·lane bytes.
template <int W>
void LaneWords(const uint8_t* part, int lane, uint32_t (&w)[4]) {
  const uint8_t* p = part + 4 * W * lane;
  for (int m = 0; m < W; ++m, p += 4) {
    w[m] = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  }
}

// One step of `Bits` bits of side Kind: lane by lane, each lane's 32 codes from its words with
// constant shifts, into rows [num_tokens][head_dim] at channel 16·step; scale[t] = s_t·ρ_k.
template <int Kind, int Bits>
void DecodeFragmentStep(const uint8_t* part, int step, int num_tokens, int head_dim,
                        const float* scale, const float* levels, float* rows) {
  constexpr int kLowWidth = Bits == 3 ? 2 : Bits;  // b = 3: bits 0-1, then bit 2 256 bytes on
  for (int lane = 0; lane < 32; ++lane) {
    uint32_t lo[4] = {}, hi[4] = {};
    LaneWords<kLowWidth>(part, lane, lo);
    if constexpr (Bits == 3) LaneWords<1>(part + 256, lane, hi);  // the high bit
#pragma GCC unroll 8
    for (int group = 0; group < 8; ++group) {
#pragma GCC unroll 2
      for (int second = 0; second < 2; ++second) {
#pragma GCC unroll 2
        for (int elem = 0; elem < 2; ++elem) {
          uint32_t code = CodecFragmentLaneField<kLowWidth>(lo, group, second, elem);
          if constexpr (Bits == 3) code |= CodecFragmentLaneField<1>(hi, group, second, elem) << 2;
          const int token = CodecFragmentLaneToken(Kind, lane, group, second, elem);
          if (token < num_tokens) {
            const int channel = CodecFragmentLaneChannel(Kind, lane, group, second, elem);
            rows[int64_t{token} * head_dim + kCodecFragmentStep * step + channel] =
                scale[token] * levels[code];
          }
        }
      }
    }
  }
}

// The same for a step of any bits (1..4).
template <int Kind>
void DecodeFragmentStepOf(int bits, const uint8_t* part, int step, int num_tokens, int head_dim,
                          const float* scale, const float* levels, float* rows) {
  switch (bits) {
    case 1:
      return DecodeFragmentStep<Kind, 1>(part, step, num_tokens, head_dim, scale, levels, rows);
    case 2:
      return DecodeFragmentStep<Kind, 2>(part, step, num_tokens, head_dim, scale, levels, rows);
    case 3:
      return DecodeFragmentStep<Kind, 3>(part, step, num_tokens, head_dim, scale, levels, rows);
    default:
      return DecodeFragmentStep<Kind, 4>(part, step, num_tokens, head_dim, scale, levels, rows);
  }
}

}  // namespace

void DecodeCodecFragmentBlock(const uint8_t* block, int num_tokens, int head_dim,
                              const SideRecipe& r, int kind, float* rows) {
  const CodecBlockLayout l = CodecFragmentBlockLayoutFor(r);
  int64_t at = 0;
  float scale[kCodecFragmentTokens];
  int scale_region = -1;
  ForEachStep(r, [&](int step, int k, int bits) {
    float* y = rows + kCodecFragmentStep * step;
    if (bits == 0) {
      for (int t = 0; t < num_tokens; ++t) {
        std::fill(y + int64_t{t} * head_dim, y + int64_t{t} * head_dim + kCodecFragmentStep, 0.0f);
      }
      return;
    }
    if (k != scale_region) {
      for (int t = 0; t < num_tokens; ++t) {
        scale[t] = CodecRegionScale(block[l.row_scales + t], block[l.ratios + k]);
      }
      scale_region = k;
    }
    const float* levels = RecipeLevels(r, bits);
    (kind == 0 ? DecodeFragmentStepOf<0> : DecodeFragmentStepOf<1>)(bits, block + at, step,
                                                                    num_tokens, head_dim, scale,
                                                                    levels, rows);
    at += 128 * bits;
  });
}

}  // namespace kvstrata::kernels
