#pragma once

// The serving form of a history codec (kernels/history_codec.h; docs/kv-format.md §7): the
// packed history block of one (layer, K|V, KV head) of a `codec` page, and its encoder and
// decoder. A recipe serves when it codes regions of consecutive channels on Gaussian Lloyd-Max
// levels with 8-bit log2 row scales and per-page region ratios (`s8:pr`), optionally in the
// eigenbasis (`eig`). The eigenbasis is not applied here: the engine folds it into the
// rotations (FoldCodecBasis), so the rows a block is encoded from are already in the codec's
// basis and the regions are plain channel ranges.
//
// A block of page_tokens rows, every offset a multiple of 16 bytes from the block's start:
//   codes  per coded region (bits > 0), in order: uint8 [page_tokens][channels·bits/8], the
//          row's codes packed least significant bit first (channel i of the region at bit
//          i·bits of its row);
//   uint8  row_scale [page_tokens]   LogScaleCode of the row's RMS
//   uint8  ratio [regions]           LogScaleCode of the region's RMS over the row's, over the
//                                    page (one per region, dropped regions included)
//   zero padding to a multiple of 16 bytes.
// Reconstruction: channel i of region k of row t is max(s_t·ρ_k, 1e-30)·L_bits[code], with s_t
// and ρ_k the stored log2 values (LogScaleValue); a dropped region (bits 0) reads as zero.
// These are bit for bit the values FakeQuantSide reconstructs for the same recipe, in the
// codec's basis.

#include <cstdint>
#include <string>

#include "kernels/history_codec.h"
#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

// Empty when recipe `r` can be a serving format's history side for rows of head_dim; otherwise
// why not (for an error message).
std::string CodecRecipeUnservable(const SideRecipe& r, int head_dim);

// Where the parts of one block lie.
struct CodecBlockLayout {
  int64_t region_codes[kMaxCodecRegions] = {};  // offset of each region's codes (0 if dropped)
  int64_t region_row_bytes[kMaxCodecRegions] = {};
  int64_t row_scales = 0;
  int64_t ratios = 0;
  int64_t bytes = 0;  // the whole block, padded
};
// For a servable recipe (CodecRecipeUnservable empty).
CodecBlockLayout CodecBlockLayoutFor(const SideRecipe& r, int page_tokens);

// The layout the CUDA kernels take for one layer's blocks of the given block layouts (this
// file's or a codec fragment block's): KV head 0's K block at k_block0, V block at v_block0.
CodecLayerLayout CodecLayerLayoutOf(const SideRecipe& k_recipe, const CodecBlockLayout& k_blocks,
                                    const SideRecipe& v_recipe, const CodecBlockLayout& v_blocks,
                                    int64_t k_block0, int64_t v_block0);

// The layout the CUDA kernels take for one layer's blocks (kernels/kv_layout.h): recipes k_recipe
// and v_recipe (servable), KV head 0's K block at k_block0 and V block at v_block0 in the page.
CodecLayerLayout CodecLayerLayoutFor(const SideRecipe& k_recipe, const SideRecipe& v_recipe,
                                     int page_tokens, int64_t k_block0, int64_t v_block0);

// The scale of region k of row t: max(s_t·ρ_k, 1e-30) from their stored codes.
float CodecRegionScale(uint8_t row_scale_code, uint8_t ratio_code);

// The row-scale codes [page_tokens] and region-ratio codes [regions] of a full page of rows
// [page_tokens][head_dim] (as FakeQuantSide computes them for `pr` recipes).
void CodecPageScales(const float* rows, int page_tokens, int head_dim, const SideRecipe& r,
                     uint8_t* row_scales, uint8_t* ratios);

// Encodes a full page of rows [page_tokens][head_dim], in the codec's basis, into `block`
// (CodecBlockLayoutFor(r, page_tokens).bytes bytes, padding included).
void EncodeCodecBlock(const float* rows, int page_tokens, int head_dim, const SideRecipe& r,
                      uint8_t* block);
// Decodes the first num_tokens rows of a block into rows [num_tokens][head_dim]: with AVX-512
// where the CPU has it (kernels/cpu/codec_decode.h), else the portable loop; both give the same
// values (kPortable forces the loop, for tests).
enum class CodecDecoder { kFastest, kPortable };
void DecodeCodecBlock(const uint8_t* block, int num_tokens, int page_tokens, int head_dim,
                      const SideRecipe& r, float* rows,
                      CodecDecoder decoder = CodecDecoder::kFastest);

}  // namespace kvstrata::kernels
