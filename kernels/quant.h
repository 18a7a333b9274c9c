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

// 4 codes per byte. Within a group of n channels, byte j holds channels j, j + n/4, j + n/2
// and j + 3n/4 at bits 0-1, 2-3, 4-5 and 6-7. The quarter layout lets a kernel unpack four
// runs of consecutive channels with one shift and mask each.
void PackGroupCodes(const uint8_t* codes, int n, uint8_t* packed);
void UnpackGroupCodes(const uint8_t* packed, int n, uint8_t* codes);

// Quantises a row of head_dim values into packed codes [head_dim / 4] and params
// [head_dim / group_size][2] fp16 {scale, offset}.
void QuantizeRowInt2(const float* row, int head_dim, int group_size, float clip_ratio,
                     PageEncoding encoding, uint8_t* packed, uint16_t* params);
void DequantizeRowInt2(const uint8_t* packed, const uint16_t* params, int head_dim, int group_size,
                       PageEncoding encoding, float* row);

// Whole blocks of a page (one layer, K or V, one KV head): rows [num_tokens][head_dim], with
// num_tokens <= page_tokens (the rest of the block is left as is).
void EncodeInt2Block(const float* rows, int num_tokens, const KvGeometry& g, float clip_ratio,
                     PageEncoding encoding, uint8_t* block);
void DecodeInt2Block(const uint8_t* block, int num_tokens, const KvGeometry& g,
                     PageEncoding encoding, float* rows);
void EncodeBf16Block(const float* rows, int num_tokens, const KvGeometry& g, uint8_t* block);
void DecodeBf16Block(const uint8_t* block, int num_tokens, const KvGeometry& g, float* rows);

}  // namespace kvstrata::kernels
