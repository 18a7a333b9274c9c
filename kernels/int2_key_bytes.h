#pragma once

// Where the INT2 history kernel's integer keys (kernels/cuda/split_decode_int2.cuh) find a K
// channel's code: a byte mask keeps four codes of one K word at once, one in each byte at the
// same bit pair, and Q's 8-bit fragments must list their channels in that order.

#include "kernels/kv_layout.h"

namespace kvstrata::kernels {

// The K channel whose code sits in byte j (0..3), bit pair qq (0..3: bits 2qq, 2qq + 1 of the
// byte) of word wi (0 .. head_dim/64 - 1) of the K words that lane t (0..3) of a tile reads of a
// token: KCodeBit inverted over those positions (bit 32·(t·head_dim/64 + wi) + 8j + 2qq).
// Bytes 0 and 2 are channels c and c + 1, bytes 1 and 3 c + 32 and c + 33.
KV_HOST_DEVICE int KCodeByteChannel(int wi, int qq, int j, int t) {
  const int pair = 4 * (j & 1) + qq, elem = j >> 1;
  return 16 * (4 * wi + pair / 2) + 8 * (pair % 2) + 2 * t + elem;
}

}  // namespace kvstrata::kernels
