#include "kernels/codec_fragment.h"

#include <algorithm>
#include <array>
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

// CodecFragmentFieldBit of every (token, channel) of a step, for side `kind` and a part of
// `width` 1, 2 or 4 bits: the decoder's inner loop reads it instead of computing it.
const uint16_t* FieldBits(int kind, int width) {
  using Table = std::array<uint16_t, kCodecFragmentTokens * kCodecFragmentStep>;
  static const std::array<Table, 6> tables = [] {
    std::array<Table, 6> t{};
    for (int kind = 0; kind < 2; ++kind) {
      for (int w = 0; w < 3; ++w) {
        for (int token = 0; token < kCodecFragmentTokens; ++token) {
          for (int c = 0; c < kCodecFragmentStep; ++c) {
            t[kind * 3 + w][token * kCodecFragmentStep + c] =
                static_cast<uint16_t>(CodecFragmentFieldBit(kind, 1 << w, token, c));
          }
        }
      }
    }
    return t;
  }();
  return tables[kind * 3 + (width == 1 ? 0 : width == 2 ? 1 : 2)].data();
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

CodecLayerLayout CodecFragmentLayerLayoutFor(const SideRecipe& k_recipe,
                                             const SideRecipe& v_recipe, int64_t k_block0,
                                             int64_t v_block0) {
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
  CodecPageScales(rows, kCodecFragmentTokens, head_dim, r, block + l.row_scales,
                  block + l.ratios);
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

void DecodeCodecFragmentBlock(const uint8_t* block, int num_tokens, int head_dim,
                              const SideRecipe& r, int kind, float* rows) {
  const CodecBlockLayout l = CodecFragmentBlockLayoutFor(r);
  int64_t at = 0;
  ForEachStep(r, [&](int step, int k, int bits) {
    float* y = rows + kCodecFragmentStep * step;
    if (bits == 0) {
      for (int t = 0; t < num_tokens; ++t) {
        std::fill(y + int64_t{t} * head_dim, y + int64_t{t} * head_dim + kCodecFragmentStep, 0.0f);
      }
      return;
    }
    const float* levels = RecipeLevels(r, bits);
    CodecFragmentPart parts[2];
    const int num_parts = CodecFragmentParts(bits, parts);
    const uint16_t* low_bits = FieldBits(kind, parts[0].width);
    const uint8_t* low = block + at;
    const uint32_t low_mask = (1u << parts[0].width) - 1;
    // b = 3: the high bit's part follows the low two bits' (128·2 bytes on).
    const uint16_t* high_bits = num_parts > 1 ? FieldBits(kind, 1) : nullptr;
    const uint8_t* high = block + at + 128 * parts[0].width;
    for (int t = 0; t < num_tokens; ++t) {
      const float s = CodecRegionScale(block[l.row_scales + t], block[l.ratios + k]);
      const uint16_t* lb = low_bits + t * kCodecFragmentStep;
      float* yt = y + int64_t{t} * head_dim;
      for (int c = 0; c < kCodecFragmentStep; ++c) {
        uint32_t code = (low[lb[c] / 8] >> (lb[c] % 8)) & low_mask;
        if (high_bits != nullptr) {
          const uint16_t hb = high_bits[t * kCodecFragmentStep + c];
          code |= ((high[hb / 8] >> (hb % 8)) & 1u) << 2;
        }
        yt[c] = s * levels[code];
      }
    }
    at += 128 * bits;
  });
}

}  // namespace kvstrata::kernels
