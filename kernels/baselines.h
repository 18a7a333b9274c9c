#pragma once

// The low-bit KV formats kvstrata is compared against, as quantise-then-dequantise ("fake
// quantisation") references over the rows of one KV head, [num_tokens][head_dim], returning
// the reconstruction in the original (unrotated) space. Each comes with its honest storage
// cost in kernels/bits.h. These are for evaluation; only the split INT2 format is served.

#include <cstdint>

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

// FP8 E4M3 (OCP): 1 sign, 4 exponent (bias 7), 3 mantissa bits, max 448, no infinities.
uint8_t FloatToE4M3(float f);  // round to nearest even, saturating to +-448
float E4M3ToFloat(uint8_t v);

void FakeQuantBf16(const float* x, int64_t n, int d, float* y);

// FP8 E4M3 with one fp16 scale per token (row): x ≈ scale · e4m3(x / scale), scale = max|x|/448.
void FakeQuantFp8E4M3(const float* x, int64_t n, int d, float* y);

// INT4, per token, asymmetric min-max in groups of `group` channels, fp16 scale and offset.
void FakeQuantInt4(const float* x, int64_t n, int d, int group, float* y);

// Naive INT2: per token, asymmetric min-max in groups, no rotation, no clipping.
void FakeQuantNaiveInt2(const float* x, int64_t n, int d, int group, float* y);

// Rotated INT2: y = dequant(quant(x·R))·Rᵀ with the split format's quantiser. With R = the
// normalised Hadamard matrix this is the QuaRot-like baseline; with a calibrated U·H·P it is
// OSCAR's format. `encoding` picks uniform or Lloyd-Max levels.
void FakeQuantRotatedInt2(const float* x, int64_t n, int d, int group, const float* r,
                          float clip_ratio, PageEncoding encoding, float* y);

// KIVI-2. Keys: per channel, over chunks of `token_group` tokens (fp16 scale and offset per
// channel and chunk). Values: per token in groups of `channel_group` channels. In both, the
// tokens that do not yet fill a chunk past the last `residual` tokens stay in full precision
// (BF16 here), as KIVI keeps a full-precision residual that is quantised chunk by chunk.
void FakeQuantKivi2Keys(const float* x, int64_t n, int d, int token_group, int residual, float* y);
void FakeQuantKivi2Values(const float* x, int64_t n, int d, int channel_group, int token_group,
                          int residual, float* y);
// Tokens KIVI-2 holds in INT2 out of n (the rest are the full-precision residual).
int64_t Kivi2QuantizedTokens(int64_t n, int token_group, int residual);

// TurboQuant-like 3-bit: a seeded random rotation (random-sign Hadamard), then each coordinate
// quantised with the 8-level Lloyd-Max quantiser of a Gaussian of variance |x|²/d; one fp16
// norm per token. (The inner-product QJL stage of TurboQuant is not included.)
void FakeQuantTurbo3(const float* x, int64_t n, int d, uint64_t seed, float* y);

}  // namespace kvstrata::kernels
