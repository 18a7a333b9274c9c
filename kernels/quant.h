#pragma once

// INT2 quantisation of rotated K/V rows: the CPU reference (and specification) of the append
// kernel. See docs/kv-format.md, "The quantiser".
//
// A row is one token of one KV head, [head_dim] floats, already rotated. It is split into
// groups of `group_size` consecutive channels; each group gets its own fp16 (scale, offset)
// and 2-bit codes, and is reconstructed as x = offset + scale * levels[code].

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

// OSCAR's order-statistic clip threshold: sort |x| ascending and take the element at index
// min(n - 1, floor(ratio * n)). ratio >= 1 keeps the maximum (no clipping). ratio must be > 0.
float ClipThreshold(const float* x, int n, float ratio);

// Quantises one group of n values (n a multiple of 4, at most 128). codes[i] in 0..3, one per value
// (unpacked). scale and offset are returned as fp16 bits, and the codes are chosen against
// the fp16-rounded parameters, so dequantisation sees exactly what was optimised.
//   uniform:   values clamped to [-tau, tau]; offset = min, scale = (max - min) / 3,
//              code = round-half-up((x - offset) / scale) clamped to 0..3.
//   Lloyd-Max: values clamped to [-tau, tau]; offset = mean, scale = standard deviation,
//              code = nearest of kGaussianLloydMaxLevels in units of scale.
void QuantizeGroupInt2(const float* x, int n, float clip_ratio, PageEncoding encoding,
                       uint8_t* codes, uint16_t* scale_fp16, uint16_t* offset_fp16);

// Quantises a row of head_dim values into unpacked codes [head_dim] (0..3, channel order) and
// params [head_dim / group_size][2] fp16 {scale, offset}.
void QuantizeRowInt2(const float* row, int head_dim, int group_size, float clip_ratio,
                     PageEncoding encoding, uint8_t* codes, uint16_t* params);
void DequantizeRowInt2(const uint8_t* codes, const uint16_t* params, int head_dim, int group_size,
                       PageEncoding encoding, float* row);

// Packing into the page layout (kv_layout.h: KCodeBit, VCodeBit). `codes` are unpacked,
// [head_dim] for a K row, [64][head_dim] for a V block; packed areas are head_dim/4 bytes per
// token. Packing overwrites every bit of its destination.
void PackKRow(const uint8_t* codes, int head_dim, uint8_t* packed);
void UnpackKRow(const uint8_t* packed, int head_dim, uint8_t* codes);
void PackVBlock(const uint8_t* codes, int head_dim, uint8_t* packed);
void UnpackVBlock(const uint8_t* packed, int head_dim, uint8_t* codes);

// Whole blocks of a page (one layer, K or V (kind 0 or 1), one KV head): rows
// [num_tokens][head_dim], num_tokens <= page_tokens. INT2 blocks need page_tokens == 64; the
// codes of tokens past num_tokens are written as 0.
void EncodeInt2Block(const float* rows, int num_tokens, const KvGeometry& g, float clip_ratio,
                     PageEncoding encoding, int kind, uint8_t* block);
void DecodeInt2Block(const uint8_t* block, int num_tokens, const KvGeometry& g,
                     PageEncoding encoding, int kind, float* rows);
void EncodeBf16Block(const float* rows, int num_tokens, const KvGeometry& g, uint8_t* block);
void DecodeBf16Block(const uint8_t* block, int num_tokens, const KvGeometry& g, float* rows);

}  // namespace kvstrata::kernels
