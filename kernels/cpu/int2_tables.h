#pragma once

// Where the 2-bit codes of an INT2 block sit, inverted for the CPU kernels that compute from the
// codes (kv_layout.h KCodeBit / VCodeBit is the layout; these tables are derived from it).
//
// K rows: a token's codes are head_dim / 16 little-endian words; code position p (0..15) of
// word w sits at bit 2p and holds channel KChannel(head_dim, w, p).
//
// V blocks: the code area, read as head_dim / 4 vectors of 16 words, holds in vector z, lane
// j, at bit 16e + 2u (e = 0..1, u = 0..7) the code of token VToken(z / 8, e, j) and channel
// 8u + z % 8, plus 64 when head_dim is 128 and j is odd. So for a fixed (z % 8, u) every lane
// of every vector is the same channel (or, at head_dim 128, the same pair of channels for even
// and odd lanes), which lets a kernel keep 16 partial sums per channel and never transpose.

#include <cstdint>

namespace kvstrata::kernels::cpu {

// Channel of code position p (0..15) of word w of a K row.
constexpr int KChannel(int head_dim, int w, int p) {
  const int elem = p / 8, pair = p % 8;
  const int hi = pair % 2;
  const int t = w / (head_dim / 64);
  const int s = 4 * (w % (head_dim / 64)) + pair / 2;
  return 16 * s + 8 * hi + 2 * t + elem;
}

// Token of lane j of the V code vectors of token set `set` (= z / 8: 0..1 at head_dim 64, 0..3
// at 128) for element e.
constexpr int VToken(int head_dim, int set, int e, int j) {
  if (head_dim == 64) return 32 * set + 16 * ((j % 4) / 2) + 8 * (j % 2) + 2 * (j / 4) + e;
  return 16 * set + 8 * ((j % 4) / 2) + 2 * (j / 4) + e;
}

// Channel of lane j for code (z % 8 = g, u).
constexpr int VChannel(int head_dim, int g, int u, int j) {
  return 8 * u + g + (head_dim == 128 && j % 2 == 1 ? 64 : 0);
}

}  // namespace kvstrata::kernels::cpu
