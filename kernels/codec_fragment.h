#pragma once

// Codec fragment blocks: a history codec's codes laid out for the tensor cores' fragments, so a
// kernel reads them as it reads INT2's (kernels/kv_layout.h, KCodeBit / VCodeBit): a pair of
// codes becomes an fp16x2 operand with one shift shared by two pairs and one logic op, with no
// table and no pass through shared memory as rows. Recipes with uniform levels (`u`,
// kernels/history_codec.h) only: a uniform code is its value up to one multiply-add, where a
// Lloyd-Max code needs a lookup. docs/kv-format.md, "Codec fragment block".
//
// A block of one (layer, K|V, KV head) of a 64-token page, every part at a multiple of 16 bytes:
//   codes      per step s (channels [16s, 16s + 16), in the region of b_s bits; dropped regions
//              store nothing), per part of the step (b = 1, 2, 4: one part of b bits; b = 3: the
//              code's low two bits, then its high bit), for lane 0..31 of a warp, `width` 32-bit
//              little-endian words: 128·b_s bytes per step, exactly the step's 64 x 16 codes;
//   uint8      row_scale [64]   LogScaleCode of the row's RMS
//   uint8      ratio [regions]  LogScaleCode of the region's RMS over the row's, over the page
//   zero padding to a multiple of 16 bytes.
// Within one part's words, lane 4g + t holds, in each of the 8 / width words, 8 / width groups;
// group j of a word sits at bits 2·width·j (its first pair) and 2·width·j + width (its second),
// the pair's even element in the low half-word and its odd element in the high one:
//   K (the A operand of Sᵀ = K·Qᵀ; a group is a token row): group r (0..7) is token g + 8r; its
//     first pair is channels 2t, 2t + 1 of the step and its second 2t + 8, 2t + 9;
//   V (the A operand of Oᵀ = Vᵀ·Pᵀ; a group is a channel row in one 16-token k-step): group
//     q = 2i + h (i = 0..3, h = 0..1) is channel 8h + g of the step over tokens 16i..16i+15; its
//     first pair is tokens 16i + 2t, +1 and its second 16i + 2t + 8, +9.
// So word m's group j shifted right by 2·width·j gives both pairs of a fragment register with a
// mask each: the first at weight 1, the second at weight 2^width (folded into the other operand).
// Reconstruction: code c of region k (b bits) of token t reads max(s_t·ρ_k, 1e-30)·U_b[c], with
// U_b = GaussianUniformLevels(b): bit for bit what FakeQuantSide reconstructs for the recipe.

#include <cstdint>
#include <string>

#include "kernels/codec_page.h"
#include "kernels/history_codec.h"
#include "kernels/numeric.h"

namespace kvstrata::kernels {

inline constexpr int kCodecFragmentTokens = 64;  // a page; the layout is defined for 64 rows
inline constexpr int kCodecFragmentStep = 16;    // channels per step
// GaussianUniformStep(bits) as floats, for the kernels (checked against it by the test).
inline constexpr float kCodecFragmentLevelStep[5] = {0.0f, 1.59576917f, 0.99568671f,
                                                     0.586019456f, 0.335200608f};

// The bits of a code one part of a step holds: [shift, shift + width).
struct CodecFragmentPart {
  int width = 0;
  int shift = 0;
};
// The parts of a step of `bits` (0..4) into parts[2]; returns how many (0 for a dropped region).
int CodecFragmentParts(int bits, CodecFragmentPart* parts);

// The bit, within the 32·width words of one part of one step, of the field of (token 0..63,
// channel 0..15 of the step) for side `kind` (0 = K, 1 = V). Host and device (the GPU demotion
// places the codes with it).
KV_HOST_DEVICE int64_t CodecFragmentFieldBit(int kind, int width, int token, int channel) {
  int lane, group, second, elem;
  if (kind == 0) {  // a group is a token row; pairs run along channels
    const int g = token % 8, r = token / 8;
    second = channel / 8;
    const int c = channel % 8;
    lane = 4 * g + c / 2;
    elem = c % 2;
    group = r;
  } else {  // a group is a channel row over one k-step of 16 tokens; pairs run along tokens
    const int g = channel % 8, h = channel / 8;
    const int i = token / 16, tt = token % 16;
    second = tt / 8;
    const int c = tt % 8;
    lane = 4 * g + c / 2;
    elem = c % 2;
    group = 2 * i + h;
  }
  const int per_word = 8 / width;
  const int word = lane * width + group / per_word;
  return int64_t{word} * 32 + 16 * elem + 2 * width * (group % per_word) + width * second;
}

// The inverse within one lane, what the decoders use: a lane 4g + t holds, in its `width` words
// of a part, 8 groups x 2 pairs (first, second) x 2 elements; this is the field of (group,
// second, elem) in those words (w[0..width)) ...
template <int W>
KV_HOST_DEVICE uint32_t CodecFragmentLaneField(const uint32_t (&w)[4], int group, int second,
                                               int elem) {
  constexpr int kPerWord = 8 / W;
  return (w[group / kPerWord] >> (16 * elem + 2 * W * (group % kPerWord) + W * second)) &
         ((1u << W) - 1);
}
// ... and its token (0..63) and channel in the step (0..15), for side `kind`.
KV_HOST_DEVICE int CodecFragmentLaneToken(int kind, int lane, int group, int second, int elem) {
  return kind == 0 ? lane / 4 + 8 * group : 16 * (group / 2) + 2 * (lane % 4) + 8 * second + elem;
}
KV_HOST_DEVICE int CodecFragmentLaneChannel(int kind, int lane, int group, int second, int elem) {
  return kind == 0 ? 2 * (lane % 4) + 8 * second + elem : 8 * (group % 2) + lane / 4;
}

// Empty when recipe `r` can be a fragment block's recipe for rows of head_dim (a servable
// codec recipe with uniform levels whose regions are whole steps); otherwise why not.
std::string CodecFragmentRecipeUnservable(const SideRecipe& r, int head_dim);

// Where the parts of one block lie: region_codes[k] is region k's first step (0 if dropped).
CodecBlockLayout CodecFragmentBlockLayoutFor(const SideRecipe& r);

// The layout the CUDA kernels take for one layer's fragment blocks (kernels/kv_layout.h):
// recipes k_recipe and v_recipe (servable here), KV head 0's K block at k_block0 and V block at
// v_block0 in the page; region_codes and channels as CodecLayerLayoutFor gives them.
CodecLayerLayout CodecFragmentLayerLayoutFor(const SideRecipe& k_recipe,
                                             const SideRecipe& v_recipe, int64_t k_block0,
                                             int64_t v_block0);

// Whether `layout` has a fragment block's shape on both sides: every region whole steps, the
// codes packed from the block's start right up to the row scales, the page ratios after them
// within the block. What every GPU kernel that reads or writes fragment blocks checks at launch.
bool CodecFragmentLayoutOk(const CodecLayerLayout& layout);

// GaussianUniformLevels(bits) as a table [bits][code] (bits 1..4; row 0 and codes past 2^bits
// zero), for the GPU kernels' parameters: their codes and values then match the CPU's exactly.
void CodecFragmentLevelTable(float (&levels)[5][16]);

// Encodes rows [64][head_dim] (in the codec's basis) into `block`
// (CodecFragmentBlockLayoutFor(r).bytes bytes), side `kind`.
void EncodeCodecFragmentBlock(const float* rows, int head_dim, const SideRecipe& r, int kind,
                              uint8_t* block);
// Decodes the first num_tokens rows of a block into rows [num_tokens][head_dim].
void DecodeCodecFragmentBlock(const uint8_t* block, int num_tokens, int head_dim,
                              const SideRecipe& r, int kind, float* rows);

}  // namespace kvstrata::kernels
