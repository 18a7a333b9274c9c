#pragma once

// The codec page decoder with AVX-512 (cpu/avx512_codec.cc): the same values as the portable
// loop of kernels/codec_page.cc, 16 channels per step (codes shifted out of one 64-bit load,
// levels looked up by a permute). Called by DecodeCodecBlock where the CPU has AVX-512.

#include <cstdint>

#include "kernels/codec_page.h"

namespace kvstrata::kernels::cpu {

void DecodeCodecBlockAvx512(const uint8_t* block, const CodecBlockLayout& layout, int num_tokens,
                            int head_dim, const SideRecipe& r, float* rows);

}  // namespace kvstrata::kernels::cpu
